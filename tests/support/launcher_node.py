"""A scratch node for the launcher run for real (scripts/serve-kimi-k3):
render devices, a checkpoint directory, a private API key file and a
recording stand-in for `vllm serve`; and the launcher's main run in process
(a dry run) or as a user who cannot enter a locked directory."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WRAPPER = REPO / "scripts" / "serve-kimi-k3"
API_KEY = "k3-test-key-5f0c2a9e"
# Node 1 of tep16, its addresses fine until a case changes one.
NODE1 = {"K3_PROFILE": "tep16", "K3_NODE_RANK": "1", "K3_MASTER_ADDR": "10.1.2.3"}

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


def assert_rejected(node: Node, result, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    assert "nothing started" in result.stderr
    assert result.stdout == ""
    assert not node.started(), "vLLM was started despite invalid settings"


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
