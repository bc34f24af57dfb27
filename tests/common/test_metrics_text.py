"""The one /metrics reader (k3rocm.common.metrics_text) on exposition text
written here by hand, each total worked out by hand: label sets summed, a
sample's timestamp not read as its value, escaped label values, NaN left
out, a family without samples, a text that is not the format."""

from __future__ import annotations

import pytest

from k3rocm.common.metrics_text import finite_samples, metric_families, sample_total

GAUGE = "k3rocm_api_requests_in_flight"
TEXT = f"""# HELP {GAUGE} requests in flight
# TYPE {GAUGE} gauge
{GAUGE}{{pid="7"}} 2.0
{GAUGE}{{pid="8",path="a \\"b\\" c"}} 3.0 1700000000000
{GAUGE}{{pid="9"}} NaN
# HELP vllm:spec_decode_num_drafts_total drafts
# TYPE vllm:spec_decode_num_drafts_total counter
# HELP steps step durations
# TYPE steps histogram
steps_bucket{{kind="prefill",le="+Inf"}} 4.0
steps_count{{kind="prefill"}} 4.0
steps_count{{kind="decode"}} 9.0
steps_sum{{kind="decode"}} 1.5
"""


def test_a_total_sums_every_label_set_with_a_number():
    # 2 + 3; the NaN is left out, the timestamp is not the value.
    assert sample_total(TEXT, GAUGE) == 5.0


def test_labels_choose_the_samples_and_a_suffix_is_its_own_name():
    assert sample_total(TEXT, "steps_count") == 13.0
    assert (
        sample_total(TEXT, "steps_count", lambda labels: labels["kind"] == "prefill")
        == 4.0
    )
    assert sample_total(TEXT, "steps") is None
    assert sample_total(TEXT, "vllm:spec_decode_num_drafts_total") is None


def test_escaped_label_values_are_read_as_written():
    labels = [s.labels for s in finite_samples(TEXT) if s.labels.get("pid") == "8"]
    assert labels == [{"pid": "8", "path": 'a "b" c'}]


def test_a_family_with_no_samples_yet_is_still_a_family():
    assert {GAUGE, "vllm:spec_decode_num_drafts", "steps"} <= metric_families(TEXT)


@pytest.mark.parametrize("text", ["not metrics at all {\n", f"{GAUGE} two\n"])
def test_text_that_is_not_the_format_is_a_value_error(text):
    with pytest.raises(ValueError):
        sample_total(text, GAUGE)
