"""Response-time targets (issue 21): predict each query's mean response time on a
worker, and place queries on the fewest workers that meet every target.

The model (after the configuration scheduler of Chakravarthy-style EPN placement,
``../shared/papers/002``, sections 4-6):

- each query's whole processing is one server, with a calibrated mean processing time
  ``b`` per event and its second moment ``m2``;
- the queries one worker hosts share its one FIFO input queue: a multi-class M/G/1
  queue under Poisson arrivals, so by the Pollaczek-Khinchine formula every query on
  the worker waits the same mean time in the queue,
  ``Wq = sum_j(rate_j * m2_j) / (2 * (1 - rho))`` with ``rho = sum_j(rate_j * b_j)``,
  and its mean response time is ``W_i = b_i + Wq`` (infinite when ``rho >= 1``);
- a query's relative deviation from its target ``T_i`` is ``(W_i - T_i) / T_i``; a
  worker is viable when every query on it has a deviation at most the high water-mark
  ``hw`` and its load is at most ``rho_max``;
- placement is first-fit decreasing (by load): the bin-packing heuristic of the paper's
  configuration scheduler. The low water-mark ``lw`` does not constrain a placement:
  a query far below its target wastes a worker, which the fewest-workers goal already
  avoids; the queries still below it are reported.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence


@dataclass(frozen=True)
class QueryCost:
    """A query's calibrated processing time per event: mean ``b`` and second moment
    ``m2`` (seconds, seconds squared)."""

    name: str
    b: float
    m2: float

    def __post_init__(self):
        if not (self.b > 0 and self.m2 >= self.b * self.b):
            raise ValueError(f"{self.name}: a processing time needs b > 0 and "
                             f"m2 >= b^2 (b={self.b}, m2={self.m2})")


def load(costs: Sequence[QueryCost], rates: Mapping[str, float]) -> float:
    """The share of a worker's time the queries take: sum of rate * b."""
    return sum(rates[c.name] * c.b for c in costs)


def response_times(costs: Sequence[QueryCost], rates: Mapping[str, float]
                   ) -> dict[str, float]:
    """Mean response time (s) of every query on one worker (Pollaczek-Khinchine,
    multi-class M/G/1, FIFO); ``inf`` when the worker is saturated."""
    rho = load(costs, rates)
    if rho >= 1:
        return {c.name: math.inf for c in costs}
    wait = sum(rates[c.name] * c.m2 for c in costs) / (2 * (1 - rho))
    return {c.name: c.b + wait for c in costs}


def deviation(response: float, target: float) -> float:
    """Relative deviation of a response time from its target: (W - T) / T."""
    return (response - target) / target


@dataclass
class Worker:
    """The queries one worker hosts, with their predicted response times and load."""

    queries: list[QueryCost] = field(default_factory=list)
    response: dict[str, float] = field(default_factory=dict)
    load: float = 0.0


@dataclass
class Placement:
    workers: list[Worker]
    met: bool                   # every query within hw of its target, every load <= rho_max
    below_lw: list[str]         # queries predicted further below their targets than lw

    def worker_of(self, query: str) -> int:
        return next(i for i, w in enumerate(self.workers)
                    if any(c.name == query for c in w.queries))


def _viable(costs, rates, targets, hw, rho_max) -> tuple[bool, dict[str, float], float]:
    response = response_times(costs, rates)
    rho = load(costs, rates)
    ok = rho <= rho_max and all(deviation(response[c.name], targets[c.name]) <= hw
                                for c in costs)
    return ok, response, rho


def place(costs: Sequence[QueryCost], rates: Mapping[str, float],
          targets: Mapping[str, float], *, workers: int | None = None, lw: float = -0.5,
          hw: float = 0.0, rho_max: float = 0.8) -> Placement:
    """Queries on workers. Without ``workers``: the fewest that meet every target
    (first-fit decreasing by load: each query, heaviest first, joins the first worker
    that stays viable with it, else a new one). With ``workers``: exactly that many,
    each query joining the worker where the worst deviation after it is least
    (``met`` says whether the targets hold). ``targets`` in seconds."""
    if lw > hw:
        raise ValueError("the low water-mark must not exceed the high one")
    order = sorted(costs, key=lambda c: (-rates[c.name] * c.b, c.name))
    bins: list[list[QueryCost]] = [[] for _ in range(workers or 0)]
    for c in order:
        if workers is None:
            for b in bins:
                if _viable(b + [c], rates, targets, hw, rho_max)[0]:
                    b.append(c)
                    break
            else:
                bins.append([c])
        else:
            def worst(b):
                response = response_times(b + [c], rates)
                return (max(deviation(response[x.name], targets[x.name]) for x in b + [c]),
                        load(b + [c], rates))
            min(bins, key=worst).append(c)
    out, met, below = [], True, []
    for b in bins:
        ok, response, rho = _viable(b, rates, targets, hw, rho_max)
        met = met and ok
        below += [c.name for c in b if deviation(response[c.name], targets[c.name]) < lw]
        out.append(Worker(b, response, rho))
    return Placement(out, met, sorted(below))


