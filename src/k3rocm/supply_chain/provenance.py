"""What an image holds, read without running it: its labels, its
/etc/k3rocm/versions.json and its SBOM (k3rocm.supply_chain.sbom), taken
out of a created, never started container. ``scripts/build-image --inspect
REF`` prints it for a local image or a pushed one (pulled first, by tag or by digest).
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile

from k3rocm.supply_chain.sbom import summary


class InspectError(Exception):
    """The image cannot be read; the message says why."""


def _docker(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args], capture_output=True, timeout=timeout, check=False
    )


def _image(ref: str) -> dict:
    found = _docker("image", "inspect", ref)
    if found.returncode != 0:
        pulled = _docker("pull", ref, timeout=3600)
        if pulled.returncode != 0:
            raise InspectError(
                f"{ref} is neither a local image nor one the registry gives: "
                + pulled.stderr.decode(errors="replace").strip()[-500:]
            )
        found = _docker("image", "inspect", ref)
    return json.loads(found.stdout)[0]


def _file_of(ref: str, path: str) -> bytes:
    created = _docker("create", ref)
    if created.returncode != 0:
        raise InspectError(created.stderr.decode(errors="replace").strip())
    container = created.stdout.decode().strip()
    try:
        copied = _docker("cp", f"{container}:{path}", "-")
        if copied.returncode != 0:
            raise InspectError(
                f"{ref} has no {path}: is it a kimi-k3-rocm image? "
                + copied.stderr.decode(errors="replace").strip()
            )
        with tarfile.open(fileobj=io.BytesIO(copied.stdout)) as archive:
            member = archive.next()
            extracted = archive.extractfile(member) if member else None
            if extracted is None:
                raise InspectError(f"{path} in {ref} is not a file")
            return extracted.read()
    finally:
        _docker("rm", container)


def describe(ref: str) -> str:
    image = _image(ref)
    labels = image.get("Config", {}).get("Labels") or {}
    versions = json.loads(
        _file_of(ref, labels.get("k3rocm.versions", "/etc/k3rocm/versions.json"))
    )
    sbom = json.loads(
        _file_of(ref, labels.get("k3rocm.sbom", "/etc/k3rocm/sbom.cdx.json"))
    )
    digests = image.get("RepoDigests") or ["none (never pushed)"]
    lines = [
        f"image:        {ref}",
        f"digests:      {', '.join(digests)}",
        f"tag:          {versions.get('image_tag')}",
        f"vLLM:         {versions.get('vllm')}",
        f"ROCm:         {versions.get('rocm')}",
        f"Python:       {versions.get('python')}",
        f"patch series: {versions.get('patch_series')}",
        f"base image:   {versions.get('base_image')}"
        + (
            f" ({versions['base_image_digest']})"
            if versions.get("base_image_digest")
            else " (by tag)"
        ),
        f"source:       {labels.get('org.opencontainers.image.source')} at "
        f"{versions.get('git_revision')}",
        f"SBOM:         {labels.get('k3rocm.sbom')}: {summary(sbom)}",
    ]
    for component in sbom.get("components", []):
        for number, patch in enumerate(
            component.get("pedigree", {}).get("patches", []), 1
        ):
            resolves = ", ".join(
                item.get("name", "") for item in patch.get("resolves", [])
            )
            name = patch.get("diff", {}).get("url", f"patch {number}")
            lines.append(
                f"  {name} ({component['name']} {component['version']}): "
                f"{patch['type']}" + (f" of {resolves}" if resolves else "")
            )
    return "\n".join(lines)
