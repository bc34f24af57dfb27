"""The launcher's settings resolved into typed values.

An option given on the command line wins over its variable; an empty
variable counts as unset. Every problem found is reported, not only the
first."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from k3rocm.common.profiles import (
    AMD_MAX_NUM_SEQS,
    DEFAULT_FEATURES,
    FEATURE_CONFLICTS,
    FEATURES,
    PROFILES,
    Profile,
)
from k3rocm.common.setting_kinds import Default, FilePath, Names, Text
from k3rocm.common.setting_table import (
    LAUNCHER_SETTINGS,
    MODEL,
    PROFILE,
    SERVED_MODEL_NAME,
)
from k3rocm.common.stop_budget import StopBudget
from k3rocm.launcher.layout import check_layout
from k3rocm.launcher.messages import InvalidSettings, label, shown
from k3rocm.launcher.owned_flags import owned_flag_problems
from k3rocm.launcher.resolver import Resolver
from k3rocm.patchtool.lines import shipped_series

__all__ = [
    "InvalidSettings",
    "LaunchSettings",
    "Resolution",
    "raw_settings",
    "resolve",
    "resolve_all",
]


@dataclass(frozen=True)
class LaunchSettings:
    """One typed field per launcher row, named like the row: its value, its
    default where unset or refused (tests/common/test_setting_table.py
    holds the fields to the rows). Most are the row's value as read; the
    ones in WORKED_OUT are worked out from the row's text and other rows.
    stop_budget is derived from stop_grace_seconds."""

    model: str  # ~ expanded as a shell would
    served_model_name: str
    profile: Profile
    features: tuple[str, ...]
    max_model_len: int | None
    max_num_seqs: int | None  # the AMD recipe's on Kimi-K3 profiles
    host: str
    port: int
    api_key_file: Path | None
    extra_args: tuple[str, ...]  # K3_EXTRA_ARGS split, then what follows `--`
    num_nodes: int
    node_rank: int | None
    master_addr: str | None
    master_port: int
    gpu_count: int | None
    dri_dir: Path
    vllm_command: tuple[str, ...] | None
    stop_grace_seconds: int
    dry_run: bool
    stop_budget: StopBudget


# The fields resolve_all works out rather than taking the row's value.
WORKED_OUT = frozenset(
    {"model", "served_model_name", "profile", "features", "max_num_seqs",
     "extra_args", "num_nodes", "vllm_command"}
)  # fmt: skip


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="serve-kimi-k3",
        description=f"Start vLLM {shipped_series().vllm_version} serving Kimi-K3 "
        "on AMD MI355X/MI350X "
        "from a few settings, after checking them. Each option has a matching "
        "environment variable; the option wins.",
        epilog="profiles:\n"
        + "".join(f"  {p.name:10} {p.summary}\n" for p in PROFILES.values())
        + "features:\n"
        + "".join(f"  {f.name:10} {f.meaning}\n" for f in FEATURES.values())
        + "\nPass more vLLM flags after `--`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for setting in LAUNCHER_SETTINGS:
        help_text = (
            f"{setting.meaning} [{setting.env}; default: {setting.shown_default}]"
        )
        if setting.takes_value:
            parser.add_argument(setting.option, dest=setting.name, help=help_text)
        else:
            parser.add_argument(
                setting.option, dest=setting.name, action="store_true", help=help_text
            )
    parser.add_argument("passthrough", nargs="*", help=argparse.SUPPRESS)
    return parser


def raw_settings(
    argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[dict[str, str | None], tuple[str, ...]]:
    """Each setting's text as given (option over variable; None when unset),
    and the arguments after `--`."""
    parser = argument_parser()
    options = parser.parse_args(list(argv))
    if options.passthrough and "--" not in argv:
        parser.error(
            f"unexpected argument(s) {' '.join(options.passthrough)}; put vLLM "
            "arguments after `--`, and the model in K3_MODEL (--model)"
        )
    raw: dict[str, str | None] = {}
    for setting in LAUNCHER_SETTINGS:
        given = getattr(options, setting.name)
        if setting.takes_value:
            raw[setting.name] = given if given is not None else environ.get(setting.env)
        else:
            raw[setting.name] = "1" if given else environ.get(setting.env)
        if raw[setting.name] == "":
            raw[setting.name] = None
    return raw, tuple(options.passthrough)


@dataclass(frozen=True)
class Resolution:
    """Settings as far as they could be read, and what is wrong with them."""

    settings: LaunchSettings
    problems: tuple[str, ...]
    # Settings whose value was refused (a stand-in took their place): checks
    # that build on them would only add confusing follow-up problems.
    invalid: frozenset[str]


def resolve(
    raw: Mapping[str, str | None], passthrough: Sequence[str] = ()
) -> LaunchSettings:
    """Typed settings, checking everything that needs no look at this machine;
    raises InvalidSettings listing every problem."""
    resolution = resolve_all(raw, passthrough)
    if resolution.problems:
        raise InvalidSettings(resolution.problems)
    return resolution.settings


def resolve_all(
    raw: Mapping[str, str | None], passthrough: Sequence[str] = ()
) -> Resolution:
    """Typed settings with every problem that needs no look at this machine;
    a refused value is replaced by its default, so later checks can go on."""
    resolver = Resolver(raw)
    problems = resolver.problems
    # Every row as given (None where unset or refused), then with defaults.
    typed = _row_values(resolver)
    values = {
        setting.name: setting.default
        if typed[setting.name] is None
        else typed[setting.name]
        for setting in LAUNCHER_SETTINGS
    }
    profile = PROFILES.get(typed["profile"] or PROFILE.default)
    if "profile" in resolver.invalid:
        profile = None

    features = _features(resolver, profile)
    extra_args = resolver.split("extra_args") + tuple(passthrough)
    problems += owned_flag_problems(extra_args)

    num_nodes, node_rank = typed["num_nodes"], typed["node_rank"]
    master_addr = resolver.text("master_addr")
    if profile is not None:
        num_nodes = check_layout(
            profile,
            {
                name
                for name in ("num_nodes", "node_rank", "master_addr", "master_port")
                if raw[name] is not None
            },
            num_nodes,
            node_rank,
            master_addr,
            problems,
        )

    served_model_name = resolver.text("served_model_name")
    if served_model_name is not None and not served_model_name.isprintable():
        # Clients must type it, and the smoke test and watchdog send it.
        resolver.refuse(
            "served_model_name",
            f"{label('served_model_name')} is {shown(served_model_name)}, which "
            "holds a control character (a newline, a tab, ...); use a name of "
            "printable characters.",
        )
        served_model_name = None
    max_num_seqs = typed["max_num_seqs"] or (
        AMD_MAX_NUM_SEQS if profile and profile.kimi_on_rocm else None
    )
    settings = LaunchSettings(
        **{name: value for name, value in values.items() if name not in WORKED_OUT},
        model=resolver.path("model") or MODEL.default,
        served_model_name=served_model_name or SERVED_MODEL_NAME.default,
        profile=profile or PROFILES[PROFILE.default],
        features=features,
        max_num_seqs=max_num_seqs,
        extra_args=extra_args,
        num_nodes=num_nodes or 1,
        vllm_command=resolver.split("vllm_command") or None,
        stop_budget=StopBudget(values["stop_grace_seconds"]),
    )
    return Resolution(settings, tuple(problems), frozenset(resolver.invalid))


def _row_values(resolver: Resolver) -> dict[str, Default]:
    """Each launcher row's value as its kind reads it; None where it is unset
    or refused."""
    values: dict[str, Default] = {}
    for setting in LAUNCHER_SETTINGS:
        value: Default
        if isinstance(setting.kind, FilePath):
            text = resolver.path(setting.name)
            value = Path(text) if text is not None else None
        elif isinstance(setting.kind, Text | Names):
            value = resolver.text(setting.name)
        else:
            value = resolver.typed(setting.name)
        values[setting.name] = value
    return values


def _features(resolver: Resolver, profile: Profile | None) -> tuple[str, ...]:
    text = resolver.text("features")
    if text is None:
        if "features" in resolver.invalid:
            return ()
        return DEFAULT_FEATURES if profile is None or profile.kimi_on_rocm else ()
    names = {name.strip() for name in text.split(",") if name.strip()}
    if not names:
        resolver.refuse(
            "features",
            f"{label('features')} is {shown(text)}, which names no feature; list "
            f"features separated by commas, or `none` for no features.",
        )
        return ()
    if names == {"none"}:
        return ()
    problems = resolver.problems
    if "none" in names:
        problems.append(
            f"{label('features')} is {shown(text)}: `none` cannot go with other "
            "features; drop `none`, or the others."
        )
    unknown = sorted(names - FEATURES.keys() - {"none"})
    if unknown:
        problems.append(
            f"{label('features')} names unknown feature(s) "
            f"{', '.join(_feature_name(name) for name in unknown)}; use a "
            f"comma-separated list of: {', '.join(FEATURES)} (or none)."
        )
    for pair, reason in FEATURE_CONFLICTS.items():
        if pair <= names:
            first, second = sorted(pair)
            problems.append(
                f"{label('features')} has both {first} and {second}, but {reason}; "
                f"drop one of them."
            )
    if names and profile is not None and not profile.kimi_on_rocm:
        problems.append(
            f"{label('features')} is {shown(text)}, but profile {profile.name} "
            "builds a plain vLLM command without Kimi-K3 features; unset it, or "
            f"put the vLLM flags you want in {label('extra_args')}."
        )
    # Canonical order, so the same set always gives the same command.
    return tuple(name for name in FEATURES if name in names)


def _feature_name(name: str) -> str:
    """A plain name as it is; anything odd quoted and shortened."""
    return (
        name
        if name.isascii() and name.isprintable() and len(name) < 40
        else (shown(name))
    )
