"""The launcher run for real through scripts/serve-kimi-k3: every invalid
setting exits 2 with a message that says what is wrong and how to fix it and
starts nothing (test_launcher_start.py: valid settings; test_launcher_probes.py:
issue 11's probes)."""

from __future__ import annotations

import shutil

import pytest
from support.launcher_node import (
    API_KEY,
    NODE1,
    assert_refused_cleanly,
    assert_rejected,
    run_unprivileged,
)


def _on_node1(variable: str, value: str, *fragments: str):
    return {**NODE1, variable: value}, list(fragments)


# Each case: settings, then fragments the message must contain (what is
# wrong, then how to fix it).
INVALID = {
    "served model name with a newline": (
        {"K3_SERVED_MODEL_NAME": "kimi\nk3"},
        ["K3_SERVED_MODEL_NAME (--served-model-name)", "holds a control character"],
    ),
    "unknown profile": (
        {"K3_PROFILE": "tp9"},
        ["K3_PROFILE (--profile) is 'tp9'", "use one of: tp8, tep8, tep16, dep16"],
    ),
    "unknown feature": (
        {"K3_FEATURES": "reasoning,vision"},
        ["unknown feature(s) vision", "reasoning, tools, dspark"],
    ),
    "text-only with encoder data-parallel": (
        {"K3_FEATURES": "text-only,encoder-dp"},
        ["both encoder-dp and text-only", "no vision encoder", "drop one"],
    ),
    "features on cpu-dev": (
        {"K3_PROFILE": "cpu-dev", "K3_FEATURES": "tools"},
        ["without Kimi-K3 features", "K3_EXTRA_ARGS"],
    ),
    "model path missing": (
        {"K3_MODEL": "/models/nowhere/Kimi-K3"},
        ["'/models/nowhere/Kimi-K3', which does not exist", "mount the checkpoint"],
    ),
    "relative model path missing": (
        {"K3_MODEL": "./Kimi-K3-local"},
        ["does not exist", "point the setting at its directory"],
    ),
    "neither a path nor a model id": (
        {"K3_MODEL": "kimi k3 please"},
        ["not a Hugging Face model id", "moonshotai/Kimi-K3"],
    ),
    "too few GPUs counted": (
        {"K3_PROFILE": "tep8", "K3_DRI_DIR": "/nonexistent-dri"},
        ["needs 8 GPUs on this node", "0 are visible (renderD* devices in"],
    ),
    "too few GPUs by override": (
        {"K3_GPU_COUNT": "7"},
        ["needs 8 GPUs", "7 are visible (set by K3_GPU_COUNT", "pick a profile"],
    ),
    "port not a number": (
        {"K3_PORT": "http"},
        ["K3_PORT (--port) is 'http', not a whole number from 1 to 65535"],
    ),
    "port out of range": ({"K3_PORT": "65536"}, ["is '65536', not a whole number"]),
    "port zero": ({"K3_PORT": "0"}, ["K3_PORT (--port) is '0'"]),
    "master port out of range": (
        {"K3_MASTER_PORT": "70000"},
        ["K3_MASTER_PORT (--master-port) is '70000'", "e.g. --master-port 29501"],
    ),
    "API key file missing": (
        {"K3_API_KEY_FILE": "/run/secrets/none"},
        ["'/run/secrets/none', which is not an existing file", "chmod 600"],
    ),
    "master address on loopback": _on_node1(
        "K3_MASTER_ADDR",
        "127.0.0.1",
        "K3_MASTER_ADDR (--master-addr) is '127.0.0.1', a loopback or wildcard",
    ),
    "master address that does not resolve": _on_node1(
        "K3_MASTER_ADDR",
        "node0.invalid",
        "'node0.invalid', which does not resolve",
        "node 0's address",
    ),
    "host address not of this node": _on_node1(
        "VLLM_HOST_IP",
        "192.0.2.77",
        "VLLM_HOST_IP is '192.0.2.77', which is not an address of this node",
    ),
    "host address on loopback": _on_node1(
        "VLLM_HOST_IP",
        "127.0.0.1",
        "VLLM_HOST_IP is '127.0.0.1', a loopback or wildcard address",
    ),
    "host address not an address": _on_node1(
        "VLLM_HOST_IP", "node1", "VLLM_HOST_IP is 'node1', which is not an IP address"
    ),
    "socket interface that does not exist": _on_node1(
        "NCCL_SOCKET_IFNAME",
        "^docker,ibzz9",
        "NCCL_SOCKET_IFNAME is '^docker,ibzz9'",
        "no interface starting with 'ibzz9'",
    ),
    "exact socket interface that does not exist": _on_node1(
        "GLOO_SOCKET_IFNAME",
        "=l",
        "GLOO_SOCKET_IFNAME is '=l'",
        "no interface named 'l'",
    ),
    "multi-node without master address": (
        {"K3_PROFILE": "tep16", "K3_NODE_RANK": "1"},
        ["K3_MASTER_ADDR (--master-addr) is not set", "address of node 0"],
    ),
    "multi-node without node rank": (
        {"K3_PROFILE": "dep16", "K3_MASTER_ADDR": "10.0.0.1"},
        ["K3_NODE_RANK (--node-rank) is not set", "set it to 0 on the node"],
    ),
    "node rank out of range": (
        {"K3_PROFILE": "dep16", "K3_MASTER_ADDR": "10.0.0.1", "K3_NODE_RANK": "2"},
        ["K3_NODE_RANK (--node-rank) is 2", "set it to 0 to 1"],
    ),
    "node count not dividing the GPUs": (
        {"K3_PROFILE": "tep16", "K3_NUM_NODES": "3"},
        ["K3_NUM_NODES (--num-nodes) is 3", "divisor of 16"],
    ),
    "single-node profile on two nodes": (
        {"K3_NUM_NODES": "2"},
        ["profile tp8 runs on one node", "tep16, dep16"],
    ),
    "API key in extra arguments": (
        {"K3_EXTRA_ARGS": "--api-key=secret"},
        ["passes --api-key", "K3_API_KEY_FILE"],
    ),
    "managed flag in extra arguments": (
        {"K3_EXTRA_ARGS": "--enable-prefix-caching --tensor_parallel_size 16"},
        ["passes --tensor-parallel-size", "set K3_PROFILE (--profile) instead"],
    ),
    "unbalanced quote in extra arguments": (
        {"K3_EXTRA_ARGS": "--chat-template 'x"},
        ["cannot be split like a shell command line", "balance its quotes"],
    ),
    "ROCm-required variable overridden": (
        {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"},
        ["VLLM_USE_BREAKABLE_CUDAGRAPH is '1'", "requires", "unset it"],
    ),
    "dry run not a yes or no": (
        {"K3_DRY_RUN": "maybe"},
        ["K3_DRY_RUN (--dry-run) is 'maybe'", "set it to 1 or 0"],
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_setting_is_refused(node, case):
    settings, fragments = INVALID[case]
    assert_rejected(node, node.run(**settings), *fragments)


def test_invalid_settings_are_refused_in_dry_run_too(node):
    result = node.run("--dry-run", K3_PROFILE="tep16")
    assert_rejected(node, result, "K3_NODE_RANK", "K3_MASTER_ADDR")


def test_every_problem_is_reported_at_once(node):
    result = node.run(K3_PROFILE="tep16", K3_FEATURES="tools,sparkles", K3_PORT="x")
    assert_rejected(
        node, result, "sparkles", "K3_PORT", "K3_NODE_RANK", "K3_MASTER_ADDR"
    )


def test_command_line_option_wins_over_variable(node):
    result = node.run("--profile", "tp16", K3_PROFILE="tp8")
    assert_rejected(node, result, "is 'tp16', which is not a profile")
    ok = node.run("--dry-run", "--profile", "tp8", K3_PROFILE="tp16")
    assert ok.returncode == 0, ok.stderr


def test_unknown_option_is_a_usage_error(node):
    result = node.run("--tensor-parallel-size", "8")
    assert result.returncode == 2
    assert "unrecognized arguments" in result.stderr
    assert not node.started()


def test_stray_argument_without_separator_is_a_usage_error(node):
    result = node.run(str(node.model))
    assert result.returncode == 2
    assert "put vLLM arguments after `--`" in result.stderr
    assert not node.started()


def test_model_directory_without_config_json(node):
    (node.model / "config.json").unlink()
    result = node.run()
    assert_rejected(node, result, "which has no config.json", "top directory")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{", "is not valid JSON"),
        (b"\xff\xfe", "is not valid JSON"),
        (b"[1, 2]", "holds a JSON list, not an object"),
        (b"", "is not valid JSON"),
    ],
)
def test_model_config_json_that_vllm_cannot_parse(node, content, says):
    (node.model / "config.json").write_bytes(content)
    result = node.run()
    assert_rejected(node, result, "config.json", says, "restore the checkpoint's")


def test_model_config_json_this_user_cannot_read(node, locked_dir):
    model = locked_dir.parent / "Kimi-K3"
    model.mkdir(mode=0o755)
    (model / "config.json").write_text("{}")
    (model / "config.json").chmod(0o600)
    env = node.env(K3_MODEL=str(model), K3_GPU_COUNT="8")
    code, out, err = run_unprivileged(env)
    assert_refused_cleanly(
        code, out, err, "config.json", "cannot be read (Permission denied)"
    )


@pytest.mark.parametrize("mode", [0o644, 0o604])
def test_world_readable_api_key_file(node, mode):
    node.key_file.chmod(mode)
    result = node.run(K3_API_KEY_FILE=str(node.key_file))
    assert_rejected(node, result, "is readable by every user", "chmod o-rwx")
    assert API_KEY not in result.stderr


def test_empty_api_key_file(node):
    node.key_file.write_text("\n")
    result = node.run(K3_API_KEY_FILE=str(node.key_file))
    assert_rejected(node, result, "must hold exactly one key")


def test_model_id_is_accepted_without_a_local_directory(node):
    result = node.run("--dry-run", K3_MODEL="moonshotai/Kimi-K3")
    assert result.returncode == 0, result.stderr
    assert " serve moonshotai/Kimi-K3 \\\n" in result.stdout


def test_cpu_dev_needs_no_gpus(node):
    shutil.rmtree(node.dri)
    result = node.run(
        "--dry-run", K3_PROFILE="cpu-dev", VLLM_USE_BREAKABLE_CUDAGRAPH="1"
    )
    assert result.returncode == 0, result.stderr
    assert "export" not in result.stdout


def test_multi_node_gpu_count_is_per_node(node):
    for extra in ("renderD136", "renderD137"):
        (node.dri / extra).touch()
    two_nodes = {
        "K3_PROFILE": "tep16",
        "K3_NODE_RANK": "1",
        "K3_MASTER_ADDR": "10.1.2.3",
    }
    assert node.run("--dry-run", **two_nodes).returncode == 0
    result = node.run(**two_nodes, K3_NUM_NODES="4", K3_GPU_COUNT="3")
    assert_rejected(node, result, "needs 4 GPUs on this node", "16 GPUs over 4 node(s)")
