"""The launcher run for real through scripts/serve-kimi-k3: every invalid
setting exits 2 with a message that says what is wrong and how to fix it and
starts nothing; valid settings exec the vLLM command in the launcher's own
process, with the API key only in its environment."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "scripts" / "serve-kimi-k3"
API_KEY = "k3-test-key-5f0c2a9e"

# Stands in for `vllm serve` (GPU profiles cannot start here): it records the
# argv, pid and environment it was started with, and with HOLD set waits for
# SIGTERM so the test can check where signals land.
RECORDER = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$RECORD_DIR/argv"
env -0 > "$RECORD_DIR/env"
echo $$ > "$RECORD_DIR/pid"
if [ -n "${HOLD:-}" ]; then
  trap 'echo TERM > "$RECORD_DIR/signal"; exit 0' TERM
  while true; do sleep 0.05; done
fi
"""


@dataclass
class Node:
    """A scratch node: eight GPU render devices, a checkpoint directory, a
    private API key file and the recording stand-in for vLLM."""

    root: Path
    dri: Path = field(init=False)
    model: Path = field(init=False)
    key_file: Path = field(init=False)
    record: Path = field(init=False)
    recorder: Path = field(init=False)

    def __post_init__(self):
        self.dri = self.root / "dri"
        self.dri.mkdir()
        for minor in range(128, 136):
            (self.dri / f"renderD{minor}").touch()
        (self.dri / "card0").touch()
        self.model = self.root / "Kimi-K3"
        self.model.mkdir()
        (self.model / "config.json").write_text("{}")
        self.key_file = self.root / "api-key"
        self.key_file.write_text(API_KEY + "\n")
        self.key_file.chmod(0o600)
        self.record = self.root / "record"
        self.record.mkdir()
        self.recorder = self.root / "fake-vllm"
        self.recorder.write_text(RECORDER)
        self.recorder.chmod(0o755)

    def env(self, **settings: str) -> dict[str, str]:
        return {
            "PATH": os.environ["PATH"],
            "K3_LAUNCHER_PYTHON": sys.executable,
            "RECORD_DIR": str(self.record),
            "K3_DRI_DIR": str(self.dri),
            "K3_MODEL": str(self.model),
            "K3_VLLM_COMMAND": f"{self.recorder} serve",
            **settings,
        }

    def run(self, *argv: str, **settings: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(WRAPPER), *argv],
            env=self.env(**settings),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def started(self) -> bool:
        return (self.record / "pid").exists()

    def recorded_argv(self) -> list[str]:
        return (self.record / "argv").read_text().split("\0")[:-1]

    def recorded_env(self) -> dict[str, str]:
        items = (self.record / "env").read_text().split("\0")
        return dict(item.split("=", 1) for item in items if item)


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path)


