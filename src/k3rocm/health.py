"""The container's health check: healthy only when vLLM answers ``/health``
and the smoke test has written its ready mark.

    python -m k3rocm.health     exit 0 healthy, 1 not (one line says why)
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from k3rocm.contract import READY_MARK, run_dir


def check(directory: Path, port: str) -> tuple[bool, str]:
    ready = directory / READY_MARK
    if not ready.is_file():
        return False, f"not ready: no smoke ready mark at {ready} yet"
    url = f"http://127.0.0.1:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status = response.status
    except (OSError, urllib.error.URLError) as err:
        return False, f"vLLM {url} does not answer: {err}"
    if status != 200:
        return False, f"vLLM {url} answered {status}"
    return True, f"healthy: {url} 200, smoke {ready.read_text().strip()}"


def main() -> int:
    healthy, message = check(
        run_dir(),
        os.environ.get("K3_PORT", "8000"),
    )
    print(message)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
