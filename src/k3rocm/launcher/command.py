"""The vLLM command and environment a set of checked settings stands for,
and their dry-run text."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from k3rocm.common.profiles import (
    AMD_ARGS,
    AMD_ENV,
    FEATURES,
    MultiNode,
    Profile,
)
from k3rocm.common.setting_table import KDA_METADATA
from k3rocm.common.vllm_release import TARGET
from k3rocm.launcher.metrics_flags import vllm_metrics_args
from k3rocm.launcher.settings import LaunchSettings

# The target release's spelling of each flag the command has.
_FLAG = TARGET.serve
API_KEY_ENV = TARGET.api_key_env
DEFAULT_VLLM_COMMAND = ("vllm", "serve")
DRAIN_MIDDLEWARE = "k3rocm.container.drain.DrainMiddleware"
# Added after the drain, so outermost: a request without the key is refused
# before it counts as in flight.
ACCESS_MIDDLEWARE = "k3rocm.container.api_access.ApiAccessMiddleware"


@dataclass(frozen=True)
class Launch:
    # One tuple per dry-run line: the program and model, then each flag with
    # its value(s).
    lines: tuple[tuple[str, ...], ...]
    # Variables the launcher adds to the inherited environment, in order.
    env: tuple[tuple[str, str], ...]

    @property
    def argv(self) -> list[str]:
        return [arg for line in self.lines for arg in line]

    def exec_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        return {**environ, **dict(self.env)}


def build_launch(
    settings: LaunchSettings, environ: Mapping[str, str], api_key: str | None
) -> Launch:
    profile = settings.profile
    lines: list[tuple[str, ...]] = [_program(settings)]
    lines += [
        (_FLAG.served_model_name.long, settings.served_model_name),
        (_FLAG.host.long, settings.host),
        (_FLAG.port.long, str(settings.port)),
    ]
    lines += _parallel_args(settings)
    env: list[tuple[str, str]] = []
    if profile.kimi_on_rocm:
        lines += AMD_ARGS
        # Operators may tune the recipe's variables; the required one was
        # checked before we got here.
        env += [(name, environ.get(name) or value) for name, value in AMD_ENV]
        # Which metadata path the Kimi KDA layer takes (patch 0004 reads it;
        # supervise run refused any other value): shown in the dry run.
        env.append((KDA_METADATA.env, str(KDA_METADATA.read(environ))))
    if settings.max_num_seqs is not None:
        lines.append((_FLAG.max_num_seqs.long, str(settings.max_num_seqs)))
    if settings.max_model_len is not None:
        lines.append((_FLAG.max_model_len.long, str(settings.max_model_len)))
    for name in settings.features:
        lines += FEATURES[name].args
    metrics_args = vllm_metrics_args(single_api_server=_single_api_server(settings))
    lines += [(flag,) for flag in metrics_args]
    # The stop drains in front of vLLM (k3rocm.container.drain); vLLM's own shutdown
    # timeout is the share of the stop budget left to it.
    lines.append(
        (_FLAG.shutdown_timeout.long, str(settings.stop_budget.vllm_shutdown_timeout))
    )
    if _serves_api(settings):
        lines.append((_FLAG.middleware.long, DRAIN_MIDDLEWARE))
        lines.append((_FLAG.middleware.long, ACCESS_MIDDLEWARE))
        # The health check, Prometheus and the stall watchdog ask these every
        # few seconds; their access lines would bury the API's.
        lines.append((_FLAG.disable_access_log_for_endpoints.long, QUIET_ENDPOINTS))
    lines += _flag_lines(settings.extra_args)
    if api_key is not None:
        env.append((API_KEY_ENV, api_key))
    return Launch(tuple(lines), tuple(env))


def _serves_api(settings: LaunchSettings) -> bool:
    """Every node but the headless ones (native multi-node, rank > 0)."""
    native = settings.profile.multi_node is MultiNode.NATIVE
    return not (native and settings.node_rank)


QUIET_ENDPOINTS = "/health,/metrics"


def _single_api_server(settings: LaunchSettings) -> bool:
    """Whether `vllm serve` runs exactly one API server in its own process,
    the only layout where --disable-log-stats keeps the metrics feed on.

    Not on headless nodes (no API server), not with data parallelism (vLLM
    defaults --api-server-count to the data-parallel size, and its engines
    run apart from the API server even with one), and not when the extra
    arguments set --api-server-count to anything but 1 (0 means headless).
    A count we cannot read counts as several: dropping --disable-log-stats
    wrongly only costs log lines, keeping it wrongly costs the metrics."""
    profile = settings.profile
    if profile.data_parallel > 1:
        return False
    if not _serves_api(settings):
        return False
    count = _api_server_count(settings.extra_args)
    # Compared as text: int() refuses numbers of more than 4,300 digits.
    return count is None or (
        count.isascii() and count.isdigit() and count.lstrip("0") == "1"
    )


def _api_server_count(args: tuple[str, ...]) -> str | None:
    """The last --api-server-count value in args (argparse keeps the last)."""
    count = None
    for index, arg in enumerate(args):
        flag, has_value, value = arg.partition("=")
        if flag not in TARGET.api_server_count_flags:
            continue
        if has_value:
            count = value
        else:
            count = args[index + 1] if index + 1 < len(args) else ""
    return None if count is None else count.strip()


def _flag_lines(args: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Each flag with the values that follow it, for a readable dry run."""
    lines: list[list[str]] = []
    for arg in args:
        if arg.startswith("-") or not lines:
            lines.append([arg])
        else:
            lines[-1].append(arg)
    return [tuple(line) for line in lines]


