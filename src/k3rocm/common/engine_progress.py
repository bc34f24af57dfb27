"""What the engine's progress is measured by, shared by its writer (the
metrics plugin, inside vLLM) and its judges and readers (the watchdog, the
health check, the monitoring generators), which must not import vLLM: the
names of the metrics the plugin exports, and the stall mark."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from k3rocm.common.run_files import STALL_MARK

# The `state` label of the engine's requests gauge: written by the plugin,
# read by the watchdog.
REQUEST_RUNNING, REQUEST_WAITING = "running", "waiting"


def utc(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def write_stall_mark(directory: Path, since: float, now: float, pending: str) -> None:
    """Atomically: a half-written mark still reads as a stall."""
    tmp = directory / f".{STALL_MARK}.{os.getpid()}.tmp"
    tmp.write_text(
        json.dumps({"since": since, "detected": now, "pending": pending}) + "\n"
    )
    os.replace(tmp, directory / STALL_MARK)


def read_stall_mark(directory: Path) -> str | None:
    """The health check's line for a stall mark; None without one."""
    try:
        text = (directory / STALL_MARK).read_bytes()[:4096].decode(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"unhealthy: the engine stalled (mark unreadable: {err})"
    try:
        mark = json.loads(text)
        since = utc(float(mark["since"]))
        pending = str(mark["pending"])[:200]
    except (ValueError, TypeError, KeyError, OverflowError, OSError):
        return "unhealthy: the engine stalled (mark malformed)"
    return f"unhealthy: the engine stalled since {since} with {pending}"