# ------------------------------------------------------------------ calibration

CALIBRATION_VERSION = 1


@dataclass
class Calibration:
    """Each query's processing time per event, measured alone (``alone``), and how the
    shared plan's time is charged to them (``shared``: each query's alone cost scaled
    by shared plan / sum of alone, so the charges add up to what the shared plan
    costs). ``batch_events``: the engine batch the times were taken at."""

    batch_events: int
    events: int
    alone: dict[str, QueryCost]
    shared: dict[str, QueryCost]
    shared_b: float             # the shared plan's time per event (s)

    def costs(self, shared: bool = True) -> dict[str, QueryCost]:
        return self.shared if shared else self.alone

    def to_json(self) -> dict:
        def costs(d):
            return {q: {"b": c.b, "m2": c.m2} for q, c in d.items()}
        return {"version": CALIBRATION_VERSION, "batch_events": self.batch_events,
                "events": self.events, "alone": costs(self.alone),
                "shared": costs(self.shared), "shared_b": self.shared_b}

    @classmethod
    def from_json(cls, obj: dict, source: str = "calibration") -> "Calibration":
        from dqcep.errors import UserError
        try:
            if obj["version"] != CALIBRATION_VERSION:
                raise UserError(f"{source}: calibration format {obj['version']}; this dqcep "
                                f"reads {CALIBRATION_VERSION} (run dqcep calibrate again)")

            def costs(d):
                return {q: QueryCost(q, float(v["b"]), float(v["m2"])) for q, v in d.items()}
            return cls(int(obj["batch_events"]), int(obj["events"]), costs(obj["alone"]),
                       costs(obj["shared"]), float(obj["shared_b"]))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise UserError(f"{source}: not a calibration written by dqcep calibrate "
                            f"({type(err).__name__}: {err})") from None


def batch_moments(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(b, m2) per event from (events, seconds) per engine batch: every event of a batch
    is taken to cost the batch's mean, so ``m2`` holds the spread between batches,
    not within one (an assumption, docs/capacity.md)."""
    n = sum(k for k, _ in samples)
    if n == 0:
        raise ValueError("no event was processed")
    b = sum(t for _, t in samples) / n
    m2 = sum(t * t / k for k, t in samples if k) / n
    return b, max(m2, b * b)


def calibrate(query_file, pieces_of, batch_events: int, lookup_source=None,
              timer=None) -> Calibration:
    """Every query of a parsed file alone, then the shared plan, over the same input:
    ``pieces_of(engine)`` gives the input in that engine's columns, in batches of about
    ``batch_events``; only ``engine.process`` is timed."""
    import time

    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    timer = timer or time.perf_counter

    def measure(queries) -> tuple[float, float, int]:
        engine = Engine(build_plan(queries, schemas=query_file.schemas,
                                   tables=query_file.tables), lookup_source=lookup_source)
        pieces = list(pieces_of(engine))
        samples = []
        for piece in pieces:
            started = timer()
            engine.process(piece)
            samples.append((len(piece.ts) if hasattr(piece, "ts") else len(piece),
                            timer() - started))
        started = timer()
        engine.flush()
        if samples:
            k, t = samples[-1]
            samples[-1] = (k, t + timer() - started)
        return (*batch_moments(samples), sum(k for k, _ in samples))
    alone = {}
    for q in query_file.queries:
        b, m2, n = measure([q])
        alone[q.name] = QueryCost(q.name, b, m2)
    shared_b, _, n = measure(list(query_file.queries))
    scale = shared_b / sum(c.b for c in alone.values())
    shared = {q: QueryCost(q, c.b * scale, c.m2 * scale * scale) for q, c in alone.items()}
    return Calibration(batch_events, n, alone, shared, shared_b)
