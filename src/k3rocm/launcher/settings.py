"""The launcher's settings: environment variables (the container's interface)
with matching command-line options, resolved into typed values.

An option given on the command line wins over its variable; an empty
variable counts as unset. Every problem found is reported, not only the
first."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from k3rocm.launcher.profiles import (
    AMD_MAX_NUM_SEQS,
    DEFAULT_FEATURES,
    DEFAULT_PROFILE,
    FEATURE_CONFLICTS,
    FEATURES,
    PROFILES,
    MultiNode,
    Profile,
)
from k3rocm.stop_budget import (
    DEFAULT_GRACE_SECONDS,
    InvalidGrace,
    StopBudget,
    parse_grace,
)


@dataclass(frozen=True)
class Setting:
    name: str
    env: str
    option: str
    default: str
    meaning: str
    takes_value: bool = True


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "model",
        "K3_MODEL",
        "--model",
        "moonshotai/Kimi-K3",
        "Local checkpoint directory (must hold config.json) or Hugging Face "
        "model id. Values starting with `/`, `.` or `~`, and values naming an "
        "existing directory, are paths.",
    ),
    Setting(
        "served_model_name",
        "K3_SERVED_MODEL_NAME",
        "--served-model-name",
        "kimi-k3",
        "Model name clients put in requests.",
    ),
    Setting(
        "profile",
        "K3_PROFILE",
        "--profile",
        DEFAULT_PROFILE,
        "Parallel layout: " + ", ".join(PROFILES) + ".",
    ),
    Setting(
        "features",
        "K3_FEATURES",
        "--features",
        ",".join(DEFAULT_FEATURES) + " (cpu-dev: none)",
        "Comma-separated complete list of features: "
        + ", ".join(FEATURES)
        + "; `none` for no features.",
    ),
    Setting(
        "max_model_len",
        "K3_MAX_MODEL_LEN",
        "--max-model-len",
        "the model's",
        "Longest prompt plus output, in tokens.",
    ),
    Setting(
        "max_num_seqs",
        "K3_MAX_NUM_SEQS",
        "--max-num-seqs",
        f"{AMD_MAX_NUM_SEQS} (cpu-dev: vLLM's)",
        "Most sequences running at once (per engine).",
    ),
    Setting("host", "K3_HOST", "--host", "0.0.0.0", "Address the API listens on."),
    Setting("port", "K3_PORT", "--port", "8000", "Port the API listens on."),
    Setting(
        "api_key_file",
        "K3_API_KEY_FILE",
        "--api-key-file",
        "none (no key)",
        "File holding the API key; must not be world-readable. The key reaches "
        "vLLM as VLLM_API_KEY, never on the command line.",
    ),
    Setting(
        "extra_args",
        "K3_EXTRA_ARGS",
        "--extra-args",
        "none",
        "More vLLM flags, split like a shell would, added last (they override "
        "the recipe's). Arguments after `--` on the command line are added "
        "after these.",
    ),
    Setting(
        "num_nodes",
        "K3_NUM_NODES",
        "--num-nodes",
        "GPUs of the profile / 8",
        "Nodes the deployment spans (multi-node profiles).",
    ),
    Setting(
        "node_rank",
        "K3_NODE_RANK",
        "--node-rank",
        "none",
        "This node's index, 0 to nodes - 1; required by tep16 and dep16.",
    ),
    Setting(
        "master_addr",
        "K3_MASTER_ADDR",
        "--master-addr",
        "none",
        "Address of node 0, reachable from every node; required by tep16 and dep16.",
    ),
    Setting(
        "master_port",
        "K3_MASTER_PORT",
        "--master-port",
        "29501",
        "Port on node 0 the nodes meet on (tep16, dep16).",
    ),
    Setting(
        "gpu_count",
        "K3_GPU_COUNT",
        "--gpu-count",
        "counted",
        "GPUs visible on this node; by default the `renderD*` devices in "
        "K3_DRI_DIR are counted.",
    ),
    Setting(
        "dri_dir",
        "K3_DRI_DIR",
        "--dri-dir",
        "/dev/dri",
        "Where GPU render devices are counted.",
    ),
    Setting(
        "vllm_command",
        "K3_VLLM_COMMAND",
        "--vllm-command",
        "vllm serve (cpu-dev: this Python's `-m vllm.entrypoints.openai."
        "api_server --model`)",
        "Command that runs `vllm serve`, split like a shell would; the model "
        "follows it.",
    ),
    Setting(
        "stop_grace_seconds",
        "K3_STOP_GRACE_SECONDS",
        "--stop-grace-seconds",
        str(DEFAULT_GRACE_SECONDS),
        "Docker's stop timeout for the container (compose's stop_grace_period); "
        "the drain, vLLM's --shutdown-timeout and supervisord's waits are derived "
        "from it.",
    ),
    Setting(
        "dry_run",
        "K3_DRY_RUN",
        "--dry-run",
        "0",
        "Print the command and environment, one per line, and exit 0.",
        takes_value=False,
    ),
)
SETTINGS_BY_NAME = {setting.name: setting for setting in SETTINGS}

# Flags the launcher manages through its own settings; in extra arguments
# they would silently undo what validation checked.
MANAGED_FLAGS = {
    "--model": "model",
    "--served-model-name": "served_model_name",
    "--host": "host",
    "--port": "port",
    "--max-model-len": "max_model_len",
    "--max-num-seqs": "max_num_seqs",
    "--tensor-parallel-size": "profile",
    "-tp": "profile",
    "--data-parallel-size": "profile",
    "-dp": "profile",
    "--nnodes": "num_nodes",
    "-n": "num_nodes",
    "--node-rank": "node_rank",
    "-r": "node_rank",
    "--master-addr": "master_addr",
    "--master-port": "master_port",
    "--headless": "node_rank",
    "--api-key": "api_key_file",
    "--shutdown-timeout": "stop_grace_seconds",
}

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class InvalidSettings(Exception):
    """Settings that must not reach vLLM; each message says how to fix it."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True)