def assert_rejected(node: Node, result, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    assert "nothing started" in result.stderr
    assert result.stdout == ""
    assert not node.started(), "vLLM was started despite invalid settings"


# Node 1 of tep16, its addresses fine until a case changes one.
NODE1 = {"K3_PROFILE": "tep16", "K3_NODE_RANK": "1", "K3_MASTER_ADDR": "10.1.2.3"}


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


# -- valid settings start vLLM ------------------------------------------------


def test_valid_settings_exec_vllm_with_key_in_environment_only(node):
    settings = {"K3_API_KEY_FILE": str(node.key_file), "K3_FEATURES": "tools"}
    dry = node.run("--dry-run", **settings)
    assert dry.returncode == 0, dry.stderr
    assert API_KEY not in dry.stdout + dry.stderr
    assert "export VLLM_API_KEY='<hidden>'\n" in dry.stdout

    result = node.run(**settings)
    assert result.returncode == 0, result.stderr
    argv = node.recorded_argv()
    env = node.recorded_env()
    assert argv[:2] == ["serve", str(node.model)]
    assert "--enable-auto-tool-choice" in argv
    assert not any(API_KEY in arg for arg in argv)
    assert env["VLLM_API_KEY"] == API_KEY
    assert env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    assert env["VLLM_ROCM_USE_AITER"] == "1"
    # The dry run printed exactly what was executed.
    printed = dry.stdout.split("exec ", 1)[1].replace(" \\\n  ", " ").split()
    assert printed[1:] == argv


def test_vllm_replaces_the_launcher_and_gets_its_signals(node):
    env = node.env(HOLD="1")
    process = subprocess.Popen(
        [str(WRAPPER)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        pid_file = node.record / "pid"
        deadline = time.monotonic() + 30
        while not pid_file.exists() and process.poll() is None:
            assert time.monotonic() < deadline, "vLLM stand-in never started"
            time.sleep(0.05)
        assert process.poll() is None, process.stderr.read()
        # bash exec'd Python, which exec'd vLLM: one process throughout.
        assert int(pid_file.read_text()) == process.pid
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert (node.record / "signal").read_text() == "TERM\n"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_missing_vllm_command_is_reported(node):
    result = node.run(K3_VLLM_COMMAND="/nonexistent/vllm serve")
    assert result.returncode == 127
    assert "cannot start '/nonexistent/vllm'" in result.stderr
    assert "K3_VLLM_COMMAND" in result.stderr


def test_wrapper_is_shellcheck_clean():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    subprocess.run([shellcheck, str(WRAPPER)], check=True)
    assert WRAPPER.stat().st_mode & stat.S_IXUSR


def test_readme_documents_every_setting_profile_and_feature():
    from k3rocm.common.profiles import FEATURES, PROFILES
    from k3rocm.common.setting_table import LAUNCHER_SETTINGS as SETTINGS

    readme = (REPO / "README.md").read_text()
    section = readme.split("## Launching Kimi-K3", 1)[1].split("\n## ", 1)[0]
    for setting in SETTINGS:
        row = (
            f"| `{setting.env}` | `{setting.option}` | {setting.shown_default} | "
            f"{setting.meaning} |"
        )
        assert row in section, f"README's settings table lacks or misstates {row}"
    for name in (*PROFILES, *FEATURES):
        assert f"| `{name}`" in section, name


def test_help_lists_profiles_and_features(node):
    result = node.run("--help")
    assert result.returncode == 0
    for name in (
        "tp8",
        "tep16",
        "dep16",
        "cpu-dev",
        "cpu-dev-2node",
        "dspark",
        "fp8-kv",
    ):
        assert f"\n  {name} " in result.stdout, name
    assert not node.started()


# -- probes from issue 11: each exited with a traceback or got through -------


def run_in_process(capsys, env: dict[str, str]) -> tuple[int, str, str]:
    """The launcher's main in this process (a dry run, so nothing starts):
    vLLM's parser, once imported, serves every call."""
    from k3rocm.launcher.__main__ import main

    try:
        code = main(["--dry-run"], env)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused_cleanly(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    assert API_KEY not in out + err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


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


def run_unprivileged(env: dict[str, str]) -> tuple[int, str, str]:
    """main() as a user who cannot enter a mode-000 directory: as root (who
    can), in a forked child that becomes `nobody` first."""
    from k3rocm.launcher.__main__ import main

    def call() -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["--dry-run"], env)
            except SystemExit as exit_:
                code = exit_.code
            except BaseException:  # the child reports whatever happened
                traceback.print_exc()
                code = -1
        return code, out.getvalue(), err.getvalue()

    if os.geteuid() != 0:
        return call()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, run, send the result, vanish
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            payload = json.dumps(call()).encode()
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(payload)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        payload = pipe.read()
    os.waitpid(pid, 0)
    assert payload, "the unprivileged child reported nothing"
    code, out, err = json.loads(payload)
    return code, out, err


@pytest.fixture
def locked_dir():
    """A directory nobody but root may enter, under one everyone may."""
    parent = Path(tempfile.mkdtemp(prefix="k3-locked-"))
    parent.chmod(0o755)
    locked = parent / "locked"
    (locked / "Kimi-K3").mkdir(parents=True)
    (locked / "Kimi-K3" / "config.json").write_text("{}")
    (locked / "api-key").write_text(API_KEY + "\n")
    (locked / "api-key").chmod(0o600)
    locked.chmod(0)
    yield locked
    locked.chmod(0o700)
    shutil.rmtree(parent)


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
