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
