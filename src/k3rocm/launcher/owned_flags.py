"""The extra vLLM arguments must not set what the launcher sets itself.

vLLM reads a flag in many spellings: any unambiguous prefix
(argparse's allow_abbrev, which vLLM keeps), `_` for `-`, `--flag=value`,
short aliases (-tp), dotted JSON keys and `--config FILE`. Rather than
guess them, the extra arguments go through vLLM's own `vllm serve` parser,
and what they set is compared with what an empty command line sets."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from k3rocm.common.setting_table import LAUNCHER_SETTINGS
from k3rocm.common.vllm_release import TARGET
from k3rocm.launcher.messages import label, shown
from k3rocm.patchtool.lines import shipped_series

# The owned flags' spellings in the target release (each setting's row
# takes its own from k3rocm.common.vllm_release), for when there is no vLLM
# to ask. --middleware is not owned: the
# launcher's DrainMiddleware stays however many middlewares the extra
# arguments append.
FALLBACK_OWNED_FLAGS = {
    flag: setting.name for setting in LAUNCHER_SETTINGS for flag in setting.owns
}
# vLLM's destination of each owned flag (its long spelling, `-` read as
# `_`), and the positional model of `vllm serve MODEL`.
OWNED_DESTS = {
    flag[2:].replace("-", "_"): owner
    for flag, owner in FALLBACK_OWNED_FLAGS.items()
    if flag.startswith("--")
} | {"model_tag": "model"}

# Marks a destination no argument set: nothing vLLM stores is this object.
_UNSET = object()
_APPENDING_ACTIONS = (
    argparse._AppendAction,
    argparse._AppendConstAction,
    argparse._ExtendAction,
)


class _Refused(Exception):
    """vLLM's parser would exit with this message."""


@dataclass(frozen=True)
class _Reading:
    """What vLLM's parser made of the extra arguments."""

    # dest -> the flag's option strings, its long one first.
    owned: dict[str, tuple[str, ...]]
    unknown_flags: tuple[str, ...]
    stray: tuple[str, ...]
    refusal: str | None
    # Text never to repeat: the value of an --api-key in any spelling.
    secret: str | None


def owned_flag_problems(args: Sequence[str]) -> list[str]:
    """One message per flag of args that the launcher owns (or that vLLM
    would refuse), saying which setting to use instead."""
    if not args:
        return []
    parser = _vllm_parser()
    if parser is None:
        return _fallback_problems(args)
    reading = _read(parser, args)
    problems = [
        _owned_problem(options[0], _spelling(args, options), OWNED_DESTS[dest])
        for dest, options in reading.owned.items()
        if dest != "model_tag"
    ]
    stray = reading.stray + reading.owned.get("model_tag", ())
    if stray:
        problems.append(
            f"{label('extra_args')} has argument(s) no flag takes "
            f"({', '.join(shown(arg) for arg in stray)}); vLLM would read one as "
            f"the model, which {label('model')} sets; give each flag's value "
            "right after the flag."
        )
    if reading.unknown_flags:
        problems.append(
            f"{label('extra_args')} passes "
            f"{', '.join(shown(arg) for arg in reading.unknown_flags)}, which "
            f"vLLM {shipped_series().vllm_version}'s `vllm serve` does not "
            "accept; check the spelling "
            "against `vllm serve --help`."
        )
    if reading.refusal is not None:
        # The parse stopped short, so also look for the owned flags by name.
        problems += _fallback_problems(args)
        problems.append(
            f"{label('extra_args')} would be refused by vLLM "
            f"{shipped_series().vllm_version}'s parser "
            f"({reading.refusal}); fix them so that `vllm serve` accepts them."
        )
    if reading.secret:
        problems = [problem.replace(reading.secret, "<hidden>") for problem in problems]
    return problems


def _owned_problem(flag: str, spelling: str | None, owner: str) -> str:
    written = f" (as {shown(spelling)})" if spelling and spelling != flag else ""
    if owner == "api_key_file":
        return (
            f"{label('extra_args')} passes {flag}{written}, which would put the "
            "API key on the command line where every process can read it; put "
            f"the key in a file and set {label('api_key_file')}."
        )
    return (
        f"{label('extra_args')} passes {flag}{written}, which the launcher sets "
        f"itself; remove it and set {label(owner)} instead."
    )


def _normalized(flag: str) -> str:
    """A flag as vLLM compares it: `_` read as `-` in long flags."""
    flag = flag.split("=", 1)[0]
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag


def _spelling(args: Sequence[str], options: Sequence[str]) -> str | None:
    """How args wrote the flag (an abbreviation, `_` for `-`, an alias), if
    they did; a --config file may have set it instead."""
    for arg in args:
        written = _normalized(arg)
        if arg.startswith("-") and len(written) > 1:
            if any(option.startswith(written) for option in options):
                return arg.split("=", 1)[0]
    return None


