"""The launcher run for real through scripts/serve-kimi-k3 with valid
settings: it execs the vLLM command in its own process (signals land on
vLLM), with the API key only in its environment; the wrapper is shellcheck
clean, and the README and --help name every setting, profile and feature."""

from __future__ import annotations

import shutil
import signal
import stat
import subprocess
import time

import pytest
from support.launcher_node import (
    API_KEY,
    REPO,
    WRAPPER,
)


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
