"""The launcher's settings, one per environment variable (the container's
interface) with a matching command-line option; the README's settings table
is checked against SETTINGS."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from k3rocm.launcher.profiles import (
    AMD_MAX_NUM_SEQS,
    DEFAULT_FEATURES,
    DEFAULT_PROFILE,
    FEATURES,
    PROFILES,
)
from k3rocm.stop_budget import DEFAULT_GRACE_SECONDS


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

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

# Longest stretch of a value a message repeats: enough to recognise it, short
# enough that a 5,000-digit number or a pasted file stays readable.
SHOWN_CHARS = 60


class InvalidSettings(Exception):
    """Settings that must not reach vLLM; each message says how to fix it."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


def label(name: str) -> str:
    setting = SETTINGS_BY_NAME[name]
    return f"{setting.env} ({setting.option})"


def shown(text: str) -> str:
    """A value as a message quotes it: repr (control characters and broken
    UTF-8 escaped), shortened."""
    if len(text) > SHOWN_CHARS:
        return repr(text[:SHOWN_CHARS]) + f" (+{len(text) - SHOWN_CHARS} more)"
    return repr(text)
