"""Names the launcher, the metrics plugin and the smoke test share."""

import os
from collections.abc import Mapping
from pathlib import Path

from k3rocm.setting_table import HOST, IMAGE_TAG, PORT, RUN_DIR, SMOKE_REPORT

# Where the smoke test writes its JSON report (default: in the runtime
# directory below); the metrics plugin reads it for the verdict gauge, the
# container health check for readiness.
SMOKE_REPORT_ENV = SMOKE_REPORT.env
SMOKE_REPORT_NAME = "smoke-report.json"


def smoke_report_path(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(
        environ.get(SMOKE_REPORT_ENV, "").strip()
        or run_dir(environ) / SMOKE_REPORT_NAME
    )


# vLLM flags the step-latency metrics plugin (k3rocm.metrics) needs, for a
# server whose one API server runs in the `vllm serve` process (the default
# when data-parallel size is 1): iteration details feed the plugin, and
# --disable-log-stats drops vLLM's logging stat logger, which would otherwise
# log every step at INFO; the installed plugin keeps stats collection, the
# plugin's feed and vLLM's `vllm:` metrics on (checked on 0.27.1).
VLLM_METRICS_ARGS = ("--enable-logging-iteration-details", "--disable-log-stats")
# The same for every other layout: several API servers (--api-server-count > 1,
# or data parallel, which defaults it to the data-parallel size) and headless
# nodes. There `vllm serve` starts the engine cores itself with
# --disable-log-stats taken literally, so the engines would send no scheduler
# stats: no plugin metrics and no `vllm:` running/waiting/KV-cache gauges.
# Nothing logs per step there anyway: vLLM drops its logging stat logger when
# it runs several API servers, and headless nodes log no stats.
VLLM_METRICS_ARGS_MULTIPROCESS = ("--enable-logging-iteration-details",)


def vllm_metrics_args(*, single_api_server: bool) -> tuple[str, ...]:
    """The metrics flags for a `vllm serve` command that runs one API server
    in its own process (True) or several API servers or none (False)."""
    return VLLM_METRICS_ARGS if single_api_server else VLLM_METRICS_ARGS_MULTIPROCESS


# The image's tag, set in the image; the metrics plugin reports it in
# k3rocm_build_info.
IMAGE_TAG_ENV = IMAGE_TAG.env

# The container's runtime directory (k3rocm.supervise clears it at start):
# the smoke test's ready mark (the health check needs it), its stage-1 gate
# (vLLM starts only after it) and the drain mark (k3rocm.drain: written on
# stop, refuses new requests).
RUN_DIR_ENV = RUN_DIR.env
DEFAULT_RUN_DIR = RUN_DIR.default
READY_MARK = "ready"
STAGE1_GATE = "stage1-done"
DRAIN_MARK = "draining"
# Why the container stops (k3rocm.supervise's guard writes it, `run` exits
# with its code), the vLLM deaths so far, and the running vLLM's process group.
REASON_FILE = "exit-reason.json"
DEATHS_FILE = "vllm-deaths"
VLLM_GROUP_FILE = "vllm.pgid"


def run_dir(environ: Mapping[str, str] | None = None) -> Path:
    return Path(RUN_DIR.text(os.environ if environ is None else environ))


# Where vLLM's API server listens (the launcher's K3_HOST / K3_PORT), as the
# processes in the same container reach it.
HOST_ENV, PORT_ENV = HOST.env, PORT.env
DEFAULT_PORT = PORT.default
_ANY_ADDRESS = {"", "0.0.0.0", "::", "[::]"}


class BadAddress(ValueError):
    """K3_HOST / K3_PORT cannot be turned into a URL; the message says why."""


def api_base_url(environ: Mapping[str, str]) -> str:
    """``http://HOST:PORT`` of the API server: loopback when vLLM listens on
    every address, else the address it listens on."""
    host = environ.get(HOST_ENV, "").strip()
    port_text = environ.get(PORT_ENV, "").strip() or str(DEFAULT_PORT)
    if not (
        port_text.isascii() and port_text.isdigit() and len(port_text) <= 5
    ) or not (1 <= int(port_text) <= 65535):
        raise BadAddress(
            f"{PORT_ENV} is {port_text[:40]!r}, not a port number from 1 to 65535"
        )
    if host in _ANY_ADDRESS:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{int(port_text)}"
