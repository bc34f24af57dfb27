"""One reader of vLLM's /metrics text (the Prometheus text exposition) for
the stall watchdog, the stop's drain and the smoke test: prometheus_client's
own parser, so labels, escaping and the _total/_count suffixes read as
Prometheus reads them, and every caller treats a bad value alike."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def metric_families(text: str) -> set[str]:
    """The names of the metric families in ``text`` (a family may have no
    samples yet: a labelled counter nothing has counted). ValueError if the
    text is not the exposition format."""
    return {family.name for family in text_string_to_metric_families(text)}


def finite_samples(text: str) -> Iterator[Sample]:
    """Every sample in ``text`` whose value is a number (NaN and the
    infinities left out). ValueError if the text is not the exposition
    format."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if math.isfinite(sample.value):
                yield sample


def sample_total(
    text: str,
    name: str,
    labels: Callable[[Mapping[str, str]], bool] = lambda _: True,
) -> float | None:
    """The sum of the samples called ``name`` whose labels ``labels``
    accepts; None when there is none. ValueError as finite_samples."""
    values = [
        sample.value
        for sample in finite_samples(text)
        if sample.name == name and labels(sample.labels)
    ]
    return sum(values) if values else None
