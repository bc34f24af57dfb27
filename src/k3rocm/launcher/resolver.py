"""Reading the launcher's settings one by one: each value checked and typed,
every problem recorded with the setting's name (k3rocm.launcher.settings
resolves them all)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

from k3rocm.launcher.setting_table import (
    FALSE_WORDS,
    SETTINGS_BY_NAME,
    TRUE_WORDS,
    label,
    shown,
)

# More digits than any setting's number needs; Python refuses to convert
# numbers of more than 4,300 digits at all.
MAX_DIGITS = 18


class Resolver:
    def __init__(self, raw: Mapping[str, str | None]):
        self.raw = raw
        self.problems: list[str] = []
        self.invalid: set[str] = set()
        self._texts: dict[str, str | None] = {}

    def refuse(self, name: str, problem: str) -> None:
        self.invalid.add(name)
        self.problems.append(problem)

    def text(self, name: str) -> str | None:
        """The value without surrounding whitespace; None when unset or
        refused (a NUL byte, only whitespace), reported once."""
        if name not in self._texts:
            self._texts[name] = self._checked_text(name)
        return self._texts[name]

    def _checked_text(self, name: str) -> str | None:
        value = self.raw[name]
        if value is None:
            return None
        if "\0" in value:
            self.refuse(
                name,
                f"{label(name)} contains a NUL byte, which no command line or "
                "environment can carry; remove it.",
            )
            return None
        if not value.strip():
            self.refuse(
                name,
                f"{label(name)} is {shown(value)}, only whitespace; set a value, "
                "or unset it (or leave it empty) for the default.",
            )
            return None
        return value.strip()

    def integer(
        self, name: str, minimum: int, maximum: int | None = None
    ) -> int | None:
        text = self.text(name)
        if text is None:
            return None
        bounds = f"from {minimum} to {maximum}" if maximum else f"{minimum} or more"
        if (
            not (text.isascii() and text.isdigit())
            or len(text) > MAX_DIGITS
            or not (minimum <= int(text) <= (maximum or int(text)))
        ):
            self.refuse(
                name,
                f"{label(name)} is {shown(text)}, not a whole number {bounds}; set "
                f"it to one, e.g. {SETTINGS_BY_NAME[name].option} "
                f"{self._example(name, minimum)}.",
            )
            return None
        return int(text)

    def _example(self, name: str, minimum: int) -> str:
        default = SETTINGS_BY_NAME[name].default
        if isinstance(default, int) and not isinstance(default, bool):
            return str(default)
        return str(max(minimum, 1))

    def split(self, name: str) -> tuple[str, ...]:
        text = self.text(name)
        if text is None:
            return ()
        try:
            return tuple(shlex.split(text))
        except ValueError as error:
            self.refuse(
                name,
                f"{label(name)} cannot be split like a shell command line "
                f"({error}): {shown(text)}; balance its quotes.",
            )
            return ()

    def boolean(self, name: str) -> bool:
        text = (self.text(name) or "0").lower()
        if text in TRUE_WORDS:
            return True
        if text not in FALSE_WORDS:
            self.refuse(
                name,
                f"{label(name)} is {shown(text)}; set it to 1 or 0 (also accepted: "
                f"{', '.join(TRUE_WORDS[1:])} / {', '.join(FALSE_WORDS[1:])}).",
            )
        return False

    def path(self, name: str) -> str | None:
        """The value with a leading ~ or ~user expanded, as a shell would
        (vLLM gets no shell to do it)."""
        text = self.text(name)
        if text is None or not text.startswith("~"):
            return text
        expanded = os.path.expanduser(text)
        if expanded.startswith("~"):
            user = text[1:].split("/", 1)[0]
            self.refuse(
                name,
                f"{label(name)} is {shown(text)}, but this node has no home "
                f"directory for {shown(user or os.environ.get('USER', ''))}; write "
                "the path out in full.",
            )
            return None
        return expanded