class LaunchSettings:
    model: str
    served_model_name: str
    profile: Profile
    features: tuple[str, ...]
    max_model_len: int | None
    max_num_seqs: int | None
    host: str
    port: int
    api_key_file: Path | None
    extra_args: tuple[str, ...]
    num_nodes: int
    node_rank: int | None
    master_addr: str | None
    master_port: int
    gpu_count: int | None
    dri_dir: Path
    vllm_command: tuple[str, ...] | None
    stop_budget: StopBudget
    dry_run: bool


def label(name: str) -> str:
    setting = SETTINGS_BY_NAME[name]
    return f"{setting.env} ({setting.option})"


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="serve-kimi-k3",
        description="Start vLLM 0.27.1 serving Kimi-K3 on AMD MI355X/MI350X "
        "from a few settings, after checking them. Each option has a matching "
        "environment variable; the option wins.",
        epilog="profiles:\n"
        + "".join(f"  {p.name:10} {p.summary}\n" for p in PROFILES.values())
        + "features:\n"
        + "".join(f"  {f.name:10} {f.meaning}\n" for f in FEATURES.values())
        + "\nPass more vLLM flags after `--`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for setting in SETTINGS:
        help_text = f"{setting.meaning} [{setting.env}; default: {setting.default}]"
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
    for setting in SETTINGS:
        given = getattr(options, setting.name)
        if setting.takes_value:
            raw[setting.name] = given if given is not None else environ.get(setting.env)
        else:
            raw[setting.name] = "1" if given else environ.get(setting.env)
        if raw[setting.name] == "":
            raw[setting.name] = None
    return raw, tuple(options.passthrough)


