"""What makes a cpu-dev server of the tiny model (no YAML needed: the host
side of the try-out runs on any Python 3.11)."""

from k3rocm.common.setting_table import EXTRA_ARGS, PROFILE, SMOKE_LOAD_TIMEOUT
from k3rocm.common.setting_table import MAX_MODEL_LEN as MAX_MODEL_LEN_SETTING
from k3rocm.common.vllm_release import TARGET

_FLAG = TARGET.serve
MAX_MODEL_LEN = 512
# Flags that make the tiny model (k3rocm.tryout.tiny_model) start quickly on
# a 2-core CPU machine, less its length.
_QUICK_ARGS = (
    _FLAG.load_format.long,
    "dummy",
    _FLAG.enforce_eager.long,
    _FLAG.dtype.long,
    "float32",
)
SERVE_ARGS = (*_QUICK_ARGS, _FLAG.max_model_len.long, str(MAX_MODEL_LEN))
SERVE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
SERVER = "kimi-k3"
# The CPU build's own variables, outside compose.yaml's allow-list: the tiny
# model's KV cache size, no Hub, and Triton's interpreter, which lets smoke
# stage 1 run its kernel battery on the CPU.
CPU_SERVER_ENV = {**SERVE_ENV, "TRITON_INTERPRET": "1"}
# The settings of a cpu-dev server on the tiny model (the container's own
# variables, through .env as an operator sets them).
CPU_SETTINGS = {
    PROFILE.env: "cpu-dev",
    MAX_MODEL_LEN_SETTING.env: str(MAX_MODEL_LEN),
    # The length is K3_MAX_MODEL_LEN's.
    EXTRA_ARGS.env: " ".join(_QUICK_ARGS),
    SMOKE_LOAD_TIMEOUT.env: "600",
}
# The services the try-out starts: Grafana's dashboard needs nothing a CPU
# machine lacks to be looked at, and its image is the largest.
SERVICES = (SERVER, "prometheus", "alertmanager")
