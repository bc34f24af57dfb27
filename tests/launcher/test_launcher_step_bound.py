"""The launcher refuses a step larger than the KDA kernels were proven to run
(issue 38 item 2): the step's tokens (--max-num-batched-tokens of the final
command, the model length with chunked prefill off) times the KDA heads a
rank, against the largest call the lent H200 ran and checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vllm.utils.argparse_utils import human_readable_int

from k3rocm.common.profiles import AMD_ARGS
from k3rocm.launcher.__main__ import main
from k3rocm.launcher.owned_flags import exact_values, last_values
from k3rocm.launcher.step_bound import _BATCHED, _CHUNKED, _tokens

pytestmark = pytest.mark.every_line

REPO = Path(__file__).resolve().parents[2]
LONG_STEPS = REPO / "docs" / "benchmarks-2026-12-03-h200-k3.7-long-steps.json"
# Kimi-K3's 96 KDA heads split by tensor parallelism (vLLM #52803).
HEADS = {"tp8": 12, "tep8": 12, "tep16": 6, "dep16": 96}
NODE0 = {"K3_NODE_RANK": "0", "K3_MASTER_ADDR": "10.0.0.1"}


def proven_token_heads() -> int:
    """The largest call of the H200 run that agreed on the patched kernels
    (and crashed on 0.27.1's at the same size)."""
    runs = [json.loads(line) for line in LONG_STEPS.read_text().splitlines()]
    patched = [r for r in runs if r["tree"] == "patched" and r["agrees"]]
    crashed = {(r["heads"], r["tokens"]) for r in runs if r["tree"] == "pristine"}
    assert crashed == {(r["heads"], r["tokens"]) for r in patched}
    return max(r["heads"] * r["tokens"] for r in patched)


def launch(capsys, profile: str, extra_args: str = "", **settings: str):
    env = {
        "K3_MODEL": "moonshotai/Kimi-K3",
        "K3_GPU_COUNT": "8",
        "K3_PROFILE": profile,
        "K3_EXTRA_ARGS": extra_args,
        **(NODE0 if profile in ("tep16", "dep16") else {}),
        **settings,
    }
    code = main(["--dry-run"], env)
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    errors = [line for line in err.splitlines() if "nothing started" not in line]
    assert len(errors) == 1, err
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


def test_dep16_refuses_a_step_of_200000_tokens(capsys):
    code, _, err = launch(capsys, "dep16", "--max-num-batched-tokens 200000")
    assert_refused(code, err, "K3_EXTRA_ARGS", "200,000", "dep16", "104,000")


@pytest.mark.parametrize("profile", sorted(HEADS))
def test_each_profile_runs_up_to_the_proven_step_and_no_further(capsys, profile):
    bound = proven_token_heads() // HEADS[profile]
    code, out, err = launch(capsys, profile, f"--max-num-batched-tokens {bound}")
    assert code == 0, err
    assert f"--max-num-batched-tokens {bound}" in out
    code, _, err = launch(capsys, profile, f"--max-num-batched-tokens {bound + 1}")
    assert_refused(code, err, f"{bound + 1:,}", profile, f"{bound:,}")


@pytest.mark.parametrize(
    "extra_args", ["--max_num_batched_tokens=200000", "--max-num-bat 200k"]
)
def test_the_step_is_read_in_every_spelling_vllm_reads(capsys, extra_args):
    code, _, err = launch(capsys, "dep16", extra_args)
    assert_refused(code, err, "200,000", "104,000")


def test_a_later_value_wins_as_in_vllm(capsys):
    code, _, err = launch(
        capsys, "dep16", "--max-num-batched-tokens 200000 --max-num-batched-tokens 8192"
    )
    assert code == 0, err


def test_without_chunked_prefill_the_model_length_is_the_step(capsys):
    off = "--no-enable-chunked-prefill"
    code, _, err = launch(capsys, "dep16", off)
    assert_refused(code, err, "chunked prefill off", "K3_MAX_MODEL_LEN", "104,000")
    code, _, err = launch(capsys, "dep16", off, K3_MAX_MODEL_LEN="200000")
    assert_refused(code, err, "200,000", "104,000")
    code, _, err = launch(capsys, "tp8", off, K3_MAX_MODEL_LEN="200000")
    assert code == 0, err


def test_cpu_dev_has_no_kda_bound(capsys):
    code, _, err = launch(capsys, "cpu-dev", "--max-num-batched-tokens 2000000")
    assert code == 0, err


# Without extra arguments the launcher reads its own recipe without vLLM's
# parser (seconds of import at every start and every refused setting).
def test_the_recipe_reads_the_same_without_vllms_parser():
    recipe = [arg for line in AMD_ARGS for arg in line]
    dests = (_BATCHED, _CHUNKED)
    assert exact_values(recipe, dests) == last_values(recipe, dests)
    assert _BATCHED in exact_values(recipe, dests)
    # A spelling only vLLM's parser reads is where the readings part.
    shortened = ["--max-num-bat", "8192"]
    assert exact_values(shortened, dests) != last_values(shortened, dests)


@given(st.from_regex(r"[0-9]{1,30}", fullmatch=True))
def test_a_plain_number_is_read_as_vllm_reads_it(text):
    assert _tokens(text) == human_readable_int(text)


def test_a_start_without_extra_arguments_imports_no_vllm(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    code = (
        "import sys; from k3rocm.launcher.__main__ import main; "
        f"env = {{'K3_MODEL': {str(tmp_path)!r}, 'K3_GPU_COUNT': '8', "
        "'K3_PROFILE': 'dep16', **" + repr(NODE0) + "}; "
        "print(main(['--dry-run'], env), 'vllm' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.stderr.strip().splitlines()[-1] == "0 False", done.stderr[-2000:]
