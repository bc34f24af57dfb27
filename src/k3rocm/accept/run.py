"""The acceptance run itself: vLLM's benchmark at each concurrency, then the
accuracy gate, and the verdict of both (``python -m k3rocm.accept`` reads
the options and the server, then calls these)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

from k3rocm.accept.accuracy import ask, ask_all
from k3rocm.accept.arithmetic import problems, wilson
from k3rocm.accept.bench import BenchError, Workload, run_bench

PASSED = "passed"
BENCH_FAILED = "benchmark failed"
ACCURACY_LOW = "accuracy under threshold"


def bench_runs(
    base_url: str,
    model: str,
    served_name: str,
    workload: Workload,
    concurrencies: Sequence[int],
    directory: Path,
    environ: Mapping[str, str],
    api_key: str | None,
    timeout: float,
    log: Callable[[str], None],
) -> tuple[list[dict], str | None]:
    """Each concurrency's figures, and why the benchmark stopped (None when
    every run finished without a failed request)."""
    runs: list[dict] = []
    for concurrency in concurrencies:
        log(f"vllm bench serve at concurrency {concurrency} ...")
        try:
            figures = run_bench(
                base_url,
                model,
                served_name,
                workload,
                concurrency,
                directory,
                environ,
                api_key,
                timeout,
            )
        except BenchError as err:
            return runs, str(err)
        runs.append(
            {
                "concurrency": concurrency,
                "num_prompts": workload.prompts(concurrency),
                "num_warmups": workload.warmups(concurrency),
                "figures": figures,
            }
        )
        if figures["failed"]:
            return runs, (
                f"{figures['failed']:.0f} request(s) failed at concurrency "
                f"{concurrency} (bench-c{concurrency}.log)"
            )
    return runs, None


def accuracy_gate(
    base_url: str,
    api_key: str | None,
    served_name: str,
    *,
    count: int,
    seed: int,
    concurrency: int,
    endpoint: str,
    max_tokens: int,
    timeout: float,
    threshold: float,
) -> dict:
    """The arithmetic problems asked and judged: accuracy, its 95 % interval
    and the first wrong answers."""
    answers = ask_all(
        problems(count, seed),
        concurrency,
        partial(
            ask,
            base_url,
            api_key,
            endpoint,
            served_name,
            max_tokens=max_tokens,
            timeout=timeout,
        ),
    )
    correct = sum(answer.correct for answer in answers)
    interval = wilson(correct, len(answers))
    return {
        "problems": len(answers),
        "correct": correct,
        "errors": sum(answer.error is not None for answer in answers),
        "accuracy": correct / len(answers),
        "interval95": [interval.low, interval.high],
        "threshold": threshold,
        "passed": correct / len(answers) >= threshold,
        "seed": seed,
        "endpoint": endpoint,
        "max_tokens": max_tokens,
        "wrong": [
            {
                "problem": a.problem.text,
                "answer": a.problem.answer,
                "got": a.got,
                "error": a.error,
                "reply_end": a.reply[-300:],
            }
            for a in answers
            if not a.correct
        ][:20],
    }


def verdict_of(bench_error: str | None, accuracy: dict | None) -> str:
    if bench_error is not None:
        return BENCH_FAILED
    if accuracy is not None and not accuracy["passed"]:
        return ACCURACY_LOW
    return PASSED
