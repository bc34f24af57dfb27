"""Host cost of the Kimi-K3 parsers on the CPU, vLLM 0.27.1's files against
the series' (patches 0009, 0010), side by side in one process:

- the reasoning-end check the structured-output manager runs every decode
  step of a request still reasoning (`is_reasoning_end_streaming` on the
  request's `all_token_ids`, a vLLM ConstantList), against context length:
  a previous turn's closed think channel at the start, this turn reasoning;
- streaming one tool call through the tool parser one token a delta,
  against the call's size, total parser time.

    PYTHONPATH=src .venv/bin/python benchmarks/cpu_parsers.py [--out FILE]

Prints (and writes) one JSON document; docs/benchmarks.md has a run.
"""

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.vllm_trees import installed_root, patched_tree  # noqa: E402

sys.path.insert(0, str(patched_tree()))

from support.kimi_k3_parsers import PROMPT, deltas, parser_classes  # noqa: E402
from support.kimi_k3_tokenizer import kimi_k3_tokenizer  # noqa: E402
from vllm.v1.utils import ConstantList  # noqa: E402

CONTEXTS = [1_000, 4_000, 16_000, 64_000, 256_000, 1_000_000]
CALL_KB = [6.25, 12.5, 25, 50, 100]
TREES = {"vllm-0.27.1": installed_root, "series": patched_tree}


def encode(text: str) -> list[int]:
    return kimi_k3_tokenizer().encode(text, add_special_tokens=False)


def reasoning_end_step_us(parser, tokens: int) -> float:
    """Median time of one decode step's check at *tokens* of context."""
    head, filler = encode(PROMPT), encode(" the weather")
    ids = head + filler * ((tokens - len(head)) // len(filler))
    all_token_ids, delta = ConstantList(ids), ids[-1:]
    times: list[int] = []
    while len(times) < 2000 and sum(times) < 3e9:  # at most ~3 s a point
        start = time.perf_counter_ns()
        ended = parser.is_reasoning_end_streaming(all_token_ids, delta)
        times.append(time.perf_counter_ns() - start)
        assert not ended
    return statistics.median(times) / 1e3


def tool_call_text(kb: float) -> str:
    body = "x = 'weather Paris tool call' # " * int(kb * 1000 / 32)
    return (
        '<|open|>tools<|sep|><|open|>call tool="run_code" index="1"<|sep|>'
        '<|open|>argument key="code" type="string"<|sep|>'
        f"{body}<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
    )


def stream_tool_call_ms(tool_cls, kb: float) -> tuple[int, float]:
    """Deltas and total parser time of streaming one call of *kb* KB."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionRequest,
    )

    request = ChatCompletionRequest(
        model="kimi-k3", messages=[{"role": "user", "content": "x"}]
    )
    ids = encode(tool_call_text(kb))
    parser = tool_cls(kimi_k3_tokenizer(), [])
    previous, previous_ids, total, calls = "", [], 0, 0
    for delta_text, delta_ids in deltas(ids, [1] * len(ids)):
        current, current_ids = previous + delta_text, previous_ids + delta_ids
        start = time.perf_counter_ns()
        delta = parser.extract_tool_calls_streaming(
            previous, current, delta_text, previous_ids, current_ids, delta_ids, request
        )
        total += time.perf_counter_ns() - start
        calls += len(delta.tool_calls) if delta and delta.tool_calls else 0
        previous, previous_ids = current, current_ids
    assert calls == 1
    return len(ids), total / 1e6


def machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {"cpu": cpu, "python": platform.python_version(), "os": platform.platform()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    classes = {name: parser_classes(root(), name) for name, root in TREES.items()}
    reasoning = {name: cls[0](kimi_k3_tokenizer()) for name, cls in classes.items()}
    result = {
        "command": "PYTHONPATH=src .venv/bin/python benchmarks/cpu_parsers.py",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "reasoning_end_per_step_us": [
            {"context_tokens": tokens}
            | {
                name: round(reasoning_end_step_us(p, tokens), 2)
                for name, p in reasoning.items()
            }
            for tokens in CONTEXTS
        ],
        "tool_call_stream": [],
    }
    for kb in CALL_KB:
        row = {"call_kb": kb}
        for name, (_, tool_cls) in classes.items():
            row["tokens"], row[f"{name}_total_ms"] = stream_tool_call_ms(tool_cls, kb)
        result["tool_call_stream"].append(row)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
