"""Response-time targets: predict each query's mean response time on a
worker, and place queries on the fewest workers that meet every target.

The model (after the configuration scheduler of the response-time autoscaling paper,
``../shared/papers/002``, sections 4-6), with a worker's own work added:

- a customer is a payload (``batch_events`` events of one stream, as MQTT delivers
  them); each query's processing of a payload is one server, with a calibrated mean
  ``b`` and second moment ``m2`` (``QueryCost``);
- a worker reads each stream its queries need, and every payload of a stream costs
  it its own work too (``WorkerModel.overhead``: decoding, repeated ids, the journal)
  besides its queries' processing, which all happens before the payload's matches go
  out: the stream is one class whose service time is ``S = overhead + sum(s_j)``. The
  parts of ``S`` grow together with the payload's content, so its second moment is
  taken as that of perfectly correlated parts, ``(sqrt(m2_o) + sum sqrt(m2_j))^2``
  (exact for calibrate's charge rule, which scales one measured time);
- the streams one worker reads share its one FIFO input queue: a multi-class M/G/1
  queue under Poisson arrivals, so by the Pollaczek-Khinchine formula every payload
  waits the same mean time ``Wq = sum_k(rate_k * E[S_k^2]) / (2 * (1 - rho))`` with
  ``rho = sum_k(rate_k * E[S_k])``, and a query of stream k answers in
  ``W = delay + E[S_k] + Wq`` (infinite when ``rho >= 1``); ``delay`` is what a match
  waits beyond the processing at low load (the journal's commit, the wake-up);
- a worker of journal consumers (``dqcep run --workers``, ``in_turn``) gives each
  payload to its queries one after the other, in the order listed: its stream is
  still one class (the next payload waits for all of them), but query ``i`` answers
  after its own part, ``W_i = delay + sum(s_j, j <= i) + Wq``; ``place`` orders a
  worker's consumers by target, the tightest first;
- the worker's checkpoints stop its processing while they last: a class of their own,
  one every ``checkpoint_every`` s with the calibrated duration (mean, second moment);
- with no overhead, no delay and no checkpoints, and every query reading a stream of
  its own, this is the paper's formula, ``W_i = b_i + sum_j(rate_j * m2_j) / (2 * (1 - rho))``;
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

from dqcep.core.limits import COUNT, POSITIVE, Number

# a calibrated time: at most a day per payload (a larger one is no measurement, and its
# predictions would overflow)
SECONDS = Number(low=0, high=86_400)
SECONDS_SQUARED = Number(low=0, high=86_400.0 ** 2)


@dataclass(frozen=True)
class QueryCost:
    """A query's calibrated processing time per customer (a payload): mean ``b`` and
    second moment ``m2`` (seconds, seconds squared)."""

    name: str
    b: float
    m2: float

    def __post_init__(self):
        if not (self.b >= 0 and self.m2 >= self.b * self.b):
            raise ValueError(f"{self.name}: a processing time needs b >= 0 and "
                             f"m2 >= b^2 (b={self.b}, m2={self.m2})")


@dataclass(frozen=True)
class WorkerModel:
    """What a worker adds to its queries' processing: ``overhead`` per payload of each
    stream it reads, ``delay`` before a payload can be processed, which stream each
    query reads (``stream_of``; a query missing from it reads a stream of its own), and
    its checkpoints: one every ``checkpoint_every`` s taking ``checkpoint``, during
    which no payload is processed (a class of customers of its own). ``in_turn``: the
    queries of a stream are served one after the other in the order given, each
    answering after its own part (journal consumers), instead of all once the payload
    is through (one plan)."""

    overhead: QueryCost | None = None
    delay: float = 0.0
    stream_of: Mapping[str, str] = field(default_factory=dict)
    checkpoint: QueryCost | None = None
    checkpoint_every: float = 1.0
    in_turn: bool = False


PAPER = WorkerModel()  # the paper's: no overhead, no delay, a stream per query


@dataclass(frozen=True)
class StreamLoad:
    """One stream a worker reads: its rate (payloads/s) and a payload's service time
    (mean, second moment) on that worker."""

    rate: float
    mean: float
    m2: float


def _stream(model: WorkerModel, query: str) -> str:
    """The stream a query reads (one of its own unless ``stream_of`` names one)."""
    return model.stream_of.get(query, "query " + query)


def stream_loads(costs: Sequence[QueryCost], rates: Mapping[str, float],
                 model: WorkerModel = PAPER) -> dict[str, StreamLoad]:
    """Per stream the worker reads: rate and service time of its payloads."""
    groups: dict[str, list[QueryCost]] = {}
    for c in costs:
        groups.setdefault(_stream(model, c.name), []).append(c)
    out = {}
    for stream, queries in groups.items():
        rate = {rates[c.name] for c in queries}
        if len(rate) != 1:
            raise ValueError(f"the queries of stream {stream} "
                             f"({', '.join(c.name for c in queries)}) need one rate")
        parts = queries + ([model.overhead] if model.overhead else [])
        out[stream] = StreamLoad(rate.pop(), sum(c.b for c in parts),
                                 sum(math.sqrt(c.m2) for c in parts) ** 2)
    return out


def _classes(costs, rates, model) -> tuple[dict[str, StreamLoad], list[StreamLoad]]:
    """The worker's streams, and every class its queue serves (the checkpoints too)."""
    streams = stream_loads(costs, rates, model)
    classes = list(streams.values())
    if model.checkpoint is not None:
        classes.append(StreamLoad(1 / model.checkpoint_every, model.checkpoint.b,
                                  model.checkpoint.m2))
    return streams, classes