class _Resolver:
    def __init__(self, raw: Mapping[str, str | None]):
        self.raw = raw
        self.problems: list[str] = []

    def text(self, name: str) -> str | None:
        value = self.raw[name]
        return value.strip() if value is not None else None

    def integer(
        self, name: str, minimum: int, maximum: int | None = None
    ) -> int | None:
        text = self.text(name)
        if text is None:
            return None
        bounds = f"from {minimum} to {maximum}" if maximum else f"{minimum} or more"
        if not (text.isascii() and text.isdigit()) or not (
            minimum <= int(text) <= (maximum or int(text))
        ):
            self.problems.append(
                f"{label(name)} is {text!r}, not a whole number {bounds}; set it "
                f"to one, e.g. {SETTINGS_BY_NAME[name].option} "
                f"{self._example(name, minimum)}."
            )
            return None
        return int(text)

    def _example(self, name: str, minimum: int) -> str:
        default = SETTINGS_BY_NAME[name].default
        return default if default.isdigit() else str(max(minimum, 1))

    def split(self, name: str) -> tuple[str, ...]:
        text = self.raw[name]
        if text is None:
            return ()
        try:
            return tuple(shlex.split(text))
        except ValueError as error:
            self.problems.append(
                f"{label(name)} cannot be split like a shell command line "
                f"({error}): {text!r}; balance its quotes."
            )
            return ()

    def boolean(self, name: str) -> bool:
        text = (self.text(name) or "0").lower()
        if text in TRUE_WORDS:
            return True
        if text not in FALSE_WORDS:
            self.problems.append(
                f"{label(name)} is {text!r}; set it to 1 or 0 (also accepted: "
                f"{', '.join(TRUE_WORDS[1:])} / {', '.join(FALSE_WORDS[1:])})."
            )
        return False


def resolve(
    raw: Mapping[str, str | None], passthrough: Sequence[str] = ()
) -> LaunchSettings:
    """Typed settings, checking everything that needs no look at this machine;
    raises InvalidSettings listing every problem."""
    resolver = _Resolver(raw)
    problems = resolver.problems

    profile_name = resolver.text("profile") or DEFAULT_PROFILE
    profile = PROFILES.get(profile_name)
    if profile is None:
        problems.append(
            f"{label('profile')} is {profile_name!r}, which is not a profile; "
            f"use one of: {', '.join(PROFILES)}."
        )

    features = _features(resolver, profile)
    extra_args = resolver.split("extra_args") + tuple(passthrough)
    _check_extra_args(extra_args, problems)

    num_nodes = resolver.integer("num_nodes", 1)
    node_rank = resolver.integer("node_rank", 0)
    master_addr = resolver.text("master_addr")
    if profile is not None:
        num_nodes = _check_nodes(profile, num_nodes, node_rank, master_addr, problems)

    vllm_command = resolver.split("vllm_command") or None
    try:
        stop_budget = parse_grace(resolver.text("stop_grace_seconds"))
    except InvalidGrace as error:
        problems.append(f"{error} ({label('stop_grace_seconds')})")
        stop_budget = parse_grace(None)
    settings = LaunchSettings(
        model=resolver.text("model") or SETTINGS_BY_NAME["model"].default,
        served_model_name=resolver.text("served_model_name")
        or SETTINGS_BY_NAME["served_model_name"].default,
        profile=profile or PROFILES[DEFAULT_PROFILE],
        features=features,
        max_model_len=resolver.integer("max_model_len", 1),
        max_num_seqs=resolver.integer("max_num_seqs", 1)
        or (AMD_MAX_NUM_SEQS if profile and profile.kimi_on_rocm else None),
        host=resolver.text("host") or SETTINGS_BY_NAME["host"].default,
        port=resolver.integer("port", 1, 65535) or 8000,
        api_key_file=_path(resolver.text("api_key_file")),
        extra_args=extra_args,
        num_nodes=num_nodes or 1,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=resolver.integer("master_port", 1, 65535) or 29501,
        gpu_count=resolver.integer("gpu_count", 0),
        dri_dir=Path(resolver.text("dri_dir") or SETTINGS_BY_NAME["dri_dir"].default),
        vllm_command=vllm_command,
        stop_budget=stop_budget,
        dry_run=resolver.boolean("dry_run"),
    )
    if problems:
        raise InvalidSettings(problems)
    return settings


