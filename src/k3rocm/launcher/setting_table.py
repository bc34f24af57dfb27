"""The launcher's settings (its rows of the container's table,
k3rocm.setting_table, each with a command-line option) and the helpers its
messages share."""

from __future__ import annotations

from collections.abc import Sequence

from k3rocm.setting_table import LAUNCHER, Setting
from k3rocm.setting_table import SETTINGS as ALL_SETTINGS

SETTINGS: tuple[Setting, ...] = tuple(
    setting for setting in ALL_SETTINGS if setting.group == LAUNCHER
)
SETTINGS_BY_NAME = {setting.name: setting for setting in SETTINGS}

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

# Longest stretch of a value a message repeats: enough to recognise it, short
# enough that a 5,000-digit number or a pasted file stays readable.
SHOWN_CHARS = 60


class InvalidSettings(Exception):
    """Settings that must not reach vLLM; each message says how to fix it."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


def label(name: str) -> str:
    setting = SETTINGS_BY_NAME[name]
    return f"{setting.env} ({setting.option})"


def shown(text: str) -> str:
    """A value as a message quotes it: repr (control characters and broken
    UTF-8 escaped), shortened."""
    if len(text) > SHOWN_CHARS:
        return repr(text[:SHOWN_CHARS]) + f" (+{len(text) - SHOWN_CHARS} more)"
    return repr(text)
