"""Reading pidgate's /metrics text in tests: samples by name, and the one sample with labels."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

#: sample name (``..._total``, ``..._count``, ...) -> [(labels, value)]
Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_samples(text: str) -> Samples:
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), float(sample.value)))
    return samples


def metric(samples: Samples, name: str, **labels: str) -> float:
    """The one sample called ``name`` whose labels include ``labels``."""
    matching = [
        value
        for sample_labels, value in samples.get(name, [])
        if all(sample_labels.get(k) == v for k, v in labels.items())
    ]
    assert len(matching) == 1, f"{name}{labels}: {matching} in {samples.get(name)}"
    return matching[0]
