"""The container's settings: one row per ``K3_*`` environment variable, with
its typed default and meaning (and, for the launcher's, the matching
command-line option). Every module that needs a setting's default reads it
here; README's tables and kimi-k3.env.example are checked against this table
(tests/test_setting_table.py), and ``python -m k3rocm.setting_table`` prints
README's tables.

A default of None means no fixed value (unset, or worked out at run time);
``shown`` then says in words what happens, as the documentation shows it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from k3rocm.launcher.profiles import (
    AMD_MAX_NUM_SEQS,
    DEFAULT_FEATURES,
    DEFAULT_PROFILE,
    FEATURES,
    PROFILES,
)
from k3rocm.states import FailurePolicy

Default = int | str | Path | tuple[str, ...] | bool | None

# Where each setting is documented: the launcher's table (README, "Launching
# Kimi-K3"), the container's (README, "Configuration"), or set by the image.
LAUNCHER, CONTAINER, IMAGE = "launcher", "container", "image"


def env_text(value: Default) -> str:
    """A default as an environment variable spells it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


@dataclass(frozen=True)
class Setting:
    name: str
    env: str
    default: Default
    meaning: str
    group: str = LAUNCHER
    option: str | None = None  # the launcher's command-line option
    takes_value: bool = True
    shown: str | None = None  # the default in words, where the value says too little

    @property
    def shown_default(self) -> str:
        return self.shown if self.shown is not None else env_text(self.default)

    def text(self, environ: Mapping[str, str]) -> str:
        """The variable's text, or the default's; compose passes unset
        settings as empty strings."""
        return environ.get(self.env, "").strip() or env_text(self.default)

    def whole_number(self, environ: Mapping[str, str], low: int, high: int) -> int:
        """The value as a whole number from low to high; ValueError says
        what is wrong and what to set."""
        text = self.text(environ)
        if not (
            text.isascii() and text.isdigit() and len(text) <= len(str(high))
        ) or not (low <= int(text) <= high):
            raise ValueError(
                f"{self.env} is {text[:40]!r}; set a whole number from {low} to "
                f"{high} (default {env_text(self.default)})"
            )
        return int(text)

    def choice(self, environ: Mapping[str, str], choices: tuple[str, ...]) -> str:
        """The value, one of choices; ValueError says what is wrong and what
        to set."""
        text = self.text(environ)
        if text not in choices:
            raise ValueError(
                f"{self.env} is {text[:40]!r}; set one of {', '.join(choices)} "
                f"(default {env_text(self.default)})"
            )
        return text


def _launcher(name: str, default: Default, meaning: str, **rest) -> Setting:
    return Setting(
        name,
        "K3_" + name.upper(),
        default,
        meaning,
        option="--" + name.replace("_", "-"),
        **rest,
    )


