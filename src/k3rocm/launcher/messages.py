"""What the launcher's problem messages share: the settings named by option
and variable, and the exception that carries every problem at once."""

from __future__ import annotations

from collections.abc import Sequence

from k3rocm.common.setting_kinds import shown
from k3rocm.common.setting_table import BY_NAME

__all__ = ["InvalidSettings", "label", "shown"]


class InvalidSettings(Exception):
    """Settings that must not reach vLLM; each message says how to fix it."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


def label(name: str) -> str:
    """A setting as messages name it: `K3_PORT (--port)`."""
    return BY_NAME[name].label(launcher=True)
