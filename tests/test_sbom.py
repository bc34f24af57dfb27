"""The image's SBOM (k3rocm.supply_chain.sbom): CycloneDX 1.6 that
cyclonedx-python-lib's own schema accepts, the patched vLLM with each patch
of the series in its pedigree, OS packages from dpkg, and the pins it must
list. The SBOM inside
the built image is checked in test_registry_docker.py."""

from __future__ import annotations

import json
import shutil

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from vllm_trees import REPO

from k3rocm.series import Series
from k3rocm.supply_chain import sbom

SERIES = Series(REPO / "patches")
PINS = REPO / "docker" / "requirements.txt"


def validation_error(document: dict):
    return JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(document))


def patched_component(document: dict) -> dict:
    [component] = [c for c in document["components"] if "pedigree" in c]
    return component


def test_the_sbom_of_this_environment_is_valid_cyclonedx_1_6():
    document = sbom.bom(SERIES, "0.27.1-rocm7.2-test")
    assert validation_error(document) is None
    assert document["metadata"]["component"]["version"] == "0.27.1-rocm7.2-test"
    purls = [c["purl"] for c in document["components"]]
    assert any(p.startswith("pkg:pypi/torch@2.13.0") for p in purls)
    assert any(p.startswith("pkg:deb/") for p in purls)  # this machine's dpkg


def test_a_broken_sbom_is_caught_by_the_schema():
    document = sbom.bom(SERIES, None)
    document["components"][0]["type"] = "not-a-type"
    assert validation_error(document) is not None


def test_the_patched_vllm_carries_every_patch_of_the_series_in_order():
    vllm = patched_component(sbom.bom(SERIES, None))
    assert vllm["version"].startswith(SERIES.vllm_version)
    patches = vllm["pedigree"]["patches"]
    assert [p["diff"]["url"] for p in patches] == [
        f"patches/{path.name}" for path in SERIES.patches
    ]
    assert [p["diff"]["text"]["content"] for p in patches] == [
        path.read_text() for path in SERIES.patches
    ]
    assert {"name": "k3rocm:patch-series", "value": SERIES.series_id} in vllm[
        "properties"
    ]


def test_patches_with_an_upstream_pull_request_are_backports(tmp_path):
    """[upstream] in series.toml types a patch backport, with its pull request
    and state; the rest are the distribution's own (unofficial)."""
    copy = tmp_path / "patches"
    shutil.copytree(REPO / "patches", copy)
    first, *rest = SERIES.patches
    manifest = (copy / "series.toml").read_text().split("\n[upstream.", 1)[0]
    manifest += (
        f'\n[upstream."{first.name}"]\npull_request = "vllm-project/vllm#1"\n'
        'state = "merged in 9.9.9"\nurl = "https://github.com/vllm-project/vllm/pull/1"\n'
    )
    (copy / "series.toml").write_text(manifest)
    document = sbom.bom(Series(copy), None)
    assert validation_error(document) is None
    patches = patched_component(document)["pedigree"]["patches"]
    assert patches[0]["type"] == "backport"
    assert patches[0]["resolves"][0]["name"] == "vllm-project/vllm#1 (merged in 9.9.9)"
    assert patches[0]["resolves"][0]["references"] == [
        "https://github.com/vllm-project/vllm/pull/1"
    ]
    assert [p["type"] for p in patches[1:]] == ["unofficial"] * len(rest)


def test_the_shipped_series_backports_the_upstream_change():
    patches = patched_component(sbom.bom(SERIES, None))["pedigree"]["patches"]
    kinds = {p["diff"]["url"]: p["type"] for p in patches}
    backports = sorted(url for url, kind in kinds.items() if kind == "backport")
    assert backports == [
        "patches/0002-kimi-k3-rocm-kda-backend.patch",
        "patches/0003-amd-kda-chunk-metadata-args.patch",
        "patches/0004-kimi-kda-layer-rocm-wiring.patch",
    ]
    for patch in patches:
        for resolved in patch.get("resolves", []):
            assert resolved["name"] == (
                "vllm-project/vllm#51862 (merged, released in vLLM 0.28.0)"
            )


def test_installed_os_packages_from_dpkg(tmp_path):
    status = tmp_path / "status"
    status.write_text(
        "Package: libnuma1\nStatus: install ok installed\nArchitecture: amd64\n"
        "Version: 2.0.16-1\nDescription: x\n multi-line\n\n"
        "Package: removed\nStatus: deinstall ok config-files\nVersion: 1\n\n"
    )
    release = tmp_path / "os-release"
    release.write_text('ID=ubuntu\nVERSION_ID="22.04"\n')
    assert sbom.deb_components(status, release) == [
        {
            "type": "library",
            "bom-ref": "deb:libnuma1@2.0.16-1:amd64",
            "name": "libnuma1",
            "version": "2.0.16-1",
            "purl": "pkg:deb/ubuntu/libnuma1@2.0.16-1?arch=amd64",
        }
    ]


def test_every_pin_of_the_image_must_be_listed():
    pins = sbom.pinned(PINS)
    assert set(pins) == {"supervisor", "dumb-init", "prometheus-client", "py-spy"}
    document = sbom.bom(SERIES, None)
    assert sbom.missing_pins(document, pins) == []
    document["components"] = [
        c for c in document["components"] if c["name"] != "supervisor"
    ]
    assert sbom.missing_pins(document, pins) == ["supervisor==4.3.0"]


def test_the_build_step_refuses_an_sbom_without_a_pin(tmp_path, capsys):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("not-installed-anywhere==1.0 \\\n    --hash=sha256:00\n")
    assert (
        sbom.main(["--out", str(tmp_path / "s.json"), "--require", str(requirements)])
        == 1
    )
    assert "not-installed-anywhere==1.0" in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("text", ["x==1", "# comment\n", "-r other.txt\n"])
def test_pins_read_only_pins(tmp_path, text):
    requirements = tmp_path / "r.txt"
    requirements.write_text(text)
    assert sbom.pinned(requirements) == ({"x": "1"} if text == "x==1" else {})
