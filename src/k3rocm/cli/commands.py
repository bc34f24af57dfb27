"""Every command of the distribution, in one table: the ``k3rocm``
subcommand, the module that runs it (``python -m MODULE`` is the same
command, and the image's HEALTHCHECK and supervisord use that path), who
runs it, and what it does. docs/commands.md is generated from this table and
tests/cli/test_commands.py checks that every entry module of the package is in
it."""

from __future__ import annotations

from dataclasses import dataclass

# Who runs a command.
OPERATOR = "operator"
IMAGE = "image"  # the container's own process tree, its build or its checks
DEVELOPER = "developer"


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    runs_it: str
    summary: str
    # Arguments put before the caller's (a subcommand of the module).
    leading: tuple[str, ...] = ()

    @property
    def python_m(self) -> str:
        return " ".join(("python -m", self.module, *self.leading))


COMMANDS = (
    Command(
        "launch",
        "k3rocm.launcher",
        OPERATOR,
        "Check the settings, then print (--dry-run) or exec `vllm serve`.",
    ),
    Command(
        "health",
        "k3rocm.container.health",
        IMAGE,
        "The container's health check (HEALTHCHECK): vLLM answers, the smoke "
        "test passed, not draining, not stalled.",
    ),
    Command(
        "ctl",
        "k3rocm.container.supervise",
        OPERATOR,
        "supervisorctl with the container's configuration (`k3rocm ctl status`).",
        leading=("ctl",),
    ),
    Command(
        "supervise",
        "k3rocm.container.supervise",
        IMAGE,
        "The process tree: `run` (the image's CMD), `serve`, `listen`, `ctl`.",
    ),
    Command(
        "smoke",
        "k3rocm.smoke",
        IMAGE,
        "The smoke test: stage 1 before vLLM starts, stage 2 once it answers.",
    ),
    Command(
        "status-server",
        "k3rocm.container.status",
        IMAGE,
        "The container's start-up metrics on K3_STATUS_HOST:K3_STATUS_PORT.",
    ),
    Command(
        "watchdog",
        "k3rocm.container.watchdog",
        IMAGE,
        "The stall watchdog: stacks, then exit 5, when the engine stops "
        "stepping with work pending.",
    ),
    Command(
        "forensics",
        "k3rocm.container.forensics",
        IMAGE,
        "`grant-ptrace`: give the image's py-spy CAP_SYS_PTRACE (a build step).",
    ),
    Command(
        "patch",
        "k3rocm.patchtool.patchset",
        OPERATOR,
        "The patch series on a vLLM tree: `apply`, `check`, `status`.",
    ),
    Command(
        "patchgen",
        "k3rocm.patchtool.patchgen",
        DEVELOPER,
        "Regenerate the patches whose source lives in this package.",
    ),
    Command(
        "pins",
        "k3rocm.supply_chain.pins",
        DEVELOPER,
        "Write (--write) or check (--check) every copy of the image tag, series "
        "id and base image from the series.",
    ),
    Command(
        "triage",
        "k3rocm.patchtool.triage",
        DEVELOPER,
        "What newer vLLM releases change in the files the series touches, "
        "and which changes patches/0.27.1/upstream-triage.toml does not cover.",
    ),
    Command(
        "accept",
        "k3rocm.accept",
        OPERATOR,
        "Acceptance on your hardware: accuracy and benchmark against the "
        "image's own A/B.",
    ),
    Command(
        "vllm-bench",
        "k3rocm.accept.vllm_bench",
        IMAGE,
        "`vllm bench serve` where the `vllm` command cannot start (the "
        "acceptance runs it).",
    ),
    Command(
        "alerts",
        "k3rocm.monitoring.alerts",
        DEVELOPER,
        "Generate the Prometheus alert rules (monitoring/*.yml).",
    ),
    Command(
        "dashboard",
        "k3rocm.monitoring.dashboard",
        DEVELOPER,
        "Generate the Grafana dashboard.",
    ),
    Command(
        "prometheus-rule",
        "k3rocm.monitoring.prometheus_rule",
        DEVELOPER,
        "Generate the Kubernetes PrometheusRule from the alert rules.",
    ),
    Command(
        "settings",
        "k3rocm.common.setting_table",
        DEVELOPER,
        "Print README's settings tables from the setting rows.",
    ),
    Command(
        "image",
        "k3rocm.supply_chain.image",
        IMAGE,
        "The image's tag, labels and version record (the build uses them).",
    ),
    Command(
        "sbom",
        "k3rocm.supply_chain.sbom",
        OPERATOR,
        "The image's CycloneDX SBOM, with the series' pedigree.",
    ),
    Command(
        "try-stack",
        "k3rocm.tryout.stack",
        IMAGE,
        "compose.yaml made into the CPU try-out's stack (scripts/try-cpu).",
    ),
    Command(
        "tiny-model",
        "k3rocm.tryout.tiny_model",
        DEVELOPER,
        "Write the tiny Llama checkpoint the tests and the try-out serve.",
    ),
)
BY_NAME = {command.name: command for command in COMMANDS}


def commands_table() -> str:
    """docs/commands.md's table."""
    lines = ["| command | same as | run by | what it does |", "|---|---|---|---|"]
    lines += [
        f"| `k3rocm {c.name}` | `{c.python_m}` | {c.runs_it} | {c.summary} |"
        for c in COMMANDS
    ]
    return "\n".join(lines) + "\n"
