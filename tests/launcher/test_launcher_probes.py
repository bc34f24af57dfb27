"""Probes of the launcher from issue 11, each of which once exited with a
traceback or got through: owned vLLM flags in any spelling, unreadable and
locked paths, overlong and odd values, a node pointing at itself, settings
the profile does not use. Each is refused with exit 2 and a clear line, or
passes where it should."""

from __future__ import annotations

import socket

import pytest
from support.launcher_node import (
    API_KEY,
    NODE1,
    assert_refused_cleanly,
    assert_rejected,
    run_in_process,
    run_unprivileged,
)

# -- probes from issue 11: each exited with a traceback or got through -------


# vLLM's parser reads unambiguous prefixes, `_` for `-`, `--flag=value` and
# short aliases; each spelling of an owned flag names the setting to use.
OWNED_FLAG_SPELLINGS = {
    f"--api-ke {API_KEY}": "K3_API_KEY_FILE",
    f"--api_k={API_KEY}": "K3_API_KEY_FILE",
    "--tensor-parallel 2": "K3_PROFILE",
    "-tp 2": "K3_PROFILE",
    "--data-parallel-si=2": "K3_PROFILE",
    "--node-ran 1": "K3_NODE_RANK",
    "--master-ad 10.0.0.9": "K3_MASTER_ADDR",
    "--master_po 29600": "K3_MASTER_PORT",
    "--head": "K3_NODE_RANK",
    "--nnode 2": "K3_NUM_NODES",
    "--shutdown-time 5": "K3_STOP_GRACE_SECONDS",
    "--served-model other": "K3_SERVED_MODEL_NAME",
    "--max-model 4096": "K3_MAX_MODEL_LEN",
    "--max-num-s 4": "K3_MAX_NUM_SEQS",
    "--ho 127.0.0.1": "K3_HOST",
    "--por 9000": "K3_PORT",
}


@pytest.mark.parametrize("extra_args", sorted(OWNED_FLAG_SPELLINGS))
def test_owned_flag_in_any_spelling_is_refused(node, capsys, extra_args):
    env = node.env(K3_EXTRA_ARGS=f"--enable-prefix-caching {extra_args}")
    code, out, err = run_in_process(capsys, env)
    owner = OWNED_FLAG_SPELLINGS[extra_args]
    assert_refused_cleanly(code, out, err, "K3_EXTRA_ARGS", f"set {owner}")


def test_abbreviated_api_key_is_refused_through_the_wrapper(node):
    result = node.run("--dry-run", K3_EXTRA_ARGS=f"--api-ke {API_KEY}")
    assert_rejected(node, result, "passes --api-key", "K3_API_KEY_FILE")
    assert API_KEY not in result.stdout + result.stderr


def test_other_middleware_may_be_added(node, capsys):
    env = node.env(K3_EXTRA_ARGS="--middleware my.Middleware")
    code, out, err = run_in_process(capsys, env)
    assert code == 0, err
    assert "k3rocm.container.drain.DrainMiddleware" in out and "my.Middleware" in out


def test_problems_of_every_kind_are_reported_together(node):
    # A bad port used to stop the report before the machine was looked at.
    result = node.run(K3_PORT="http", K3_MODEL="/models/nowhere", K3_GPU_COUNT="4")
    assert_rejected(
        node, result, "K3_PORT (--port) is 'http'", "does not exist", "needs 8 GPUs"
    )


def test_model_in_a_directory_that_cannot_be_entered(node, locked_dir):
    env = node.env(K3_MODEL=str(locked_dir / "Kimi-K3"), K3_GPU_COUNT="8")
    code, out, err = run_unprivileged(env)
    assert_refused_cleanly(code, out, err, "K3_MODEL (--model)", "Permission denied")


def test_api_key_file_in_a_directory_that_cannot_be_entered(node, locked_dir):
    env = node.env(K3_API_KEY_FILE=str(locked_dir / "api-key"), K3_GPU_COUNT="8")
    code, out, err = run_unprivileged(env)
    assert_refused_cleanly(
        code, out, err, "K3_API_KEY_FILE (--api-key-file)", "Permission denied"
    )


LONG_NAME = "x" * 300


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("K3_MODEL", f"{{root}}/{LONG_NAME}"),
        ("K3_MODEL", LONG_NAME),
        ("K3_API_KEY_FILE", f"{{root}}/{LONG_NAME}"),
        ("K3_DRI_DIR", f"{{root}}/{LONG_NAME}"),
    ],
)
def test_overlong_path_component_is_reported(node, capsys, variable, value):
    # Under a directory that exists, so the name's length is what fails.
    value = value.format(root=node.root)
    code, out, err = run_in_process(capsys, node.env(**{variable: value}))
    assert_refused_cleanly(code, out, err, variable, "File name too long")


@pytest.mark.parametrize(
    "variable", ["K3_PORT", "K3_MAX_MODEL_LEN", "K3_NUM_NODES", "K3_GPU_COUNT"]
)
def test_number_of_more_than_4300_digits_is_out_of_range(node, capsys, variable):
    code, out, err = run_in_process(capsys, node.env(**{variable: "9" * 5000}))
    assert_refused_cleanly(code, out, err, variable, "not a whole number")
    # The value is shown shortened, not 5,000 digits.
    assert len(err) < 2000


