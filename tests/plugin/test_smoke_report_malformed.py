"""Nothing in the smoke report may break /metrics (issue 11): named probes,
then properties over random JSON, random bytes and deep nesting.

Every expected verdict comes from how the test built the report, never from
the plugin's own parsing."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from support.malformed_json import (
    DEEP,
    DEEPLY_NESTED,
    PROPERTY,
    json_lists,
    json_non_strings,
    json_scalars,
    json_values,
    often,
)

from k3rocm.plugin import smoke_verdict

VERDICT = "k3rocm_smoke_verdict"


def scraped_verdict(report: Path) -> float | None:
    """The verdict as a scrape sees it: the whole exposition must render."""
    registry = CollectorRegistry()
    registry.register(smoke_verdict.SmokeVerdictCollector(report))
    exposition = generate_latest(registry).decode()
    [line] = [line for line in exposition.splitlines() if line.startswith(VERDICT)]
    return float(line.split()[-1])


# -- the smoke report: named probes ------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        '{"verdict": []}',
        '{"verdict": {}}',
        '{"verdict": ["pass"]}',
        '{"verdict": {"pass": 1}}',
    ],
)
def test_report_with_an_unhashable_verdict_is_no_verdict(tmp_path, content):
    report = tmp_path / "report.json"
    report.write_text(content)
    assert smoke_verdict.read_smoke_verdict(report) == -1
    assert scraped_verdict(report) == -1


@pytest.mark.parametrize(
    "content",
    [DEEPLY_NESTED, '{"verdict": ' + DEEPLY_NESTED + "}", '{"a":' * DEEP + "1"],
)
def test_deeply_nested_report_is_no_verdict(tmp_path, content):
    report = tmp_path / "report.json"
    report.write_text(content)
    assert smoke_verdict.read_smoke_verdict(report) == -1
    assert scraped_verdict(report) == -1


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\x01\x02\xff\xfe\xfd",
        b'{"verdict": "pass\xff"}',
        bytes(range(256)) * 64,
        # Valid JSON, but not in UTF-8, the encoding the smoke test writes.
        '{"verdict": "pass"}'.encode("utf-16"),
    ],
)
def test_binary_report_is_no_verdict(tmp_path, content):
    report = tmp_path / "report.json"
    report.write_bytes(content)
    assert smoke_verdict.read_smoke_verdict(report) == -1
    assert scraped_verdict(report) == -1


def test_report_that_never_ends_is_no_verdict(tmp_path):
    """A FIFO whose writer stays open: reading it to its end never returns."""
    report = tmp_path / "report.json"
    os.mkfifo(report)
    writer = os.open(report, os.O_RDWR)
    result = []
    reader = threading.Thread(
        target=lambda: result.append(smoke_verdict.read_smoke_verdict(report)),
        daemon=True,
    )
    try:
        reader.start()
        reader.join(10)
        returned_in_time = not reader.is_alive()
    finally:
        os.close(writer)  # lets a reader stuck in read() see the end
        reader.join(10)
    assert returned_in_time, "reading the report blocked on a FIFO"
    assert result == [-1]


def test_oversized_report_is_no_verdict(tmp_path):
    report = tmp_path / "report.json"
    padding = "x" * (2 << 20)
    report.write_text(json.dumps({"verdict": "pass", "padding": padding}))
    assert smoke_verdict.read_smoke_verdict(report) == -1


def test_refresher_survives_a_failing_round(tmp_path, monkeypatch):
    """In multiprocess mode a thread sets the gauge; an error in one round
    must not end it (the gauge would keep its last value)."""
    report = tmp_path / "report.json"
    report.write_text('{"verdict": []}')
    real_read = smoke_verdict.read_smoke_verdict
    rounds = []

    def read_failing_twice(path):
        rounds.append(path)
        if len(rounds) <= 2:
            raise RuntimeError("injected read failure")
        return real_read(path)

    monkeypatch.setattr(smoke_verdict, "read_smoke_verdict", read_failing_twice)
    registry = CollectorRegistry()
    refresher = smoke_verdict.VerdictRefresher(registry, report, interval=0.01)
    try:
        report.write_text(json.dumps({"verdict": "pass"}))
        deadline = time.monotonic() + 10
        while registry.get_sample_value(VERDICT) != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert registry.get_sample_value(VERDICT) == 1
        assert refresher.thread.is_alive()
        assert len(rounds) > 2
    finally:
        refresher.stop.set()
        refresher.thread.join(5)


def test_refresher_survives_a_failing_gauge(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"verdict": "fail"}))
    values = []
    stop = threading.Event()

    class FlakyGauge:
        def set(self, value):
            values.append(value)
            if len(values) == 1:
                raise OSError("injected: the multiprocess file cannot be written")
            if len(values) == 3:
                stop.set()

    smoke_verdict.refresh_verdict(FlakyGauge(), report, stop, interval=0.001)
    assert values == [0, 0, 0]


# -- the smoke report: properties ---------------------------------------------

NO_VERDICT_STRINGS = st.text(max_size=20).filter(lambda s: s not in ("pass", "fail"))


@st.composite
def reports(draw) -> tuple[object, int]:
    """A parsed report and the verdict it states, by construction."""
    if not often(draw):
        return draw(json_lists | json_scalars), -1
    others = draw(
        st.dictionaries(
            st.text(max_size=10).filter(lambda k: k != "verdict"),
            json_values,
            max_size=5,
        )
    )
    if not often(draw):
        return others, -1
    if often(draw):
        verdict, expected = draw(
            st.sampled_from([("pass", 1), ("fail", 0), ("running", -1)])
        )
    else:
        verdict, expected = draw(NO_VERDICT_STRINGS | json_non_strings), -1
    return {**others, "verdict": verdict}, expected


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reports") / "report.json"


@PROPERTY
@given(case=reports(), indent=st.sampled_from([None, 2]))
def test_any_json_report_reads_as_the_verdict_it_states(report, case, indent):
    document, expected = case
    event(f"verdict {expected}")
    report.write_text(json.dumps(document, indent=indent))
    assert smoke_verdict.read_smoke_verdict(report) == expected
    assert scraped_verdict(report) == expected


@PROPERTY
@given(content=st.binary(max_size=512))
def test_any_bytes_read_as_a_verdict(report, content):
    report.write_bytes(content)
    verdict = smoke_verdict.read_smoke_verdict(report)
    assert verdict in (-1, 0, 1)
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        assert verdict == -1
    assert scraped_verdict(report) == verdict


@PROPERTY
@given(
    depth=st.integers(1, DEEP),
    brackets=st.sampled_from([("[", "]"), ('{"v":', "}")]),
    as_verdict=st.booleans(),
)
def test_any_nesting_reads_as_no_verdict(report, depth, brackets, as_verdict):
    opening, closing = brackets
    nested = opening * depth + ("1" if opening != "[" else "") + closing * depth
    report.write_text('{"verdict": ' + nested + "}" if as_verdict else nested)
    assert smoke_verdict.read_smoke_verdict(report) == -1