def _path(text: str | None) -> Path | None:
    return Path(text).expanduser() if text is not None else None


def _features(resolver: _Resolver, profile: Profile | None) -> tuple[str, ...]:
    text = resolver.text("features")
    if text is None:
        return DEFAULT_FEATURES if profile is None or profile.kimi_on_rocm else ()
    names = {name.strip() for name in text.split(",") if name.strip()}
    if names == {"none"}:
        return ()
    problems = resolver.problems
    unknown = sorted(names - FEATURES.keys())
    if unknown:
        problems.append(
            f"{label('features')} names unknown feature(s) {', '.join(unknown)}; "
            f"use a comma-separated list of: {', '.join(FEATURES)} (or none)."
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
            f"{label('features')} is {text!r}, but profile {profile.name} builds a "
            "plain vLLM command without Kimi-K3 features; unset it, or put the "
            f"vLLM flags you want in {label('extra_args')}."
        )
    # Canonical order, so the same set always gives the same command.
    return tuple(name for name in FEATURES if name in names)


def _check_extra_args(extra_args: Sequence[str], problems: list[str]) -> None:
    for arg in extra_args:
        # vLLM reads --some_flag as --some-flag, and --flag=value as --flag.
        flag = arg.split("=", 1)[0]
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")
        owner = MANAGED_FLAGS.get(flag)
        if owner is None:
            continue
        if owner == "api_key_file":
            problems.append(
                f"{label('extra_args')} passes {flag}, which would put the API key "
                "on the command line where every process can read it; put the key "
                f"in a file and set {label('api_key_file')}."
            )
        else:
            problems.append(
                f"{label('extra_args')} passes {flag}, which the launcher sets "
                f"itself; remove it and set {label(owner)} instead."
            )


def _check_nodes(
    profile: Profile,
    num_nodes: int | None,
    node_rank: int | None,
    master_addr: str | None,
    problems: list[str],
) -> int:
    nodes = num_nodes or profile.default_num_nodes
    if profile.multi_node is MultiNode.NONE:
        if nodes != 1:
            problems.append(
                f"{label('num_nodes')} is {nodes}, but profile {profile.name} runs "
                "on one node; unset it, or pick a multi-node profile "
                "(tep16, dep16, tep16-ray, dep16-ray)."
            )
        return 1
    if nodes < 2 or profile.world_size % nodes:
        problems.append(
            f"{label('num_nodes')} is {nodes}, but profile {profile.name} spreads "
            f"{profile.world_size} GPUs over 2 or more nodes with the same number "
            f"on each; set it to a divisor of {profile.world_size} above 1, "
            f"normally {profile.default_num_nodes}."
        )
        return nodes
    if profile.multi_node is MultiNode.RAY:
        if node_rank:
            problems.append(
                f"{label('node_rank')} is {node_rank}, but profile {profile.name} "
                "starts vLLM on the Ray head node only; on the other nodes run "
                "`ray start --address=HEAD_ADDRESS:6379 --block` instead of the "
                "launcher, and here unset the node rank."
            )
        return nodes
    if node_rank is None:
        problems.append(
            f"{label('node_rank')} is not set, but profile {profile.name} runs "
            f"the same command on {nodes} nodes; set it to 0 on the node that "
            f"serves the API and 1 to {nodes - 1} on the others."
        )
    elif node_rank >= nodes:
        problems.append(
            f"{label('node_rank')} is {node_rank}, but there are only {nodes} nodes "
            f"({label('num_nodes')}); set it to 0 to {nodes - 1}."
        )
    if master_addr is None:
        problems.append(
            f"{label('master_addr')} is not set, but profile {profile.name} needs "
            "the address of node 0 on every node; set it to an address of node 0 "
            "that all nodes can reach (the same value everywhere)."
        )
    return nodes