def test_api_server_count_of_more_than_4300_digits(node, capsys):
    env = node.env(K3_EXTRA_ARGS="--api-server-count " + "1" * 5000)
    code, out, err = run_in_process(capsys, env)
    assert code == 0, err
    assert "--disable-log-stats" not in out


def test_nul_byte_in_api_key_file_is_refused_in_dry_run(node):
    node.key_file.write_bytes(API_KEY.encode() + b"\0x\n")
    result = node.run("--dry-run", K3_API_KEY_FILE=str(node.key_file))
    assert_rejected(node, result, "K3_API_KEY_FILE", "control character")
    assert API_KEY not in result.stdout + result.stderr


def test_nul_byte_in_a_setting_is_refused(node, capsys):
    code, out, err = run_in_process(capsys, node.env(K3_HOST="0.0.0.0\0x"))
    assert_refused_cleanly(code, out, err, "K3_HOST (--host)", "NUL")


def test_tilde_in_model_is_expanded_before_vllm_sees_it(node):
    result = node.run("--dry-run", K3_MODEL="~/Kimi-K3", HOME=str(node.root))
    assert result.returncode == 0, result.stderr
    assert f" serve {node.model} \\\n" in result.stdout
    assert "~" not in result.stdout


def test_tilde_of_an_unknown_user_is_reported(node, capsys):
    code, out, err = run_in_process(
        capsys, node.env(K3_MODEL="~no-such-user-k3/Kimi-K3")
    )
    assert_refused_cleanly(code, out, err, "K3_MODEL (--model)", "no-such-user-k3")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("K3_MODEL", "   "),
        ("K3_FEATURES", " , "),
        ("K3_PROFILE", "\t"),
        ("K3_VLLM_COMMAND", "  "),
        ("K3_EXTRA_ARGS", " \n "),
        ("K3_PORT", " "),
    ],
)
def test_whitespace_only_value_is_refused(node, capsys, variable, value):
    code, out, err = run_in_process(capsys, node.env(**{variable: value}))
    assert_refused_cleanly(code, out, err, variable)


def this_node_address() -> str:
    """A non-loopback address of this machine (the one its default route
    leaves from; a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))
        return probe.getsockname()[0]


def test_a_worker_pointing_at_itself_as_node_0_is_refused(node):
    own = this_node_address()
    result = node.run("--dry-run", **{**NODE1, "K3_MASTER_ADDR": own})
    assert_rejected(node, result, f"is '{own}', an address of this node")
    assert "this is node 1, not node 0" in result.stderr


def test_addresses_that_fit_pass(node):
    """The interface checks accept what NCCL accepts: prefixes, exact names
    and exclusions of interfaces this node has."""
    result = node.run(
        "--dry-run",
        **{
            **NODE1,
            "VLLM_HOST_IP": this_node_address(),
            "NCCL_SOCKET_IFNAME": "=lo,^docker",
            "GLOO_SOCKET_IFNAME": "l",
        },
    )
    assert result.returncode == 0, result.stderr


# Settings a profile has no use for would be silently ignored.
UNUSED_SETTINGS = {
    "node rank on tp8": ({"K3_NODE_RANK": "0"}, "K3_NODE_RANK (--node-rank)"),
    "node rank on cpu-dev": (
        {"K3_PROFILE": "cpu-dev", "K3_NODE_RANK": "1"},
        "K3_NODE_RANK (--node-rank)",
    ),
    "master address on tep8": (
        {"K3_PROFILE": "tep8", "K3_MASTER_ADDR": "10.0.0.1"},
        "K3_MASTER_ADDR (--master-addr)",
    ),
    "master port on tp8": ({"K3_MASTER_PORT": "29501"}, "K3_MASTER_PORT"),
    "one node on tp8": ({"K3_NUM_NODES": "1"}, "K3_NUM_NODES (--num-nodes)"),
}


@pytest.mark.parametrize("case", sorted(UNUSED_SETTINGS))
def test_setting_the_profile_does_not_use_is_refused(node, capsys, case):
    settings, fragment = UNUSED_SETTINGS[case]
    code, out, err = run_in_process(capsys, node.env(K3_GPU_COUNT="16", **settings))
    assert_refused_cleanly(code, out, err, fragment)


@pytest.mark.parametrize(
    ("extra_args", "owner"),
    [
        (["--api-ke", API_KEY], "K3_API_KEY_FILE"),
        (["--tensor_parallel=2"], "K3_PROFILE"),
        (["--head"], "K3_NODE_RANK"),
        (["-tp", "2"], "K3_PROFILE"),
    ],
)
def test_without_vllm_owned_flags_are_refused_by_name_and_prefix(
    monkeypatch, extra_args, owner
):
    # Where vLLM cannot be imported, the launcher falls back to the names
    # and prefixes of the flags it owns.
    from k3rocm.launcher import owned_flags

    monkeypatch.setattr(owned_flags, "_vllm_parser", lambda: None)
    problems = owned_flags.owned_flag_problems(extra_args)
    assert any(f"set {owner} (" in problem for problem in problems), problems
    assert not any(API_KEY in problem for problem in problems)
    assert owned_flags.owned_flag_problems(["--enable-prefix-caching"]) == []
