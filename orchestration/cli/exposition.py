"""The metric model (resources/core/metric_model.py) as ``prometheus_client`` metric families, and
the custom collector `dueledger metrics serve|write` register: each ``collect()`` is one
scrape of the ledger (orchestration/services/metrics.py). Imported by those two commands
only, so the other `dueledger` commands do not load prometheus_client."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from orchestration.declarations import task_views
from orchestration.services.metrics import MissedDuesMemo, scrape
from resources.core import metric_model as m
from resources.core.settings import load_settings

if TYPE_CHECKING:
    import dagster as dg

    from resources.ledger import Ledger


def _family(family: m.Family) -> Metric:
    spec = family.spec
    labels = list(spec.labels)
    if spec.kind == m.COUNTER:
        counter = CounterMetricFamily(spec.name, spec.help, labels=labels)
        for values, value in family.samples:
            assert isinstance(value, float)
            counter.add_metric(list(values), value)
        return counter
    if spec.kind == m.GAUGE_HISTOGRAM:
        histogram = GaugeHistogramMetricFamily(spec.name, spec.help, labels=labels)
        for values, value in family.samples:
            assert isinstance(value, m.Histogram)
            buckets = [
                (floatToGoString(bound), float(count))
                for bound, count in zip(value.bounds, value.cumulative, strict=False)
            ]
            buckets.append(("+Inf", float(value.count)))
            histogram.add_metric(list(values), buckets, value.total)
        return histogram
    gauge = GaugeMetricFamily(spec.name, spec.help, labels=labels)
    for values, value in family.samples:
        assert isinstance(value, float)
        gauge.add_metric(list(values), value)
    return gauge


class LedgerCollector(Collector):
    """A custom collector: each ``collect()`` is one scrape of the ledger (one at a time).

    ``snapshot`` may be set after the collector is registered (``serve`` binds its port
    first, so that a port in use is reported before anything else is opened)."""

    def __init__(self, snapshot: Callable[[], m.MetricsSnapshot] | None = None) -> None:
        self.snapshot = snapshot
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        # Registration must not scrape the ledger: the names are known without it.
        return []

    def collect(self) -> Iterator[Metric]:
        if self.snapshot is None:
            raise RuntimeError("the metrics server is still starting: scrape again")
        with self._lock:
            found = [_family(f) for f in m.families(self.snapshot())]
        yield from found


def snapshot_source(
    ledger: Ledger, instance: dg.DagsterInstance | None
) -> Callable[[], m.MetricsSnapshot]:
    """A scrape of ``ledger`` (and ``instance``) for the registered tasks, as of each call."""
    settings = load_settings()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # cadence warnings: see `dueledger tasks`
        views = task_views(settings)
    memo = MissedDuesMemo()

    def snapshot() -> m.MetricsSnapshot:
        return scrape(
            ledger,
            views,
            datetime.now(UTC),
            instance=instance,
            slot_minutes=settings.slot_minutes,
            memo=memo,
        )

    return snapshot
