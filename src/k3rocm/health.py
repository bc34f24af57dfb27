"""The container's health check: healthy only when vLLM answers ``/health``,
the smoke test has written its ready mark, and no drain for a stop is under
way.

    python -m k3rocm.health     exit 0 healthy, 1 not (one line says why)
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from k3rocm.contract import (
    DRAIN_MARK,
    READY_MARK,
    BadAddress,
    api_base_url,
    run_dir,
)


def check(directory: Path, base_url: str) -> tuple[bool, str]:
    if (directory / DRAIN_MARK).exists():
        return False, "not ready: draining for a stop, new requests are refused"
    ready = directory / READY_MARK
    if not ready.is_file():
        return False, f"not ready: no smoke ready mark at {ready} yet"
    url = f"{base_url}/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status = response.status
    except (OSError, urllib.error.URLError) as err:
        return False, f"vLLM {url} does not answer: {err}"
    if status != 200:
        return False, f"vLLM {url} answered {status}"
    verdict = ready.read_bytes()[:200].decode(errors="replace").strip()
    return True, f"healthy: {url} 200, smoke {verdict}"


def main() -> int:
    try:
        healthy, message = check(run_dir(), api_base_url(os.environ))
    except BadAddress as err:
        healthy, message = False, f"unhealthy: {err}"
    print(message)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