def load(costs: Sequence[QueryCost], rates: Mapping[str, float],
         model: WorkerModel = PAPER) -> float:
    """The share of a worker's time its classes take: sum of rate * E[S]."""
    return sum(s.rate * s.mean for s in _classes(costs, rates, model)[1])


def response_times(costs: Sequence[QueryCost], rates: Mapping[str, float],
                   model: WorkerModel = PAPER) -> dict[str, float]:
    """Mean response time (s) of every query on one worker (Pollaczek-Khinchine,
    multi-class M/G/1, FIFO); ``inf`` when the worker is saturated. With
    ``model.in_turn`` a query's own part of its stream's service is the own work and
    the parts of the queries before it in ``costs``, its own included."""
    streams, classes = _classes(costs, rates, model)
    rho = sum(s.rate * s.mean for s in classes)
    if rho >= 1:
        return {c.name: math.inf for c in costs}
    wait = sum(s.rate * s.m2 for s in classes) / (2 * (1 - rho))
    served: dict[str, float] = {}  # per stream: what its queries so far took (in turn)
    out = {}
    for c in costs:
        stream = _stream(model, c.name)
        if model.in_turn:
            first = model.overhead.b if model.overhead else 0.0
            served[stream] = served.get(stream, first) + c.b
            out[c.name] = model.delay + served[stream] + wait
        else:
            out[c.name] = model.delay + streams[stream].mean + wait
    return out


def in_turn_order(costs: Sequence[QueryCost], targets: Mapping[str, float],
                  model: WorkerModel) -> list[QueryCost]:
    """The order a worker serves its queries in: as given for one plan; for consumers
    in turn the tightest target first (then the cheapest), so the queries with the
    least room answer first."""
    if not model.in_turn:
        return list(costs)
    return sorted(costs, key=lambda c: (targets[c.name], c.b, c.name))


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


def _viable(costs, rates, targets, hw, rho_max, model
            ) -> tuple[bool, dict[str, float], float]:
    response = response_times(in_turn_order(costs, targets, model), rates, model)
    rho = load(costs, rates, model)
    ok = rho <= rho_max and all(deviation(response[c.name], targets[c.name]) <= hw
                                for c in costs)
    return ok, response, rho


