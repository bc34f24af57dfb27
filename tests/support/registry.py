"""A real container registry for the tests: Debian's docker-registry (the
CNCF distribution registry, installed by scripts/test) on a loopback port,
which the Docker engine talks to over plain HTTP as it does for any
127.0.0.0/8 registry. It stops, and its storage goes, whatever the tests did.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from support.docker_images import ONE_BUILD_AT_A_TIME
from support.processes import running
from support.vllm_trees import REPO, SERIES
from support.workers import free_port, worker_lock

# The manifest type Docker 20.10 pushes; the registry's digest of it is the
# one `docker push` reports and K3_IMAGE pins.
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
PUSHED = re.compile(r"^build-image: pushed (\S+):(\S+)@(sha256:[0-9a-f]{64})$", re.M)


@contextlib.contextmanager
def running_registry(directory: Path) -> Iterator[str]:
    """host:port of a registry storing under directory."""
    binary = shutil.which("docker-registry")
    assert binary, "docker-registry is missing (scripts/test installs it)"
    port = free_port()
    config = directory / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {directory / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n"
    )
    with running([binary, "serve", str(config)], directory / "registry.log"):
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{address}/v2/", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, (
                    directory / "registry.log"
                ).read_text()
                time.sleep(0.2)
        try:
            yield address
        finally:
            shutil.rmtree(directory / "data", ignore_errors=True)


def _registry_api(address: str, name: str, kind: str, reference: str,
                  method: str = "GET") -> urllib.request.Request:  # fmt: skip
    """A request to the registry's API for one of name's manifests or blobs
    (kind), manifests asked for in the type Docker pushes."""
    headers = {"Accept": MANIFEST_V2} if kind == "manifests" else {}
    return urllib.request.Request(
        f"http://{address}/v2/{name}/{kind}/{reference}", method=method, headers=headers
    )


def registry_manifest(address: str, name: str, reference: str) -> dict:
    """The manifest the registry serves for name:reference (a tag or digest)."""
    request = _registry_api(address, name, "manifests", reference)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def registry_blob(address: str, name: str, digest: str) -> bytes:
    """A blob the registry holds."""
    request = _registry_api(address, name, "blobs", digest)
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def registry_blob_size(address: str, name: str, digest: str) -> int:
    """The size the registry serves a blob at, without fetching it."""
    request = _registry_api(address, name, "blobs", digest, method="HEAD")
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.headers["Content-Length"])


def registry_digest(address: str, name: str, tag: str) -> str | None:
    """The registry's own digest of name:tag (its manifest API), or None."""
    request = _registry_api(address, name, "manifests", tag, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.headers["Docker-Content-Digest"]
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise


@worker_lock(ONE_BUILD_AT_A_TIME)
def build_image_push(base: str, repo: str) -> subprocess.CompletedProcess:
    """scripts/build-image --push, as an operator runs it (the installed
    vLLM's line)."""
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build-image"), "--base-image", base,
         "--repo", repo, "--line", SERIES.vllm_version, "--push"],
        capture_output=True,
        text=True,
        timeout=1800,
    )  # fmt: skip
