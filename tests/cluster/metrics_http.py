"""Scraping a node's ``GET /metrics`` as Prometheus does, parsed with prometheus-client's
own text parser: sample name and sorted labels -> value."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int, auth: dict[str, str]) -> Samples:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=auth)
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return samples(resp.read().decode())


def samples(text: str) -> Samples:
    """The samples of a ``/metrics`` text."""
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(nodes: list[Samples], name: str, **labels: str) -> float:
    """``name`` with exactly ``labels`` summed over the nodes' scrapes (absent: 0)."""
    return sum(value(s, name, **labels) for s in nodes)
