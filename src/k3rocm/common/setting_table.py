"""The container's settings: one typed row per ``K3_*`` environment variable,
with its default, the values it takes, the vLLM flags it owns (the
launcher's), who reads it and its meaning. Every module reads a setting
through its row (``Setting.read``, or ``read_all`` for every problem at
once; k3rocm.common.setting_kinds holds the kinds that parse them): this is
the only parser of settings. README's tables, kimi-k3.env.example, the
launcher's options and owned flags and compose's allow-list come from these
rows or are checked against them (tests/common/test_setting_table.py);
``python -m k3rocm.common.setting_table`` prints README's tables.

A default of None means no fixed value (unset, or worked out at run time);
``shown`` then says in words what happens, as the documentation shows it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from k3rocm.common.profiles import (
    AMD_MAX_NUM_SEQS,
    DEFAULT_FEATURES,
    DEFAULT_PROFILE,
    FEATURES,
    PROFILES,
)
from k3rocm.common.setting_kinds import (
    CONTAINER,
    IMAGE,
    LAUNCHER,
    Default,
    FilePath,
    Flag,
    Names,
    OneOf,
    Seconds,
    Setting,
    Whole,
)
from k3rocm.common.states import FailurePolicy
from k3rocm.common.vllm_release import TARGET, TARGET_VERSION

# The target release's spelling of each flag a row owns.
_SERVE = TARGET.serve


def _launcher(name: str, default: Default, meaning: str, **rest) -> Setting:
    """A launcher row: K3_<NAME>, and the option --<name>."""
    return Setting(
        name,
        "K3_" + name.upper(),
        default,
        meaning,
        option="--" + name.replace("_", "-"),
        **rest,
    )


def _container(name: str, default: Default, meaning: str, **rest) -> Setting:
    """A row of the container's table: K3_<NAME>."""
    return Setting(name, "K3_" + name.upper(), default, meaning, CONTAINER, **rest)


def _image(name: str, default: Default, meaning: str, **rest) -> Setting:
    """A row the image sets: K3_<NAME>."""
    return Setting(name, "K3_" + name.upper(), default, meaning, IMAGE, **rest)


MODEL = _launcher(
    "model",
    "moonshotai/Kimi-K3",
    "Local checkpoint directory (must hold config.json) or Hugging Face "
    "model id. Values starting with `/`, `.` or `~`, and values naming an "
    "existing directory, are paths.",
    owns=_SERVE.model.spellings,
)
SERVED_MODEL_NAME = _launcher(
    "served_model_name",
    "kimi-k3",
    "Model name clients put in requests.",
    owns=_SERVE.served_model_name.spellings,
    readers=("launcher", "container.watchdog"),
)
PROFILE = _launcher(
    "profile",
    DEFAULT_PROFILE,
    "Parallel layout: " + ", ".join(PROFILES) + ".",
    kind=OneOf(tuple(PROFILES), "profile"),
    owns=_SERVE.tensor_parallel_size.spellings + _SERVE.data_parallel_size.spellings,
    readers=("launcher", "common.node", "smoke.settings"),
)
FEATURES_SETTING = _launcher(
    "features",
    DEFAULT_FEATURES,
    "Comma-separated complete list of features: "
    + ", ".join(FEATURES)
    + "; `none` for no features.",
    kind=Names(),
    shown=",".join(DEFAULT_FEATURES) + " (cpu-dev: none)",
)
MAX_MODEL_LEN = _launcher(
    "max_model_len",
    None,
    "Longest prompt plus output, in tokens.",
    shown="the model's",
    kind=Whole(1),
    owns=_SERVE.max_model_len.spellings,
)
MAX_NUM_SEQS = _launcher(
    "max_num_seqs",
    AMD_MAX_NUM_SEQS,
    "Most sequences running at once (per engine).",
    shown=f"{AMD_MAX_NUM_SEQS} (cpu-dev: vLLM's)",
    kind=Whole(1),
    owns=_SERVE.max_num_seqs.spellings,
)
HOST = _launcher(
    "host",
    "0.0.0.0",
    "Address the API listens on.",
    owns=_SERVE.host.spellings,
    readers=("launcher", "common.api_address", "container.supervise"),
)
PORT = _launcher(
    "port",
    8000,
    "Port the API listens on.",
    kind=Whole(1, 65535),
    owns=_SERVE.port.spellings,
    readers=("launcher", "common.api_address", "container.supervise"),
)
API_KEY_FILE = _launcher(
    "api_key_file",
    None,
    "File holding the API key; must not be world-readable. The key reaches "
    "vLLM as VLLM_API_KEY, never on the command line.",
    shown="none (no key)",
    kind=FilePath(),
    owns=_SERVE.api_key.spellings,
    readers=("launcher", "common.api_key"),
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
    kind=Whole(1),
    owns=_SERVE.nnodes.spellings,
)
NODE_RANK = _launcher(
    "node_rank",
    None,
    "This node's index, 0 to nodes - 1; required by tep16 and dep16.",
    shown="none",
    kind=Whole(0),
    owns=_SERVE.node_rank.spellings + _SERVE.headless.spellings,
    readers=("launcher", "common.node"),
)
MASTER_ADDR = _launcher(
    "master_addr",
    None,
    "Address of node 0, reachable from every node; required by tep16 and dep16.",
    shown="none",
    owns=_SERVE.master_addr.spellings,
    readers=("launcher", "common.node"),
)
MASTER_PORT = _launcher(
    "master_port",
    29501,
    "Port on node 0 the nodes meet on (tep16, dep16).",
    kind=Whole(1, 65535),
    owns=_SERVE.master_port.spellings,
    readers=("launcher", "common.node"),
)
GPU_COUNT = _launcher(
    "gpu_count",
    None,
    "GPUs visible on this node; by default the `renderD*` devices in "
    "K3_DRI_DIR are counted.",
    shown="counted",
    kind=Whole(0),
)
DRI_DIR = _launcher(
    "dri_dir",
    Path("/dev/dri"),
    "Where GPU render devices are counted.",
    kind=FilePath(),
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
    kind=Whole(20, 24 * 3600),
    owns=_SERVE.shutdown_timeout.spellings,
    readers=("launcher", "container.supervise"),
)
DRY_RUN = _launcher(
    "dry_run",
    False,
    "Print the command and environment, one per line, and exit 0.",
    kind=Flag(),
)

