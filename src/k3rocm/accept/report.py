"""The acceptance report: one JSON document (the A/B command reads it) and the
same as Markdown tables."""

from __future__ import annotations

import json
from pathlib import Path

from k3rocm.accept.bench import FIGURES

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
FORMAT = 1


def markdown(report: dict) -> str:
    lines = [
        f"# k3rocm acceptance: {report['verdict']}",
        "",
        f"Server {report['server']['base_url']}, model "
        f"{report['server']['served_model_name']}, KDA metadata path "
        f"{report['server']['kda_metadata']}.",
        "",
    ]
    bench = report["bench"]
    if bench["runs"]:
        w = bench["workload"]
        lines += [
            f"## vllm bench serve (random, input {w['input_len']}, output "
            f"{w['output_len']} tokens, {w['prompts_per_concurrency']} prompts "
            f"and {w['warmups_per_concurrency']} warm-ups per concurrent "
            f"request, warm-ups excluded)",
            "",
            "| concurrency | prompts | failed | "
            + " | ".join(f"{name} ({unit})" for _, name, unit, _ in FIGURES)
            + " |",
            "|---:|---:|---:|" + "---:|" * len(FIGURES),
        ]
        for run in bench["runs"]:
            figures = run["figures"]
            lines.append(
                f"| {run['concurrency']} | {run['num_prompts']} | "
                f"{figures['failed']:.0f} | "
                + " | ".join(f"{figures[key]:.2f}" for key, *_ in FIGURES)
                + " |"
            )
        lines.append("")
    if bench.get("error"):
        lines += [f"Benchmark failed: {bench['error']}", ""]
    accuracy = report["accuracy"]
    if accuracy is not None:
        low, high = accuracy["interval95"]
        lines += [
            "## Accuracy gate (generated arithmetic word problems, greedy)",
            "",
            f"{accuracy['correct']} of {accuracy['problems']} right: "
            f"{accuracy['accuracy']:.1%} (95 % interval {low:.1%} to "
            f"{high:.1%}), {accuracy['errors']} request error(s); threshold "
            f"{accuracy['threshold']:.1%}: "
            + ("passed" if accuracy["passed"] else "FAILED"),
            "",
        ]
    return "\n".join(lines)


def write(report: dict, directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    as_json, as_md = directory / REPORT_JSON, directory / REPORT_MD
    as_json.write_text(json.dumps(report, indent=2) + "\n")
    as_md.write_text(markdown(report))
    return as_json, as_md
