"""Each stage in a thread under its timeout; a stage that overran leaves the
process without waiting for its thread."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from k3rocm.common.smoke_report import CheckName, Stage
from k3rocm.common.states import Verdict


def run_with_timeout(
    run: Callable[[Stage], None], stage: Stage, timeout: float
) -> bool:
    """Run a stage in a thread; False if it did not finish in time (its
    thread is then abandoned: the caller exits the process)."""
    started = time.monotonic()

    def body() -> None:
        try:
            run(stage)
        except Exception as err:  # any crash is a failed check, not a hang
            stage.add(CheckName.CRASHED, Verdict.FAIL, f"{type(err).__name__}: {err}")

    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    worker.join(timeout)
    stage.seconds = round(time.monotonic() - started, 2)
    if worker.is_alive():
        stage.add(
            CheckName.TIMEOUT, Verdict.FAIL, f"did not finish within {timeout:.0f} s"
        )
        stage.status = Verdict.FAIL
        return False
    stage.status = Verdict.FAIL if stage.failed else Verdict.PASS
    return True


def exit_code(code: int, in_time: bool) -> int:
    """A stage thread that overran is stuck, maybe in a device call that
    would keep the interpreter from exiting: leave without waiting for it."""
    if not in_time:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
