"""A replica's engine metrics in Ray's metrics, which Ray's Prometheus export serves for every replica.

Each replica copies its engine's metrics (``serve/metrics.py``: the families a single server shows on
/metrics) into Ray Serve metrics every ``PERIOD_S`` seconds. Ray tags each with the application, the
deployment and the replica, and every node's metrics agent serves them in Prometheus' format on that node's
metrics export port, named with a ``ray_`` prefix (``ray_llaisys_generation_tokens_total{replica="..."}``);
Ray lists those ports for Prometheus' file-based service discovery (docs/design/parallelism.md#replicas-on-ray-serve).

Counters stay counters (each copy adds what grew since the last); a summary's ``_sum`` and ``_count`` are
counters of their own; gauges are set.

``exported`` gathers them back from every node, for the application's own ``GET /metrics`` (the ingress answers
it: forwarded, it would show one replica's engine).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .. import metrics

if TYPE_CHECKING:
    from ray.serve.metrics import Counter, Gauge

    from ..engine import Engine

PERIOD_S = 1.0


class RayMetrics:
    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name
        self._gauges: dict[str, Gauge] = {}  # by name: the Ray Serve metric of each sample
        self._counters: dict[str, Counter] = {}
        self._copied: dict[tuple, float] = {}  # a counter sample's value at the last copy

    def copy(self) -> None:
        """Copy every sample of the engine's metrics into its Ray metric."""
        for name, kind, help_text, samples in metrics.families(self.engine, self.model_name):
            for suffix, labels, value in samples:
                tags = {key: str(v) for key, v in labels.items()}
                if kind == "gauge":
                    self._gauge(name + suffix, help_text, tags).set(float(value), tags=tags)
                    continue
                counter = self._counter(name + suffix, help_text, tags)
                key = (name + suffix, tuple(sorted(tags.items())))
                grown = float(value) - self._copied.get(key, 0.0)
                if grown > 0:
                    counter.inc(grown, tags=tags)
                    self._copied[key] = float(value)

    async def run(self) -> None:
        """Copy every ``PERIOD_S`` seconds, until cancelled."""
        while True:
            self.copy()
            await asyncio.sleep(PERIOD_S)

    def _gauge(self, name: str, help_text: str, tags: dict[str, str]) -> Gauge:
        gauge = self._gauges.get(name)
        if gauge is None:
            from ray.serve import metrics as serve_metrics

            gauge = self._gauges[name] = serve_metrics.Gauge(name, description=help_text, tag_keys=tuple(sorted(tags)))
        return gauge

    def _counter(self, name: str, help_text: str, tags: dict[str, str]) -> Counter:
        """(a summary's ``_sum`` and ``_count`` too: each a counter)"""
        counter = self._counters.get(name)
        if counter is None:
            from ray.serve import metrics as serve_metrics

            counter = self._counters[name] = serve_metrics.Counter(name, description=help_text, tag_keys=tuple(sorted(tags)))
        return counter


def exported(app_name: str, timeout: float = 10.0) -> str:
    """This application's llaisys metrics from every live node's Ray metrics export, as one Prometheus text (each
    family once: its HELP and TYPE, then every replica's samples). Blocking: call it on a worker thread."""
    import urllib.request

    import ray

    meta: dict[str, dict[str, str]] = {}  # family -> "HELP" / "TYPE" -> its line (from the first node with it)
    samples: dict[str, list[str]] = {}  # family -> its samples, every replica's
    unanswered = []
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        try:
            text = urllib.request.urlopen(url, timeout=timeout).read().decode()
        except OSError as e:  # that node's replicas are missing: said so, in a comment
            unanswered.append(f"# the metrics export of node {node['NodeManagerAddress']} did not answer: {e}")
            continue
        for line in text.splitlines():
            if line.startswith(("# HELP ray_llaisys_", "# TYPE ray_llaisys_")):
                _, kind, family = line.split(" ", 3)[:3]
                meta.setdefault(family, {}).setdefault(kind, line)
            elif line.startswith("ray_llaisys_") and f'application="{app_name}"' in line:
                samples.setdefault(line.split("{", 1)[0], []).append(line)
    lines = unanswered + [line for family, rows in samples.items() for line in [*meta.get(family, {}).values(), *rows]]
    return "\n".join(lines) + "\n"
