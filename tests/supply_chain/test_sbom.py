"""The image's SBOM (k3rocm.supply_chain.sbom): CycloneDX 1.6 that
cyclonedx-python-lib's own schema accepts, the patched vLLM with each patch
of the series in its pedigree (backports and their pull requests from
patches/0.27.1/upstream-triage.toml), OS packages from dpkg, and the pins it must
list. The SBOM inside
the built image is checked in test_registry_docker.py."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from support.vllm_trees import REPO

from k3rocm.patchtool.lines import default_line_dir
from k3rocm.patchtool.series import Series
from k3rocm.patchtool.triage_file import TriageError
from k3rocm.supply_chain import sbom

SERIES = Series(default_line_dir(REPO / "patches"))
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
        f"patches/{SERIES.directory.name}/{path.name}" for path in SERIES.patches
    ]
    assert [p["diff"]["text"]["content"] for p in patches] == [
        path.read_text() for path in SERIES.patches
    ]
    assert {"name": "k3rocm:patch-series", "value": SERIES.series_id} in vllm[
        "properties"
    ]


def test_patches_a_backported_triage_entry_names_are_backports(tmp_path):
    """patches/0.27.1/upstream-triage.toml types a patch backport, with every pull
    request whose backported entry names it; the rest are the distribution's
    own (unofficial)."""
    copy = tmp_path / SERIES.directory.name
    shutil.copytree(SERIES.directory, copy)
    first, second, *rest = SERIES.patches
    triage = (copy / "upstream-triage.toml").read_text()
    # Keep the file's head (releases, watch), replace its entries by two
    # backports sharing the first patch.
    triage = triage.split("\n[[entry]]", 1)[0]
    for number, patches in (("1", [first.name, second.name]), ("2", [first.name])):
        triage += (
            f'\n[[entry]]\npull_request = "vllm-project/vllm#{number}"\n'
            f'title = "t{number}"\nrelease = "0.29.0"\nkind = "fix"\n'
            f'decision = "backported"\npatches = {patches!r}\n'
            'changes = ["vllm/x.py::f"]\n'
        ).replace("'", '"')
    (copy / "upstream-triage.toml").write_text(triage)
    document = sbom.bom(Series(copy), None)
    assert validation_error(document) is None
    patches = patched_component(document)["pedigree"]["patches"]
    assert patches[0]["type"] == patches[1]["type"] == "backport"
    assert [r["name"] for r in patches[0]["resolves"]] == [
        "vllm-project/vllm#1 (merged, released in vLLM 0.29.0)",
        "vllm-project/vllm#2 (merged, released in vLLM 0.29.0)",
    ]
    assert patches[0]["resolves"][0]["type"] == "defect"
    assert patches[0]["resolves"][1]["references"] == [
        "https://github.com/vllm-project/vllm/pull/2"
    ]
    assert [r["id"] for r in patches[1]["resolves"]] == ["vllm-project/vllm#1"]
    assert [p["type"] for p in patches[2:]] == ["unofficial"] * len(rest)


def test_the_sbom_build_step_refuses_a_series_without_its_triage(tmp_path, capsys):
    copy = tmp_path / SERIES.directory.name
    shutil.copytree(SERIES.directory, copy)
    (copy / "upstream-triage.toml").unlink()
    with pytest.raises(TriageError, match="no triage file"):
        sbom.bom(Series(copy), None)


def test_the_shipped_series_backports_its_upstream_pull_requests():
    """0001-0004 carry #51862, 0004 and 0008 carry #50649 (the decode peel and
    the stable recompute_w_u stages), 0009 carries #50886 and #57098 (the
    Kimi-K3 reasoning parser), 0011 carries #51682 (the packed decode's
    state-index stride), 0013 carries #55404 (capture metadata without a
    device sync); 0005-0007, 0010 and 0012 are this distribution's own.
    The same origins as the patch headers say."""
    patches = patched_component(sbom.bom(SERIES, None))["pedigree"]["patches"]
    origins = {
        p["diff"]["url"].rsplit("/", 1)[-1]: [r["id"] for r in p["resolves"]]
        for p in patches
        if p["type"] == "backport"
    }
    expected = {
        "0001-gdn-chunk-metadata-hook.patch": ["vllm-project/vllm#51862"],
        "0002-kimi-k3-rocm-kda-backend.patch": ["vllm-project/vllm#51862"],
        "0003-amd-kda-chunk-metadata-args.patch": ["vllm-project/vllm#51862"],
        "0004-kimi-kda-layer-rocm-wiring.patch": [
            "vllm-project/vllm#51862",
            "vllm-project/vllm#50649",
        ],
        "0008-amd-kda-recompute-w-u-stable-stages.patch": ["vllm-project/vllm#50649"],
        "0011-amd-kda-packed-decode-state-stride.patch": ["vllm-project/vllm#51682"],
        "0013-gdn-capture-metadata-without-sync.patch": ["vllm-project/vllm#55404"],
        "0009-kimi-k3-reasoning-parser-fixes.patch": [
            "vllm-project/vllm#50886",
            "vllm-project/vllm#57098",
        ],
    }
    released = {
        "vllm-project/vllm#57098": "0.31.0",
        "vllm-project/vllm#55404": "0.30.0",
    }
    listed = {path.name for path in SERIES.patches}
    assert origins == {name: prs for name, prs in expected.items() if name in listed}
    assert "0008-amd-kda-recompute-w-u-stable-stages.patch" in listed
    for patch in patches:
        for resolved in patch.get("resolves", []):
            assert resolved["name"] == (
                f"{resolved['id']} (merged, released in vLLM "
                f"{released.get(resolved['id'], '0.28.0')})"
            )
    for path in SERIES.patches:
        header = " ".join(path.read_text().split("\n--- ", 1)[0].split())
        upstream = re.findall(r"vLLM PR #(\d+)", header.split("Upstream:", 1)[-1])
        carried = [pr.rpartition("#")[2] for pr in origins.get(path.name, [])]
        assert set(carried) <= set(upstream), (path.name, upstream, carried)
        if not carried:
            assert "Upstream: none" in header, path.name


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