def place(costs: Sequence[QueryCost], rates: Mapping[str, float],
          targets: Mapping[str, float], *, workers: int | None = None, lw: float = -0.5,
          hw: float = 0.0, rho_max: float = 0.8, model: WorkerModel = PAPER) -> Placement:
    """Queries on workers. Without ``workers``: the fewest that meet every target
    (first-fit decreasing by load: each query, heaviest first, joins the first worker
    that stays viable with it, else a new one). With ``workers``: exactly that many,
    each query joining the worker where the worst deviation after it is least
    (``met`` says whether the targets hold). ``targets`` in seconds, ``rates`` in
    payloads per second."""
    if lw > hw:
        raise ValueError("the low water-mark must not exceed the high one")
    order = sorted(costs, key=lambda c: (-rates[c.name] * c.b, c.name))
    bins: list[list[QueryCost]] = [[] for _ in range(workers or 0)]
    for c in order:
        if workers is None:
            for b in bins:
                if _viable(b + [c], rates, targets, hw, rho_max, model)[0]:
                    b.append(c)
                    break
            else:
                bins.append([c])
        else:
            def worst(b):
                response = response_times(in_turn_order(b + [c], targets, model), rates,
                                          model)
                return (max(deviation(response[x.name], targets[x.name]) for x in b + [c]),
                        load(b + [c], rates, model))
            min(bins, key=worst).append(c)
    out, met, below = [], True, []
    for b in bins:
        ok, response, rho = _viable(b, rates, targets, hw, rho_max, model)
        met = met and ok
        below += [c.name for c in b if deviation(response[c.name], targets[c.name]) < lw]
        out.append(Worker(in_turn_order(b, targets, model), response, rho))
    return Placement(out, met, sorted(below))


def executors(cal: "Calibration", rate: float, target: float, hw: float = 0.0,
              rho_max: float = 0.8, limit: int = 4096) -> int | None:
    """The fewest executors of one core each, among which a stream of ``rate`` events/s
    divides evenly (keyed or time-sliced parts), each running the shared plan, such that
    the response time stays within ``hw`` of ``target`` (s) and the load under
    ``rho_max``; None if no number up to ``limit`` does (the target is below what one
    payload takes)."""
    names = list(cal.shared)  # the shared plan: its queries, one stream
    model = cal.model({q: "the stream" for q in names})
    for k in range(1, limit + 1):
        rates = {q: rate / cal.batch_events / k for q in names}
        costs = list(cal.costs(True, rates).values())
        if load(costs, rates, model) <= rho_max and deviation(
                response_times(costs, rates, model)[names[0]], target) <= hw:
            return k
    return None


# ------------------------------------------------------------------ calibration

CALIBRATION_VERSION = 3  # 2: the same without load points (read as such)


@dataclass(frozen=True)
class LoadPoint:
    """The costs per payload measured with payloads arriving at ``rate`` per second
    (Poisson): the same as ``Calibration``'s, which are measured one payload at a time.
    A service that falls behind takes the waiting payloads in one step, cheaper per
    payload, so its time per payload falls as the rate rises."""

    rate: float
    alone: dict[str, QueryCost]
    shared: dict[str, QueryCost]
    shared_b: float


def _at(name: str, low: QueryCost, points: Sequence[tuple[float, QueryCost]],
        rate: float) -> QueryCost:
    """A cost at ``rate`` payloads/s: linear between the measured points (``low``, one
    payload at a time, at rate 0), the last point's above it."""
    r0, c0 = 0.0, low
    for r1, c1 in points:
        if rate < r1:
            t = (rate - r0) / (r1 - r0)
            b = c0.b + t * (c1.b - c0.b)
            return QueryCost(name, b, max(c0.m2 + t * (c1.m2 - c0.m2), b * b))
        r0, c0 = r1, c1
    return QueryCost(name, c0.b, c0.m2)


