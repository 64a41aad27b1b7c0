"""The service's figures as Prometheus metrics (``GET /metrics``).

Every metric is read from one snapshot of the service's status (``GET /status``,
``--stats-file``): ``METRICS`` is the whole list, with the status field each comes
from, so the two never disagree. Names follow Prometheus's conventions: counters end
in ``_total``, units are in the name (``_seconds``, ``_bytes``), labels name the
query, the reason or the worker. docs/operations.md lists them.
"""
from __future__ import annotations

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)

# (metric name, kind, help, status field); a field with a dict value is labelled by
# its keys (the label named in LABELS)
METRICS = [
    ("dqcep_events_in_total", "counter",
     "Events taken into the engine (repeats and dead letters left out)", "events_in"),
    ("dqcep_payloads_total", "counter", "Journal records (MQTT payloads) read", "payloads"),
    ("dqcep_matches_out_total", "counter", "Matches written to the output", "matches_out"),
    ("dqcep_query_matches_total", "counter", "Matches written, per query",
     "matches_by_query"),
    ("dqcep_dead_letters_total", "counter",
     "Dead letters written, by reason (payload, event, ahead, schema, journal_lost, "
     "stopped, change, tick)", "dead_letters"),
    ("dqcep_late_events_total", "counter",
     "Events left out as late (the late file), by reason: lateness (behind their "
     "timeline by more than --lateness), skew (behind the stream by more than --skew)",
     "late_by_reason"),
    ("dqcep_ticks_total", "counter",
     "Ticks taken: no message came for --tick ms, time passed (spec section 7)", "ticks"),
    ("dqcep_repeated_events_total", "counter",
     "Events dropped for repeating the id of an earlier one", "duplicates"),
    ("dqcep_journal_records_lost_total", "counter",
     "Journal records that could not be read", "journal_lost"),
    ("dqcep_redelivered_messages_total", "counter",
     "MQTT messages the broker sent again, not journaled twice (this run)", "redelivered"),
    ("dqcep_lag_records", "gauge", "Journal records not yet processed", "lag_records"),
    ("dqcep_journal_bytes", "gauge", "Bytes of the journal's segments on disk",
     "journal_bytes"),
    ("dqcep_engine_state_bytes", "gauge",
     "Bytes the engine holds (queues, stores, events, held matches)", "state_total_bytes"),
    ("dqcep_query_state_bytes", "gauge",
     "Bytes of the vertices a query reads (a shared vertex counts for each of its "
     "queries)", "state_bytes"),
    ("dqcep_checkpoint_age_seconds", "gauge", "Seconds since the last checkpoint",
     "checkpoint_age_s"),
    ("dqcep_output_backlog_matches", "gauge",
     "Matches found and not yet written to the output (its writer thread's queue)",
     "output_backlog"),
    ("dqcep_watermark_milliseconds", "gauge",
     "The engine's watermark (event time, ms): G - D, below it nothing is admitted",
     "watermark"),
    ("dqcep_event_time_milliseconds", "gauge",
     "G: the largest event time and tick time taken (ms)", "event_time"),
    ("dqcep_watermark_lag_seconds", "gauge",
     "How far the watermark is behind this machine's clock (a stalled feed grows it)",
     "watermark_lag_s"),
    ("dqcep_query_stopped", "gauge", "1 for a query stopped by its partial-match budget",
     "stopped_by_query"),
    ("dqcep_budget_stops_total", "counter", "Queries stopped by their budget",
     "budget_stops"),
    ("dqcep_failing", "gauge", "1 while a write fails and the service retries", "failing"),
    ("dqcep_queries", "gauge", "Queries the service runs", "query_count"),
    ("dqcep_worker_up", "gauge", "1 for a running worker process (--workers)",
     "workers_up"),
    ("dqcep_status_time_seconds", "gauge",
     "When these figures were taken (Unix time; /status's time)", "time"),
]
LABELS = {"matches_by_query": "query", "dead_letters": "reason", "state_bytes": "query",
          "late_by_reason": "reason",
          "stopped_by_query": "query", "workers_up": "worker"}
HISTOGRAM = ("dqcep_response_time_seconds",
             "From the arrival of the event that completed a match to its output, per "
             "query (matches measured this run)")
# The series labelled by query are those of at most METRIC_QUERIES queries: a scrape's
# size and cost, and the series a Prometheus keeps, do not grow with the query set (a
# service of 1,000 queries served 1.1 MB a scrape). Those shown are the ones to look at:
# the queries their budget stopped, then those holding the most state, then by name.
# /status has every query's figures.
METRIC_QUERIES = 20
SHOWN = ("dqcep_metric_queries", "gauge",
         f"Queries with series of their own here (those stopped by their budget, then "
         f"those holding the most state; at most {METRIC_QUERIES}; /status has all)")


def _family(name: str, kind: str, doc: str, labels=()):
    if kind == "counter":  # prometheus_client adds the _total itself
        return CounterMetricFamily(name[:-len("_total")], doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


def shown_queries(status: dict) -> set[str]:
    """The queries whose series /metrics serves (``METRIC_QUERIES``)."""
    state = status.get("state_bytes") or {}
    stopped = status.get("stopped_by_query") or {}
    names = set(state) | set(status.get("matches_by_query") or {}) | set(stopped) | \
        set(status.get("response") or {})
    if len(names) <= METRIC_QUERIES:
        return names
    return set(sorted(names, key=lambda q: (not stopped.get(q), -state.get(q, 0), q))
               [:METRIC_QUERIES])


def families(status: dict) -> list:
    """The metric families of one status snapshot (empty before the first)."""
    if not status:
        return []
    out = []
    shown = shown_queries(status)
    for name, kind, doc, field in METRICS:
        value = status.get(field)
        if value is None:
            continue
        if isinstance(value, dict):
            fam = _family(name, kind, doc, [LABELS[field]])
            per_query = LABELS[field] == "query"
            for key, v in sorted(value.items()):
                if not per_query or key in shown:
                    fam.add_metric([str(key)], float(v))
        else:
            fam = _family(name, kind, doc)
            fam.add_metric([], float(value))
        out.append(fam)
    hist = HistogramMetricFamily(HISTOGRAM[0], HISTOGRAM[1], labels=["query"])
    for query, r in sorted((status.get("response") or {}).items()):
        h = r.get("histogram")
        if h is None or query not in shown:
            continue
        buckets = [(_le(le), float(n)) for le, n in zip(h["le"], h["cumulative"])]
        hist.add_metric([query], buckets, h["sum_s"])
    out.append(hist)
    fam = _family(*SHOWN[:3])
    fam.add_metric([], float(len(shown)))
    out.append(fam)
    return out


def _le(bound) -> str:
    return "+Inf" if bound is None or bound == float("inf") else repr(float(bound))