SMOKE_ON_FAILURE = _container(
    "smoke_on_failure",
    FailurePolicy.STOP,
    "`stop`: a failed smoke test makes the container unhealthy and exit 4. "
    "`warn`: keep serving, verdict gauge 0, loud log.",
    kind=OneOf(tuple(policy.value for policy in FailurePolicy)),
    readers=("smoke",),
)
SMOKE_STAGE1_TIMEOUT = _container(
    "smoke_stage1_timeout",
    900,
    "Seconds for smoke stage 1 (checks before vLLM starts, GPU kernel "
    "compile included).",
    kind=Seconds(),
    readers=("smoke", "container.supervise"),
)
SMOKE_LOAD_TIMEOUT = _container(
    "smoke_load_timeout",
    # Loading Kimi-K3's weights takes hours; the health check's start period
    # is sized the same.
    21600,
    "Seconds vLLM may take to answer `/health` (weights loading).",
    kind=Seconds(),
    readers=("smoke", "monitoring.alerts"),
)
SMOKE_STAGE2_TIMEOUT = _container(
    "smoke_stage2_timeout",
    600,
    "Seconds for smoke stage 2's requests once vLLM is healthy.",
    kind=Seconds(),
    readers=("smoke",),
)
VLLM_MAX_RESTARTS = _container(
    "vllm_max_restarts",
    3,
    "vLLM deaths tolerated (each is restarted) before the container exits 3.",
    kind=Whole(0, 1000),
    readers=("container.guard", "container.supervise"),
)
VLLM_START_SECONDS = _container(
    "vllm_start_seconds",
    10,
    "vLLM dying sooner counts as a failed start (retried, then fatal: exit 3).",
    kind=Whole(0, 3600),
    readers=("container.supervise",),
)
STATUS_PORT = _container(
    "status_port",
    8001,
    "Port of the container's own start-up metrics (k3rocm.container.status); "
    "Prometheus scrapes it on the server's service name.",
    kind=Whole(1, 65535),
    readers=("container.status", "monitoring.alerts", "monitoring.dashboard_rows"),
)
STATUS_HOST = _container(
    "status_host",
    "0.0.0.0",
    "Address the start-up metrics listen on: every address of the "
    "container's own network (one node); compose.multinode.yaml sets the "
    "node's cluster address (VLLM_HOST_IP), not every interface of the host.",
    readers=("container.status",),
)
LOAD_ALERT_SECONDS = _container(
    "load_alert_seconds",
    3 * 3600,
    "Seconds of start-up (smoke stage 1, loading, stage 2) after which the "
    "alert KimiK3LoadSlow fires.",
    kind=Whole(1, 7 * 24 * 3600),
    readers=("container.status", "monitoring.alerts"),
)

