"""What a setting is: its row type (``Setting``), the kinds of value it
takes, each parsing a stripped, non-empty text or raising SettingError that
names the setting and what to set instead, and how messages quote values.
The rows themselves are k3rocm.common.setting_table."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

Default = int | float | str | Path | tuple[str, ...] | bool | None

# Where each setting is documented: the launcher's table (README, "Launching
# Kimi-K3"), the container's (README, "Configuration"), or set by the image.
LAUNCHER, CONTAINER, IMAGE = "launcher", "container", "image"

# Longest stretch of a value a message repeats: enough to recognise it, short
# enough that a 5,000-digit number or a pasted file stays readable.
SHOWN_CHARS = 60
# More digits than any setting's number needs; Python refuses to convert
# numbers of more than 4,300 digits at all.
MAX_DIGITS = 18
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class SettingError(ValueError):
    """A setting's value cannot be used; the message says what to set."""


def shown(text: str) -> str:
    """A value as a message quotes it: repr (control characters and broken
    UTF-8 escaped), shortened."""
    if len(text) > SHOWN_CHARS:
        return repr(text[:SHOWN_CHARS]) + f" (+{len(text) - SHOWN_CHARS} more)"
    return repr(text)


def env_text(value: Default) -> str:
    """A default as an environment variable spells it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


# The kinds of value a setting takes. Each parses a stripped, non-empty text
# or raises SettingError naming the setting and what to set instead.


@dataclass(frozen=True)
class Text:
    def parse(self, setting: Setting, text: str, launcher: bool) -> str:
        return text


@dataclass(frozen=True)
class Names:
    """A comma-separated list (the launcher checks the names themselves)."""

    def parse(self, setting: Setting, text: str, launcher: bool) -> tuple[str, ...]:
        return tuple(name.strip() for name in text.split(",") if name.strip())


@dataclass(frozen=True)
class FilePath:
    def parse(self, setting: Setting, text: str, launcher: bool) -> Path:
        return Path(text)


@dataclass(frozen=True)
class Whole:
    low: int
    high: int | None = None  # None: no bound but MAX_DIGITS

    @property
    def bounds(self) -> str:
        if self.high is None:
            return f"{self.low} or more"
        return f"from {self.low} to {self.high}"

    def parse(self, setting: Setting, text: str, launcher: bool) -> int:
        digits = MAX_DIGITS if self.high is None else len(str(self.high))
        # Leading zeros are still the same number (K3_PORT=08000 is 8000).
        significant = text.lstrip("0") or "0"
        if not (
            text.isascii() and text.isdigit() and len(significant) <= digits
        ) or not (
            self.low
            <= int(significant)
            <= (self.high if self.high is not None else int(significant))
        ):
            raise SettingError(
                f"{setting.label(launcher)} is {shown(text)}, not a whole number "
                f"{self.bounds}; set a whole number in that range, e.g. "
                f"{setting.example(self.low, launcher)}."
            )
        return int(significant)


@dataclass(frozen=True)
class Seconds:
    """A duration in seconds, fractions allowed, more than 0 and below high."""

    high: float = 1e7

    def parse(self, setting: Setting, text: str, launcher: bool) -> float:
        try:
            value = float(text) if text.isascii() else -1.0
        except ValueError:
            value = -1.0
        if not 0 < value < self.high:
            example = setting.example(1, launcher)
            raise SettingError(
                f"{setting.label(launcher)} is {shown(text)}, not a number of "
                f"seconds above 0 and below {self.high:g}; set one, e.g. {example}."
            )
        return value


@dataclass(frozen=True)
class OneOf:
    choices: tuple[str, ...]
    noun: str | None = None  # "profile": "..., which is not a profile"

    def parse(self, setting: Setting, text: str, launcher: bool) -> str:
        if text not in self.choices and self.noun:
            raise SettingError(
                f"{setting.label(launcher)} is {shown(text)}, which is not a "
                f"{self.noun}; use one of: {', '.join(self.choices)}."
            )
        if text not in self.choices:
            raise SettingError(
                f"{setting.label(launcher)} is {shown(text)}; set one of "
                f"{', '.join(self.choices)} (default {env_text(setting.default)})"
            )
        return text


@dataclass(frozen=True)
class Flag:
    def parse(self, setting: Setting, text: str, launcher: bool) -> bool:
        word = text.lower()
        if word in TRUE_WORDS:
            return True
        if word not in FALSE_WORDS:
            raise SettingError(
                f"{setting.label(launcher)} is {shown(text)}; set it to 1 or 0 (also "
                f"accepted: {', '.join(TRUE_WORDS[1:])} / "
                f"{', '.join(FALSE_WORDS[1:])})."
            )
        return False


Kind = Text | Names | FilePath | Whole | Seconds | OneOf | Flag


@dataclass(frozen=True)
class Setting:
    name: str
    env: str
    default: Default
    meaning: str
    group: str = LAUNCHER
    kind: Kind = field(default_factory=Text)
    option: str | None = None  # the launcher's command-line option
    # vLLM 0.27.1's spellings of the flags this setting sets (the launcher
    # refuses them in the extra arguments).
    owns: tuple[str, ...] = ()
    # The modules that read it (below k3rocm).
    readers: tuple[str, ...] = ("launcher",)
    shown: str | None = None  # the default in words, where the value says too little

    @property
    def takes_value(self) -> bool:
        return not isinstance(self.kind, Flag)

    def label(self, launcher: bool = False) -> str:
        """How messages name it: the variable, and to the launcher's users
        its option too."""
        return f"{self.env} ({self.option})" if launcher else self.env

    @property
    def shown_default(self) -> str:
        return self.shown if self.shown is not None else env_text(self.default)

    def example(self, low: int, launcher: bool) -> str:
        value = self.default if self.default is not None else low
        return f"{self.option} {value}" if launcher else f"{self.env}={value}"

    def text(self, environ: Mapping[str, str]) -> str:
        """A text row's variable, or its default's text; compose passes unset
        settings as empty strings. A typed row has no unchecked text: read it
        with ``read``."""
        if not isinstance(self.kind, Text):
            raise TypeError(f"{self.env} is a typed row; read it with read()")
        return environ.get(self.env, "").strip() or env_text(self.default)

    def parse(self, text: str, launcher: bool = False) -> Default:
        """A given value, stripped and non-empty, typed; SettingError says
        what is wrong and what to set (naming the launcher's option too when
        launcher is true)."""
        return self.kind.parse(self, text, launcher)

    def read(self, environ: Mapping[str, str]) -> Default:
        """The setting's typed value (its default when unset or empty);
        SettingError when the value cannot be used."""
        text = environ.get(self.env, "").strip()
        return self.parse(text) if text else self.default


def read_all(
    environ: Mapping[str, str], settings: Iterable[Setting]
) -> tuple[dict[str, Default], list[str]]:
    """Each setting's typed value by name (the default where refused), and
    every problem, one message each."""
    values: dict[str, Default] = {}
    problems: list[str] = []
    for setting in settings:
        try:
            values[setting.name] = setting.read(environ)
        except SettingError as err:
            values[setting.name] = setting.default
            problems.append(str(err))
    return values, problems
