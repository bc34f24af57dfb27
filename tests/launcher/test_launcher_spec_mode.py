"""dspark runs with PIECEWISE CUDA graphs (vLLM #49918: a prompt of exactly
1 + num_speculative_tokens tokens replayed through the FULL spec-verify
graph leaves its KDA state unwritten), and preflight refuses extra
arguments that would replace that compilation config."""

from __future__ import annotations

import json
import shlex

import pytest
from test_launcher_step_bound import HEADS, assert_refused, launch

pytestmark = pytest.mark.every_line


def command_flags(out: str) -> list[str]:
    return shlex.split(out.split("exec ", 1)[1].replace("\\\n", " "))


@pytest.mark.parametrize("profile", sorted(HEADS))
def test_dspark_sets_piecewise_cudagraphs(capsys, profile):
    code, out, err = launch(capsys, profile, K3_FEATURES="dspark")
    assert code == 0, err
    flags = command_flags(out)
    assert flags.count("--compilation-config") == 1
    config = json.loads(flags[flags.index("--compilation-config") + 1])
    assert config == {"cudagraph_mode": "PIECEWISE"}
    spec = json.loads(flags[flags.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 7


@pytest.mark.parametrize(
    "extra",
    [
        """--compilation-config '{"cudagraph_mode":"FULL_AND_PIECEWISE"}'""",
        "-cc.cudagraph_mode=FULL",
        "--compilation-conf {}",
    ],
)
def test_dspark_refuses_a_compilation_config_in_the_extra_args(capsys, extra):
    code, _, err = launch(capsys, "tp8", extra, K3_FEATURES="dspark")
    assert_refused(code, err, "K3_EXTRA_ARGS", "dspark", "PIECEWISE", "#49918")


def test_without_dspark_a_compilation_config_is_the_operators(capsys):
    extra = """--compilation-config '{"cudagraph_mode":"FULL_AND_PIECEWISE"}'"""
    code, out, err = launch(capsys, "tp8", extra, K3_FEATURES="reasoning")
    assert code == 0, err
    assert command_flags(out).count("--compilation-config") == 1