MODEL = _launcher(
    "model",
    "moonshotai/Kimi-K3",
    "Local checkpoint directory (must hold config.json) or Hugging Face "
    "model id. Values starting with `/`, `.` or `~`, and values naming an "
    "existing directory, are paths.",
)
SERVED_MODEL_NAME = _launcher(
    "served_model_name", "kimi-k3", "Model name clients put in requests."
)
PROFILE = _launcher(
    "profile", DEFAULT_PROFILE, "Parallel layout: " + ", ".join(PROFILES) + "."
)
FEATURES_SETTING = _launcher(
    "features",
    DEFAULT_FEATURES,
    "Comma-separated complete list of features: "
    + ", ".join(FEATURES)
    + "; `none` for no features.",
    shown=",".join(DEFAULT_FEATURES) + " (cpu-dev: none)",
)
MAX_MODEL_LEN = _launcher(
    "max_model_len",
    None,
    "Longest prompt plus output, in tokens.",
    shown="the model's",
)
MAX_NUM_SEQS = _launcher(
    "max_num_seqs",
    AMD_MAX_NUM_SEQS,
    "Most sequences running at once (per engine).",
    shown=f"{AMD_MAX_NUM_SEQS} (cpu-dev: vLLM's)",
)
HOST = _launcher("host", "0.0.0.0", "Address the API listens on.")
PORT = _launcher("port", 8000, "Port the API listens on.")
API_KEY_FILE = _launcher(
    "api_key_file",
    None,
    "File holding the API key; must not be world-readable. The key reaches "
    "vLLM as VLLM_API_KEY, never on the command line.",
    shown="none (no key)",
)
EXTRA_ARGS = _launcher(
    "extra_args",
    None,
    "More vLLM flags, split like a shell would, added last (they override "
    "the recipe's). Arguments after `--` on the command line are added "
    "after these.",
    shown="none",
)
NUM_NODES = _launcher(
    "num_nodes",
    None,
    "Nodes the deployment spans (multi-node profiles).",
    shown="GPUs of the profile / 8",
)
NODE_RANK = _launcher(
    "node_rank",
    None,
    "This node's index, 0 to nodes - 1; required by tep16 and dep16.",
    shown="none",
)
MASTER_ADDR = _launcher(
    "master_addr",
    None,
    "Address of node 0, reachable from every node; required by tep16 and dep16.",
    shown="none",
)
MASTER_PORT = _launcher(
    "master_port", 29501, "Port on node 0 the nodes meet on (tep16, dep16)."
)
GPU_COUNT = _launcher(
    "gpu_count",
    None,
    "GPUs visible on this node; by default the `renderD*` devices in "
    "K3_DRI_DIR are counted.",
    shown="counted",
)
DRI_DIR = _launcher(
    "dri_dir", Path("/dev/dri"), "Where GPU render devices are counted."
)
VLLM_COMMAND = _launcher(
    "vllm_command",
    None,
    "Command that runs `vllm serve`, split like a shell would; the model follows it.",
    shown="vllm serve (cpu-dev: this Python's `-m vllm.entrypoints.openai."
    "api_server --model`)",
)
STOP_GRACE_SECONDS = _launcher(
    "stop_grace_seconds",
    120,
    "Docker's stop timeout for the container (compose's stop_grace_period); "
    "the drain, vLLM's --shutdown-timeout and supervisord's waits are derived "
    "from it.",
)
DRY_RUN = _launcher(
    "dry_run",
    False,
    "Print the command and environment, one per line, and exit 0.",
    takes_value=False,
)

SMOKE_ON_FAILURE = Setting(
    "smoke_on_failure",
    "K3_SMOKE_ON_FAILURE",
    FailurePolicy.STOP,
    "`stop`: a failed smoke test makes the container unhealthy and exit 4. "
    "`warn`: keep serving, verdict gauge 0, loud log.",
    CONTAINER,
)
SMOKE_STAGE1_TIMEOUT = Setting(
    "smoke_stage1_timeout",
    "K3_SMOKE_STAGE1_TIMEOUT",
    900,
    "Seconds for smoke stage 1 (checks before vLLM starts, GPU kernel "
    "compile included).",
    CONTAINER,
)
SMOKE_LOAD_TIMEOUT = Setting(
    "smoke_load_timeout",
    "K3_SMOKE_LOAD_TIMEOUT",
    # Loading Kimi-K3's weights takes hours; the health check's start period
    # is sized the same.
    21600,
    "Seconds vLLM may take to answer `/health` (weights loading).",
    CONTAINER,
)
SMOKE_STAGE2_TIMEOUT = Setting(
    "smoke_stage2_timeout",
    "K3_SMOKE_STAGE2_TIMEOUT",
    600,
    "Seconds for smoke stage 2's requests once vLLM is healthy.",
    CONTAINER,
)
VLLM_MAX_RESTARTS = Setting(
    "vllm_max_restarts",
    "K3_VLLM_MAX_RESTARTS",
    3,
    "vLLM deaths tolerated (each is restarted) before the container exits 3.",
    CONTAINER,
)
VLLM_START_SECONDS = Setting(
    "vllm_start_seconds",
    "K3_VLLM_START_SECONDS",
    10,
    "vLLM dying sooner counts as a failed start (retried, then fatal: exit 3).",
    CONTAINER,
)
STATUS_PORT = Setting(
    "status_port",
    "K3_STATUS_PORT",
    8001,
    "Port of the container's own start-up metrics (k3rocm.status); "
    "Prometheus scrapes it on the server's service name.",
    CONTAINER,
)
LOAD_ALERT_SECONDS = Setting(
    "load_alert_seconds",
    "K3_LOAD_ALERT_SECONDS",
    3 * 3600,
    "Seconds of start-up (smoke stage 1, loading, stage 2) after which the "
    "alert KimiK3LoadSlow fires.",
    CONTAINER,
)