def _program(settings: LaunchSettings) -> tuple[str, ...]:
    if settings.vllm_command is not None:
        return (*settings.vllm_command, settings.model)
    profile = settings.profile
    if not profile.kimi_on_rocm and profile.multi_node is MultiNode.NONE:
        return (
            sys.executable,
            "-m",
            TARGET.openai_server_module,
            _FLAG.model.long,
            settings.model,
        )
    # Only `vllm serve` runs headless nodes; the OpenAI server module ignores
    # --headless and starts an API server anyway.
    return (*DEFAULT_VLLM_COMMAND, settings.model)


def _parallel_args(settings: LaunchSettings) -> list[tuple[str, ...]]:
    profile: Profile = settings.profile
    if profile.world_size == 1:
        return []
    args: list[tuple[str, ...]] = [
        (_FLAG.tensor_parallel_size.long, str(profile.tensor_parallel))
    ]
    if profile.data_parallel > 1:
        args.append((_FLAG.data_parallel_size.long, str(profile.data_parallel)))
    if profile.expert_parallel:
        args.append((_FLAG.enable_expert_parallel.long,))
    if profile.multi_node is MultiNode.NATIVE:
        assert settings.node_rank is not None and settings.master_addr is not None
        args += [
            (_FLAG.nnodes.long, str(settings.num_nodes)),
            (_FLAG.node_rank.long, str(settings.node_rank)),
            (_FLAG.master_addr.long, settings.master_addr),
            (_FLAG.master_port.long, str(settings.master_port)),
        ]
        # Only node 0 serves the API; the others run engines/workers.
        if settings.node_rank > 0:
            args.append((_FLAG.headless.long,))
    return args


def dry_run_text(launch: Launch) -> str:
    """The environment and command as a shell script, one variable, flag or
    argument per line; the API key is masked."""
    out = [
        f"export {name}={shlex.quote('<hidden>' if name == API_KEY_ENV else value)}"
        for name, value in launch.env
    ]
    rendered = [shlex.join(line) for line in launch.lines]
    out.append("exec " + " \\\n  ".join(rendered))
    return "\n".join(out) + "\n"