STALL_SECONDS = _container(
    "stall_seconds",
    # Far above any step that ends (tens of ms to a few seconds), above the
    # slowest legitimate one known (a cold AITER module build on the first
    # request of a new shape, ~225 s on gfx950), as sglang's 300 s watchdog.
    300,
    "Seconds without an engine step while requests are pending after which "
    "the engine counts as stalled: stacks are captured, the container exits "
    '5 (see "When the engine stalls").',
    kind=Whole(5, 24 * 3600),
    readers=("container.watchdog", "container.status", "monitoring.alerts"),
)
FORENSICS_DIR = _container(
    "forensics_dir",
    Path("/home/k3/.cache/k3rocm/forensics"),
    "Where stall stack dumps and failed smoke reports "
    "(`smoke-report-<UTC time>.json`) are kept (on the cache volume, so they "
    "outlive the container).",
    kind=FilePath(),
    readers=("container.guard", "container.watchdog", "container.writable", "smoke"),
)
# The ROCm Kimi KDA layer's chunk metadata: built on the GPU by the series
# (the stall-free prefill path), or vLLM 0.27.1's own build (its `.tolist()`
# stall), so that one image can be compared against itself. Both carry the
# correctness fixes (vLLM #50649): the A/B is stall against no stall.
KDA_METADATA_PATHS = ("device", "legacy")
# The paths the installed release offers: one whose own path does not stall
# (0.32.0) has no legacy to pick.
KDA_METADATA_OFFERED = (
    KDA_METADATA_PATHS if TARGET.legacy_kda_backend else KDA_METADATA_PATHS[:1]
)
KDA_METADATA = _container(
    "kda_metadata",
    KDA_METADATA_PATHS[0],
    "`device`: the series' stall-free prefill path (KDA chunk metadata built "
    "on the GPU). "
    + (
        f"`legacy`: vLLM {TARGET_VERSION}'s own metadata path, stall included "
        "(with the series' correctness fixes), to compare one image against "
        'itself (see "Check it on your hardware").'
        if TARGET.legacy_kda_backend
        else f"vLLM {TARGET_VERSION} builds it on the GPU too: there is no "
        "stalling path to compare with."
    ),
    kind=OneOf(KDA_METADATA_OFFERED),
    readers=("smoke", "plugin.build_info", "launcher", "accept"),
)

# vLLM's admin, scaling and documentation routes (container.api_access):
# off by default, as they let whoever reaches the port act on the server.
API_ADMIN_ROUTES = _container(
    "api_admin_routes",
    False,
    "`1`: vLLM's admin, scaling and documentation routes (`/scale_elastic_ep`, "
    "`/load`, `/docs`, `/openapi.json`, ...) answer, behind the API key. `0`: "
    'they answer 404 (docs/container.md, "Who may use the API").',
    kind=Flag(),
    readers=("container.api_access",),
)

# The largest request body the API server reads (container.request_body):
# room for a 1M-token prompt (about 10 MB of JSON at worst: token ids, or
# text escaped as \uXXXX) and the images a multimodal request carries.
MAX_REQUEST_BYTES = _container(
    "max_request_bytes",
    64 * 2**20,
    "Largest request body in bytes the API server reads; a larger one is "
    "answered 413 before it is read (a declared length) or as soon as it "
    'passes the limit (a chunked body) (docs/container.md, "Request bodies").',
    shown="67108864 (64 MiB)",
    kind=Whole(4096, 2**34),
    readers=("container.request_body",),
)

RUN_DIR = _image(
    "run_dir",
    Path("/run/k3rocm"),
    'The container\'s runtime directory (docs/container.md, "The run directory").',
    kind=FilePath(),
    readers=("common.run_files", "container.supervise", "container.writable"),
)
SMOKE_REPORT = _image(
    "smoke_report",
    None,
    "The smoke test's JSON report.",
    shown='in K3_RUN_DIR (docs/container.md, "The run directory")',
    kind=FilePath(),
    readers=("common.run_files", "container.supervise"),
)
SUPERVISORD_CONF = _image(
    "supervisord_conf",
    Path("/opt/k3rocm/docker/supervisord.conf"),
    "supervisord's configuration (docker/supervisord.conf in the image).",
    kind=FilePath(),
    readers=("container.supervise",),
)
IMAGE_TAG = _image(
    "image_tag",
    None,
    "The image's tag (the Dockerfile sets it); k3rocm_build_info reports it.",
    shown="the image's",
    readers=("plugin.build_info",),
)

SETTINGS: tuple[Setting, ...] = tuple(
    value for value in tuple(globals().values()) if isinstance(value, Setting)
)
BY_ENV = {setting.env: setting for setting in SETTINGS}
BY_NAME = {setting.name: setting for setting in SETTINGS}
LAUNCHER_SETTINGS = tuple(setting for setting in SETTINGS if setting.group == LAUNCHER)
CONTAINER_SETTINGS = tuple(
    setting for setting in SETTINGS if setting.group == CONTAINER
)


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
