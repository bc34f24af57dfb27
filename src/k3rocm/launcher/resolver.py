"""Reading the launcher's settings one by one: each value checked and typed,
every problem recorded with the setting's name (k3rocm.launcher.settings
resolves them all)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

from k3rocm.common.setting_kinds import Default, SettingError
from k3rocm.common.setting_table import BY_NAME
from k3rocm.launcher.messages import label, shown


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

    def typed(self, name: str) -> Default:
        """The value as its row types it (a number in bounds, one of its
        choices, a flag); None when unset or refused."""
        text = self.text(name)
        if text is None:
            return None
        try:
            return BY_NAME[name].parse(text, launcher=True)
        except SettingError as error:
            self.refuse(name, str(error))
            return None

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