STALL_SECONDS = Setting(
    "stall_seconds",
    "K3_STALL_SECONDS",
    # Far above any step that ends (tens of ms to a few seconds), above the
    # slowest legitimate one known (a cold AITER module build on the first
    # request of a new shape, ~225 s on gfx950), as sglang's 300 s watchdog.
    300,
    "Seconds without an engine step while requests are pending after which "
    "the engine counts as stalled: stacks are captured, the container exits "
    '5 (README, "When the engine stalls").',
    CONTAINER,
)
FORENSICS_DIR = Setting(
    "forensics_dir",
    "K3_FORENSICS_DIR",
    Path("/home/k3/.cache/k3rocm/forensics"),
    "Where stall stack dumps are kept (on the cache volume, so they outlive "
    "the container).",
    CONTAINER,
)
# The ROCm Kimi KDA layer's chunk metadata: built on the GPU by the series
# (the stall-free prefill path), or vLLM 0.27.1's own build (its `.tolist()`
# stall), so that one image can be compared against itself.
KDA_METADATA_PATHS = ("device", "legacy")
KDA_METADATA = Setting(
    "kda_metadata",
    "K3_KDA_METADATA",
    KDA_METADATA_PATHS[0],
    "`device`: the series' stall-free prefill path (KDA chunk metadata built "
    "on the GPU). `legacy`: vLLM 0.27.1's own path, stall included, to compare "
    'one image against itself (README, "Check it on your hardware").',
    CONTAINER,
)

RUN_DIR = Setting(
    "run_dir",
    "K3_RUN_DIR",
    Path("/run/k3rocm"),
    'The container\'s runtime directory (README, "The run directory").',
    IMAGE,
)
SMOKE_REPORT = Setting(
    "smoke_report",
    "K3_SMOKE_REPORT",
    None,
    "The smoke test's JSON report.",
    IMAGE,
    shown='in K3_RUN_DIR (README, "The run directory")',
)
SUPERVISORD_CONF = Setting(
    "supervisord_conf",
    "K3_SUPERVISORD_CONF",
    Path("/opt/k3rocm/docker/supervisord.conf"),
    "supervisord's configuration (docker/supervisord.conf in the image).",
    IMAGE,
)
IMAGE_TAG = Setting(
    "image_tag",
    "K3_IMAGE_TAG",
    None,
    "The image's tag (the Dockerfile sets it); k3rocm_build_info reports it.",
    IMAGE,
    shown="the image's",
)

SETTINGS: tuple[Setting, ...] = tuple(
    value for value in tuple(globals().values()) if isinstance(value, Setting)
)
BY_ENV = {setting.env: setting for setting in SETTINGS}


def markdown_table(group: str) -> str:
    """A README table of one group's settings."""
    if group == LAUNCHER:
        lines = ["| variable | option | default | meaning |", "|---|---|---|---|"]
        lines += [
            f"| `{s.env}` | `{s.option}` | {s.shown_default} | {s.meaning} |"
            for s in SETTINGS
            if s.group == group
        ]
    else:
        lines = ["| variable | default | meaning |", "|---|---|---|"]
        lines += [
            f"| `{s.env}` | {s.shown_default} | {s.meaning} |"
            for s in SETTINGS
            if s.group == group
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for group in (LAUNCHER, CONTAINER):
        sys.stdout.write(f"{group}:\n{markdown_table(group)}\n")
