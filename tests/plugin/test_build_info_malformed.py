"""Nothing in the patch marker, the ROCm version file or the image tag may
fail vLLM's start or break /metrics (issue 11): named probes, then properties
over random JSON and random bytes.

Every expected label comes from how the test built the input, never from the
plugin's own parsing."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.malformed_json import (
    DEEP,
    DEEPLY_NESTED,
    PROPERTY,
    json_lists,
    json_non_strings,
    json_values,
    often,
)
from support.vllm_trees import SERIES

from k3rocm.patchtool.series import MARKER_NAME
from k3rocm.plugin import build_info

TREE_FILES = {"vllm/a.py": b"patched a\n", "vllm/b.py": b"patched b\n"}
DIGESTS = {
    rel: hashlib.sha256(content).hexdigest() for rel, content in TREE_FILES.items()
}
INVALID = "invalid"


def fake_vllm_tree(root: Path) -> Path:
    """Just enough of a vLLM tree for the patch tool to classify it."""
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text(
        f"__version__ = {SERIES.vllm_version!r}\n"
    )
    for rel, content in TREE_FILES.items():
        (root / rel).write_bytes(content)
    return root


def marker_of(
    series_id: object, patched_files: object, series_sha256: object = SERIES.sha256
) -> dict:
    """A marker as the patch tool writes one, with the fields the tests vary."""
    return {
        "series_id": series_id,
        "series_revision": SERIES.revision,
        "series_sha256": series_sha256,
        "vllm_version": SERIES.vllm_version,
        "patches": [patch.name for patch in SERIES.patches],
        "patched_files": patched_files,
        "applied_at": "2026-01-01T00:00:00+00:00",
    }


def scraped_build_info(registry: CollectorRegistry) -> dict[str, str]:
    """The build-info labels as a scrape sees them."""
    exposition = generate_latest(registry).decode()
    [family] = [
        f
        for f in text_string_to_metric_families(exposition)
        if f.name == "k3rocm_build_info"
    ]
    [sample] = family.samples
    return sample.labels


def test_a_well_formed_marker_names_its_series(tmp_path):
    """The reference for the probes below: same tree, marker as the tool writes."""
    tree = fake_vllm_tree(tmp_path)
    (tree / "vllm" / MARKER_NAME).write_text(json.dumps(marker_of("s-1", DIGESTS)))
    assert build_info.patch_series_label(tree, SERIES) == "s-1"


@pytest.mark.parametrize(
    "content",
    [
        "[]",
        '"applied"',
        "42",
        json.dumps({"series_sha256": SERIES.sha256, "series_id": "s-1"}),
        json.dumps(marker_of("s-1", DIGESTS, series_sha256=None)),
        json.dumps(marker_of("s-1", list(DIGESTS))),
        json.dumps(marker_of("s-1", {"vllm/a.py": 7})),
        json.dumps(marker_of("s-1", {"vllm/a.py": DIGESTS["vllm/a.py"], "x": None})),
        json.dumps(marker_of(["s-1"], DIGESTS)),
        json.dumps(marker_of("", DIGESTS)),
        # Valid JSON for a string no UTF-8 exposition can carry.
        json.dumps(marker_of("\ud800s-1", DIGESTS)),
        DEEPLY_NESTED,
        json.dumps(marker_of("s-1", DIGESTS))[:-1] + ', "x": ' + DEEPLY_NESTED + "}",
    ],
)
def test_wrong_shape_marker_gives_invalid(tmp_path, monkeypatch, content):
    tree = fake_vllm_tree(tmp_path)
    (tree / "vllm" / MARKER_NAME).write_text(content)
    monkeypatch.setattr(build_info, "find_installed_target", lambda: tree)
    assert build_info.patch_series_label() == INVALID
    registry = CollectorRegistry()
    build_info.install_build_info(registry)
    assert scraped_build_info(registry)["patch_series"] == INVALID


@pytest.mark.parametrize(
    "content", [b"\xff\xfe\x00{", '{"series_id": "s-1"}'.encode("utf-16")]
)
def test_binary_marker_gives_invalid(tmp_path, monkeypatch, content):
    tree = fake_vllm_tree(tmp_path)
    (tree / "vllm" / MARKER_NAME).write_bytes(content)
    monkeypatch.setattr(build_info, "find_installed_target", lambda: tree)
    assert build_info.patch_series_label() == INVALID


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"7.2.1-81\n", "7.2.1-81"),
        (b"\n \n", "unknown"),
        (b"\xff\xfe7\x00.\x002\x00", "unknown"),
        (b"7.2\xc3", "unknown"),
        (b"7.2\r\n-1", "unknown"),
    ],
)
def test_rocm_version_file_of_any_bytes(tmp_path, content, expected):
    (tmp_path / ".info").mkdir()
    (tmp_path / ".info" / "version").write_bytes(content)
    assert build_info.rocm_version(tmp_path) == expected


def test_undecodable_image_tag_does_not_break_metrics(monkeypatch):
    # What os.environ holds for a K3_IMAGE_TAG whose bytes are not UTF-8.
    monkeypatch.setenv("K3_IMAGE_TAG", "tag-\udcff")
    registry = CollectorRegistry()
    build_info.install_build_info(registry)
    assert scraped_build_info(registry)["image_tag"] == "tag-\\udcff"


# -- the patch marker and the ROCm version file: properties ---------------------


def encodable(text: str) -> bool:
    return not any(0xD800 <= ord(char) <= 0xDFFF for char in text)


@st.composite
def markers(draw) -> tuple[object, str]:
    """A marker and the patch_series label it must give, by construction.
    Each field is right more often than not, so a good share of the markers
    are ones the label must name."""
    if not often(draw):
        # Arbitrary JSON cannot hold the series' sha256 by chance.
        return draw(json_values), INVALID
    if often(draw):
        series_id = draw(st.just(SERIES.series_id) | st.text(min_size=1, max_size=20))
    else:
        series_id = draw(st.sampled_from(["", "\udc80k3"]) | json_non_strings)
    id_ok = isinstance(series_id, str) and series_id != "" and encodable(series_id)
    sha = (
        SERIES.sha256 if often(draw) else draw(st.text(max_size=64) | json_non_strings)
    )
    sha_ok = sha == SERIES.sha256
    files_ok = True
    if often(draw):
        files = {}
        paths = [*TREE_FILES, "vllm/gone.py"]
        for rel in draw(st.lists(st.sampled_from(paths), unique=True)):
            right = often(draw)
            wrong = st.text(max_size=64) | json_non_strings
            digest = DIGESTS.get(rel, "0" * 64) if right else draw(wrong)
            files[rel] = digest
            files_ok &= rel in DIGESTS and right
    else:
        not_an_object = st.none() | st.integers() | st.text(max_size=5) | json_lists
        files, files_ok = draw(not_an_object), False
    written = marker_of(series_id, files, sha)
    others = draw(
        st.dictionaries(
            st.text(max_size=10).filter(lambda k: k not in written),
            json_values,
            max_size=3,
        )
    )
    marker = {**others, **written}
    return marker, series_id if id_ok and sha_ok and files_ok else INVALID


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return fake_vllm_tree(tmp_path_factory.mktemp("vllm-tree"))


def assert_label_on_metrics(label: str) -> None:
    registry = CollectorRegistry()
    labels = {"vllm_version": "0.27.1", "patch_series": label}
    build_info.install_build_info(registry, labels)
    assert scraped_build_info(registry) == labels


PROPERTY_WITH_CAPLOG = settings(
    PROPERTY,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@PROPERTY_WITH_CAPLOG
@given(case=markers())
def test_any_json_marker_gives_its_label(tree, caplog, case):
    marker, expected = case
    (tree / "vllm" / MARKER_NAME).write_text(json.dumps(marker))
    label = build_info.patch_series_label(tree, SERIES)
    event("applied" if expected != INVALID else "invalid")
    assert label == expected
    assert_label_on_metrics(label)
    # Handled as a bad marker, not by the last-resort guard.
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


@PROPERTY
@given(content=st.binary(max_size=512) | st.integers(1, DEEP).map(lambda n: b"[" * n))
def test_any_bytes_marker_gives_invalid(tree, content):
    (tree / "vllm" / MARKER_NAME).write_bytes(content)
    assert build_info.patch_series_label(tree, SERIES) == INVALID


@pytest.fixture(scope="module")
def rocm_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rocm")
    (root / ".info").mkdir()
    return root


@PROPERTY
@given(
    content=st.binary(max_size=64)
    | st.text(max_size=20).map(str.encode)
    | st.from_regex(r"\A\s*[0-9]+(\.[0-9]+){1,2}(-[0-9]+)?\s*\Z").map(str.encode)
)
def test_any_rocm_version_file_gives_a_label(rocm_root, content):
    (rocm_root / ".info" / "version").write_bytes(content)
    try:
        text = content.decode("utf-8").strip()
    except UnicodeDecodeError:
        text = ""
    # Letters, marks, numbers, punctuation, symbols and the plain space.
    printable = all(unicodedata.category(c)[0] in "LMNPS" or c == " " for c in text)
    expected = text if text and printable else "unknown"
    label = build_info.rocm_version(rocm_root)
    assert label == expected
    registry = CollectorRegistry()
    build_info.install_build_info(registry, {"rocm_version": label})
    assert scraped_build_info(registry) == {"rocm_version": label}