@dataclass
class Calibration:
    """Per payload of ``batch_events`` events: each query's processing time measured
    alone (``alone``) and charged from the shared plan (``shared``: each query's alone
    cost scaled by shared plan / sum of alone, so the charges add up to what the shared
    plan costs); the worker's own ``overhead`` per payload; and the ``delay``: what a
    match waits beyond its processing at low load (the journal's commit and the
    wake-up, less what of a step comes after the matches are out), in the one service
    and before a worker's first consumer (``consumer_delay``); a ``checkpoint``'s
    duration and the service's interval between them. ``payloads``: how many were
    timed; ``shared_b``: the shared plan's mean time per payload, its overhead
    included. All
    of these one payload at a time (low load); ``points``: the costs again at higher
    arrival rates (live calibration), which ``costs`` and ``consumer_costs``
    interpolate for the rate a prediction is for."""

    batch_events: int
    payloads: int
    alone: dict[str, QueryCost]
    shared: dict[str, QueryCost]
    shared_b: float
    overhead: QueryCost
    delay: float
    checkpoint: QueryCost
    checkpoint_every: float
    consumer_delay: float       # the delay of a worker's first consumer
    points: list[LoadPoint] = field(default_factory=list)  # by rate

    def costs(self, shared: bool = True, rates: Mapping[str, float] | None = None
              ) -> dict[str, QueryCost]:
        """Each query's cost (charged from the shared plan, or alone) at its stream's
        rate in payloads/s (``rates``; without: one payload at a time)."""
        low = self.shared if shared else self.alone
        if not rates or not self.points:
            return low
        return {q: _at(q, c, [(p.rate, (p.shared if shared else p.alone)[q])
                              for p in self.points], rates.get(q, 0.0))
                for q, c in low.items()}

    def model(self, stream_of: Mapping[str, str]) -> WorkerModel:
        return WorkerModel(self.overhead, self.delay, stream_of, self.checkpoint,
                           self.checkpoint_every)

    def consumer_costs(self, rate: float | None = None) -> dict[str, QueryCost]:
        """Each query as a journal consumer of its own (``dqcep run --workers``) with
        the stream at ``rate`` payloads/s (None: one payload at a time): its cost alone
        plus the worker's own work, which every consumer does again (correlated parts:
        the second moments add as their square roots)."""
        o = self.overhead
        alone = self.costs(False, None if rate is None else
                           {q: rate for q in self.alone})
        return {q: QueryCost(q, c.b + o.b, (math.sqrt(c.m2) + math.sqrt(o.m2)) ** 2)
                for q, c in alone.items()}

    def consumer_model(self, names: Sequence[str]) -> WorkerModel:
        """The model of a worker of consumers: they take every payload in turn, so a
        worker's queries are one class (the next payload waits for all of them) and
        each answers after the consumers before it; the own work is in each consumer's
        cost."""
        return WorkerModel(None, self.consumer_delay, {q: "the stream" for q in names},
                           self.checkpoint, self.checkpoint_every, in_turn=True)

    def to_json(self) -> dict:
        def costs(d):
            return {q: {"b": c.b, "m2": c.m2} for q, c in d.items()}
        return {"version": CALIBRATION_VERSION, "batch_events": self.batch_events,
                "payloads": self.payloads, "alone": costs(self.alone),
                "shared": costs(self.shared), "shared_b": self.shared_b,
                "overhead": {"b": self.overhead.b, "m2": self.overhead.m2},
                "delay": self.delay,
                "checkpoint": {"b": self.checkpoint.b, "m2": self.checkpoint.m2,
                               "every": self.checkpoint_every},
                "consumer_delay": self.consumer_delay,
                "points": [{"rate": p.rate, "alone": costs(p.alone), "shared": costs(p.shared),
                            "shared_b": p.shared_b} for p in self.points]}

    @classmethod
    def load(cls, path: str) -> "Calibration":
        """The calibration file ``path`` (``dqcep calibrate -o``), read: what cannot be
        read is a UserError that names the file (bad JSON with its line and column).
        The one loader of ``dqcep capacity``, ``dqcep run --target`` and a query added
        live to workers under targets."""
        import json

        from dqcep.core.errors import UserError
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_json(json.load(f), path)
        except OSError as err:
            raise UserError(f"cannot read calibration {path}: {err.strerror}") from None
        except json.JSONDecodeError as err:
            raise UserError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") \
                from None
        except (ValueError, RecursionError) as err:  # not UTF-8; nested too deeply
            raise UserError(f"cannot read calibration {path}: {err}") from None

    @classmethod
    def from_json(cls, obj: dict, source: str = "calibration") -> "Calibration":
        from dqcep.core.errors import UserError
        try:
            if obj["version"] not in (2, CALIBRATION_VERSION):
                raise UserError(f"{source}: calibration format {obj['version']}; this dqcep "
                                f"reads 2 and {CALIBRATION_VERSION} (run dqcep calibrate "
                                "again)")

            # every field by the rule of its kind (dqcep.core.limits): a zero batch, a NaN
            # or an infinity is one line here, not a ZeroDivisionError or a NaN later
            def seconds(v, what, rule=SECONDS):
                return rule.field(v, f"{source}: {what}")

            def cost(q, v):
                return QueryCost(q, seconds(v["b"], f"{q} b"),
                                 seconds(v["m2"], f"{q} m2", SECONDS_SQUARED))

            def costs(d):
                return {q: cost(q, v) for q, v in d.items()}
            return cls(COUNT.field(obj["batch_events"], f"{source}: batch_events"),
                       COUNT.field(obj["payloads"], f"{source}: payloads"),
                       costs(obj["alone"]),
                       costs(obj["shared"]), seconds(obj["shared_b"], "shared_b"),
                       cost("overhead", obj["overhead"]), seconds(obj["delay"], "delay"),
                       cost("checkpoint", obj["checkpoint"]),
                       seconds(obj["checkpoint"]["every"], "checkpoint every", POSITIVE),
                       seconds(obj["consumer_delay"], "consumer_delay"),
                       sorted((LoadPoint(seconds(p["rate"], "point rate", POSITIVE),
                                         costs(p["alone"]), costs(p["shared"]),
                                         seconds(p["shared_b"], "point shared_b"))
                               for p in obj.get("points", [])), key=lambda p: p.rate))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise UserError(f"{source}: not a calibration written by dqcep calibrate "
                            f"({type(err).__name__}: {err})") from None


