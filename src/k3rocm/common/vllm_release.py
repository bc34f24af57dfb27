"""What the distribution relies on of the vLLM release its series targets,
in one place: each name a release may change (flags, routes, process
titles, backend names), keyed by the release. The wings read TARGET; moving
the series to another vLLM is `patches/` plus an entry here (and
`k3rocm pins --write`: docs/patch-series.md, "Upgrading vLLM").
tests/common/test_vllm_release.py holds TARGET_VERSION to
patches/series.toml; the tests that run vLLM check each name against it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VllmRelease:
    version: str
    # `vllm serve`'s spellings of --api-server-count (it also reads _ for -).
    api_server_count_flags: tuple[str, ...]
    # The flags the step-latency plugin needs when the one API server runs in
    # the `vllm serve` process: iteration details feed the plugin, and
    # --disable-log-stats drops the logging stat logger (a line every step)
    # while the installed plugin keeps stats collection on.
    metrics_args_one_api_server: tuple[str, ...]
    # The same for several API servers or none (headless): there `vllm serve`
    # hands --disable-log-stats to the engine cores literally, which would
    # then send no scheduler stats; nothing logs per step there anyway.
    metrics_args_multiprocess: tuple[str, ...]
    # Routes that answer without running the model (health checks, scrapes).
    open_paths: frozenset[str]
    # Admin, scaling, documentation and development routes.
    admin_paths: frozenset[str]
    # The attention backend the Kimi KDA layer resolves to without the series'
    # backend (K3_KDA_METADATA=legacy).
    legacy_kda_backend: str
    # Process titles vLLM sets in its command line (comm cuts them at 15).
    engine_core_title: str
    worker_title: str

    @property
    def process_title_prefix(self) -> str:
        return self.engine_core_title.split("::")[0] + "::"


RELEASES = {
    "0.27.1": VllmRelease(
        version="0.27.1",
        api_server_count_flags=("--api-server-count", "--api_server_count", "-asc"),
        metrics_args_one_api_server=(
            "--enable-logging-iteration-details",
            "--disable-log-stats",
        ),
        metrics_args_multiprocess=("--enable-logging-iteration-details",),
        open_paths=frozenset({"/health", "/metrics"}),
        admin_paths=frozenset(
            {
                # elastic expert-parallel scaling (an admin action, and its state)
                "/scale_elastic_ep",
                "/is_scaling_elastic_ep",
                # the server's load counter
                "/load",
                # the API's documentation (a map of every route)
                "/docs",
                "/docs/oauth2-redirect",
                "/redoc",
                "/openapi.json",
                # vLLM's development routes (VLLM_SERVER_DEV_MODE=1)
                "/server_info",
                "/reset_prefix_cache",
                "/reset_mm_cache",
                "/sleep",
                "/wake_up",
                "/is_sleeping",
                "/collective_rpc",
                "/start_profile",
                "/stop_profile",
            }
        ),
        legacy_kda_backend="GDN_ATTN",
        engine_core_title="VLLM::EngineCore",
        worker_title="VLLM::Worker",
    ),
}
TARGET_VERSION = "0.27.1"
TARGET = RELEASES[TARGET_VERSION]