def last_values(args: Sequence[str], dests: Sequence[str]) -> dict[str, object]:
    """What args set for each of vLLM's destinations ``dests`` (the text of
    a value, True/False for a switch), read as vLLM's parser reads them, in
    every spelling; a destination nothing set is left out. Without a vLLM to
    ask, only the exact long flags count (`--flag value`, `--flag=value`,
    `--no-flag`). Arguments vLLM would refuse set nothing here: that
    refusal is owned_flag_problems' to report."""
    if not args:  # nothing to read: spare the seconds of vLLM's import
        return {}
    parser = _vllm_parser()
    if parser is None:
        return exact_values(args, dests)
    try:
        with _quiet():
            namespace = parser.parse_args(list(args))
    except Exception:
        return {}
    found = {dest: getattr(namespace, dest, _UNSET) for dest in dests}
    return {dest: value for dest, value in found.items() if value is not _UNSET}


def exact_values(args: Sequence[str], dests: Sequence[str]) -> dict[str, object]:
    """last_values for arguments spelled as the launcher writes its own (long
    flags in full, `--flag value`, `--no-flag`): no vLLM parser needed."""
    found: dict[str, object] = {}
    for index, arg in enumerate(args):
        flag, has_value, value = arg.partition("=")
        dest = _normalized(flag)[2:].replace("-", "_")
        if dest.startswith("no_") and dest[3:] in dests:
            found[dest[3:]] = False
        elif dest in dests:
            following = args[index + 1] if index + 1 < len(args) else None
            if has_value:
                found[dest] = value
            elif following is None or following.startswith("-"):
                found[dest] = True
            else:
                found[dest] = following
    return found


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """vLLM logs to stdout, which carries the dry run's script: keep its
    import chatter and parser warnings out of the launcher's output."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            yield
    finally:
        logging.disable(previous)


@functools.cache
def _vllm_parser() -> argparse.ArgumentParser | None:
    """vLLM's own `vllm serve` parser (the OpenAI server's; `vllm serve`
    builds the same), changed to record instead of convert or exit: every
    default is _UNSET, values stay text (a bad value must not hide an owned
    flag after it), unknown arguments are kept, errors raise. Built once: the
    import is the slow part."""
    try:
        with _quiet():
            make_arg_parser = importlib.import_module(
                TARGET.serve_args_module
            ).make_arg_parser
            from vllm.utils.argparse_utils import FlexibleArgumentParser
    except Exception:  # no usable vLLM here: the fallback decides
        return None

    class RecordingParser(FlexibleArgumentParser):
        # The arguments no flag took, from the latest parse.
        unknown: tuple[str, ...] = ()

        def parse_known_args(self, args=None, namespace=None):
            namespace, unknown = super().parse_known_args(args, namespace)
            self.unknown = tuple(unknown)
            return namespace, []

        def error(self, message):
            raise _Refused(message)

        def exit(self, status=0, message=None):
            raise _Refused(message or f"exit {status}")

    parser = RecordingParser(prog="vllm serve", add_help=False)
    # vLLM's -h/--help, minus its print-and-exit, so prefixes match the same.
    parser.add_argument("-h", "--help", action="store_true")
    with _quiet():
        make_arg_parser(parser)
    for action in parser._actions:
        # argparse copies an appending flag's default before it appends, so
        # those keep argparse's own "nothing yet", None.
        appends = isinstance(action, _APPENDING_ACTIONS)
        action.default = None if appends else _UNSET
        action.required = False
        action.type = None
        action.choices = None
    return parser


def _read(parser: argparse.ArgumentParser, args: Sequence[str]) -> _Reading:
    actions = {action.dest: action for action in parser._actions}
    appending = {
        action.dest
        for action in parser._actions
        if isinstance(action, _APPENDING_ACTIONS)
    }
    try:
        with _quiet():
            namespace = parser.parse_args(list(args))
    except Exception as error:  # vLLM would refuse them: say why
        message = str(error).strip() or type(error).__name__
        return _Reading({}, (), (), message, None)
    owned = {}
    for dest in OWNED_DESTS:
        value = getattr(namespace, dest, _UNSET)
        if value is _UNSET or (value is None and dest in appending):
            continue
        if dest == "model_tag":
            owned[dest] = (str(value),)
        else:
            options = actions[dest].option_strings
            owned[dest] = tuple(sorted(options, key=lambda s: not s.startswith("--")))
    unknown = getattr(parser, "unknown", [])
    secret = getattr(namespace, "api_key", _UNSET)
    return _Reading(
        owned,
        tuple(arg for arg in unknown if arg.startswith("-")),
        tuple(arg for arg in unknown if not arg.startswith("-")),
        None,
        secret if isinstance(secret, str) and secret else None,
    )


def _fallback_problems(args: Sequence[str]) -> list[str]:
    """Exact names plus prefixes of the owned flags. This misses what only
    vLLM's parser knows: flags set through --config files or dotted JSON
    keys, abbreviations of short aliases (-t for -tp), and an owned flag
    whose value vLLM would fail on. It refuses every prefix of an owned
    flag, even one vLLM would find ambiguous (vLLM refuses those anyway)."""
    problems = []
    for arg in args:
        flag = _normalized(arg)
        if not arg.startswith("-") or len(flag) < 2:
            continue
        if flag in FALLBACK_OWNED_FLAGS:
            owners = [flag]
        elif flag.startswith("--") and len(flag) > 2:
            owners = [full for full in FALLBACK_OWNED_FLAGS if full.startswith(flag)]
        else:
            owners = []
        for full in owners:
            problems.append(
                _owned_problem(full, arg.split("=", 1)[0], FALLBACK_OWNED_FLAGS[full])
            )
    return problems