def moments(samples: Sequence[float]) -> tuple[float, float]:
    """(mean, second moment) of service times."""
    if not len(samples):
        raise ValueError("no payload was processed")
    b = sum(samples) / len(samples)
    return b, max(sum(t * t for t in samples) / len(samples), b * b)


def without(run: tuple[float, float], overhead: tuple[float, float]) -> QueryCost:
    """A run's (mean, second moment) per payload less the worker's own work, as a
    query's cost: the means subtract; the second moment is the run's less what the
    overhead adds when taken as a constant, ``m2 - 2 o b + o^2`` (at least b^2)."""
    b = max(run[0] - overhead[0], 0.0)
    m2 = run[1] - 2 * overhead[0] * run[0] + overhead[0] ** 2
    return QueryCost("", b, max(m2, b * b))


def _charged(alone: Mapping[str, tuple[float, float]], shared: tuple[float, float],
             overhead: tuple[float, float]) -> tuple[dict, dict]:
    """Each query's cost alone (its run's less the overhead) and charged from the
    shared plan (the plan's less the overhead, in proportion to the costs alone)."""
    mine = {q: QueryCost(q, c.b, c.m2) for q, c in
            ((q, without(run, overhead)) for q, run in alone.items())}
    plan = without(shared, overhead)
    total = sum(c.b for c in mine.values())
    scale = plan.b / total if total > 0 else 0.0
    return mine, {q: QueryCost(q, c.b * scale, c.m2 * scale * scale) for q, c in mine.items()}


def from_moments(batch_events: int, payloads: int, alone: Mapping[str, tuple[float, float]],
                 shared: tuple[float, float], overhead: tuple[float, float],
                 delay: float, checkpoint: tuple[float, float] = (0.0, 0.0),
                 checkpoint_every: float = 1.0, consumer_delay: float | None = None,
                 points: Sequence[tuple[float, Mapping[str, tuple[float, float]],
                                        tuple[float, float]]] = ()) -> Calibration:
    """The calibration from (mean, second moment) of the time per payload of each query
    alone and of the shared plan, both with the worker's own work, and of that work
    alone (``overhead``). A query's cost is its run's less the overhead; the shared
    plan's is charged to the queries in proportion to their means alone. ``points``:
    (rate, alone, shared) measured at higher arrival rates, charged the same way."""
    mine, charged = _charged(alone, shared, overhead)
    at = sorted((LoadPoint(rate, *_charged(a, sh, overhead), sh[0])
                 for rate, a, sh in points), key=lambda p: p.rate)
    return Calibration(batch_events, payloads, mine, charged, shared[0],
                       QueryCost("overhead", *overhead), delay,
                       QueryCost("checkpoint", *checkpoint), checkpoint_every,
                       delay if consumer_delay is None else consumer_delay, at)
