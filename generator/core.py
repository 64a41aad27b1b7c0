"""The stream: profile blocks + planted occurrences + imperfections, in arrival order.

Determinism: events are produced in fixed internal blocks of ``BLOCK`` events,
block b drawing from ``default_rng([seed, stream, b])``. Output chunking only
re-slices the result, so the same configuration gives the same events whatever
the chunk size, and the same bytes for the same chunk size.

Memory: one block, the planted occurrences in flight and the events still
waiting for their (delayed) arrival; independent of the stream's length.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from dqcep.core.batch import MISSING, EventBatch, Malformed
from dqcep.core.errors import UserError
from dqcep.lang import parse_file
from dqcep.generator.config import GeneratorConfig
from dqcep.generator.planting import Planter
from dqcep.generator.profiles import PROFILES

BLOCK = 65_536
BACKGROUND_STREAM, IMPERFECTION_STREAM, SKEW_STREAM = 1, 2, 4


@dataclass
class Summary:
    events: int = 0            # distinct events (ids)
    records: int = 0           # records written (events + duplicate copies)
    planted_events: int = 0
    occurrences: int = 0       # complete planted occurrences (ground-truth lines)
    suppressed: int = 0        # background events left out around planted occurrences
    delayed: int = 0           # arrive after a later event, within the slack
    late: int = 0              # delayed beyond the slack
    duplicates: int = 0
    missing_attributes: int = 0
    malformed: int = 0
    skewed_sources: int = 0
    by_type: dict[str, int] = field(default_factory=dict)

    def imperfection_line(self) -> str:
        return (f"delayed {self.delayed}, late {self.late}, duplicates {self.duplicates}, "
                f"missing attributes {self.missing_attributes}, malformed {self.malformed}, "
                f"skewed sources {self.skewed_sources}")


class StreamGenerator:
    def __init__(self, cfg: GeneratorConfig):
        self.cfg = cfg
        profile_cls = PROFILES[cfg.profile][0]
        try:
            self.profile = profile_cls(cfg.profile_config)
        except ValueError as err:
            raise UserError(str(err)) from None
        self.schema = self.profile.schema
        self.summary = Summary()
        imp = cfg.imperfections
        skew_rng = np.random.default_rng([cfg.seed, SKEW_STREAM])
        self.skew = (skew_rng.integers(-imp.clock_skew, imp.clock_skew + 1,
                                       self.profile.n_sources)
                     if imp.clock_skew else np.zeros(self.profile.n_sources, np.int64))
        self.summary.skewed_sources = int(np.count_nonzero(self.skew))
        self.planter = None
        if cfg.plant.queries:
            queries = parse_file(cfg.plant.queries).queries
            if cfg.plant.query:
                queries = [q for q in queries if q.name == cfg.plant.query]
                if not queries:
                    raise UserError(f"no query named {cfg.plant.query!r} in "
                                    f"{cfg.plant.queries}")
            self.planter = Planter(list(queries), self.profile, cfg.seed, float(cfg.start_ts),
                                   cfg.plant.every, imp.clock_skew)
        self.truth: list[dict] = []  # ground truth lines completed so far (drained by callers)
        self.next_id = 1

    # ------------------------------------------------------------------ blocks
    def _merged_block(self, b: int, t0: float, remaining: int):
        """One block of background (+ planted) events in true-time order."""
        rng = np.random.default_rng([self.cfg.seed, BACKGROUND_STREAM, b])
        blk = self.profile.block(rng, BLOCK, t0)
        t_end = float(blk.ts[-1])
        cols = blk.columns
        times, types, sources = blk.ts, blk.type, blk.source
        planted_from = len(times)
        refs = []
        if self.planter is not None:
            self.planter.plan_until(t_end)
            keep = ~self.planter.suppressed(times, types)
            self.summary.suppressed += int((~keep).sum())
            times, types, sources = times[keep], types[keep], sources[keep]
            cols = {k: v[keep] for k, v in cols.items()}
            planted_from = len(times)
            refs = self.planter.take_until(t_end)
            if refs:
                times = np.concatenate([times, [o.times[i] for o, i in refs]])
                types = np.concatenate([types, [o.types[i] for o, i in refs]]).astype(np.int32)
                sources = np.concatenate([sources, np.full(len(refs), -1, np.int32)])
                cols = {k: np.concatenate([v, np.array([o.columns[k][i] for o, i in refs],
                                                       dtype=v.dtype)])
                        for k, v in cols.items()}
        order = np.argsort(times, kind="stable")[:remaining]
        planted = order >= planted_from
        if self.planter is not None:
            for pos in np.flatnonzero(planted):
                self.planter.assign(*refs[order[pos] - planted_from], self.next_id + int(pos))
        return (times[order], types[order], sources[order], {k: v[order] for k, v in cols.items()},
                planted, t_end)

    def _imperfect(self, b: int, batch: EventBatch, true_ts: np.ndarray, planted: np.ndarray,
                   sources: np.ndarray):
        """Apply the imperfection knobs; return the records and their arrival times."""
        imp, s = self.cfg.imperfections, self.summary
        rng = np.random.default_rng([self.cfg.seed, IMPERFECTION_STREAM, b])
        n = len(batch)
        u = rng.random((5, n))
        background = ~planted
        if imp.clock_skew:
            has_source = sources >= 0
            batch.ts[has_source] += self.skew[sources[has_source]]
        if imp.missing_attributes and self.schema.attrs:
            names = [name for name, _ in self.schema.attrs]
            present = np.stack([batch.present(name) for name in names])   # attrs x n
            count = present.sum(axis=0)
            hit = (u[0] < imp.missing_attributes) & background & (count > 0)
            # drop the r-th present attribute, r uniform over the row's present ones
            r = np.floor(rng.random(n) * count).astype(np.int64)
            rank = np.cumsum(present, axis=0) - 1
            for a, name in enumerate(names):
                rows = hit & present[a] & (rank[a] == r)
                batch.columns[name][rows] = MISSING[self.schema.kind(name)]
            s.missing_attributes += int(hit.sum())
        if imp.malformed:
            bad = (u[1] < imp.malformed) & background
            batch.malformed = np.where(bad, rng.integers(1, len(Malformed), n), 0).astype(np.int8)
            s.malformed += int(bad.sum())
        delay = np.zeros(n)
        if imp.out_of_order or imp.late:
            delayed = u[2] < imp.out_of_order
            late = (u[2] >= imp.out_of_order) & (u[2] < imp.out_of_order + imp.late)
            delay[delayed] = u[3][delayed] * imp.slack
            delay[late] = imp.slack + 1 + u[3][late] * (imp.late_max - imp.slack)
            s.delayed += int(delayed.sum())
            s.late += int(late.sum())
        arrival = true_ts + delay
        if imp.duplicates:
            dup = (u[4] < imp.duplicates) & background
            s.duplicates += int(dup.sum())
            idx = np.flatnonzero(dup)
            batch = EventBatch.concat([batch, batch.take(idx)])
            arrival = np.concatenate([arrival, arrival[idx] + 1 + u[3][idx] * max(imp.slack, 1)])
        return batch, arrival

    # ------------------------------------------------------------------ stream
    def batches(self, chunk_size: int = BLOCK) -> Iterator[EventBatch]:
        """The stream in arrival order, as batches of ``chunk_size`` records."""
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.next_id = 1
        t = float(self.cfg.start_ts)
        waiting: list[tuple[EventBatch, np.ndarray]] = []  # records not yet arrived
        carry: EventBatch | None = None  # arrived records short of a whole chunk
        b = 0
        while self.next_id <= self.cfg.events:
            remaining = self.cfg.events - self.next_id + 1
            times, types, sources, cols, planted, t_end = self._merged_block(b, t, remaining)
            n = len(times)
            true_ts = np.floor(times).astype(np.int64)
            batch = EventBatch(self.schema, np.arange(self.next_id, self.next_id + n,
                                                      dtype=np.int64),
                               true_ts.copy(), types.astype(np.int32), cols)
            self.next_id += n
            self.summary.events += n
            self.summary.planted_events += int(planted.sum())
            batch, arrival = self._imperfect(b, batch, true_ts, planted, sources)
            waiting.append((batch, arrival))
            done = self.next_id > self.cfg.events
            ready, waiting = _arrived(waiting, None if done else t_end)
            if ready is not None:
                carry = ready if carry is None else EventBatch.concat([carry, ready])
            if self.planter is not None:
                self._collect_truth()
            if carry is not None:
                # whole chunks now; at the end also the last, shorter one
                upto = len(carry) if done else len(carry) // chunk_size * chunk_size
                for start in range(0, upto, chunk_size):
                    chunk = carry.take(slice(start, min(start + chunk_size, upto)))
                    self._count(chunk)
                    yield chunk
                carry = carry.take(slice(upto, None)) if upto < len(carry) else None
            t = t_end
            b += 1

    def _collect_truth(self) -> None:
        for occ in self.planter.complete():
            self.summary.occurrences += 1
            self.truth.append({"query": occ.query, "occurrence": occ.index,
                               "events": {v: occ.ids[v] for v in occ.vars}})

    def _count(self, batch: EventBatch) -> None:
        self.summary.records += len(batch)
        counts = np.bincount(batch.type, minlength=len(self.schema.types))
        for t, c in zip(self.schema.types, counts):
            if c:
                self.summary.by_type[t] = self.summary.by_type.get(t, 0) + int(c)


def _arrived(waiting, horizon):
    """Split the waiting records into those arrived by ``horizon`` (None: all), in order."""
    batch = EventBatch.concat([w[0] for w in waiting])
    arrival = np.concatenate([w[1] for w in waiting])
    seq = np.arange(len(arrival))
    order = np.lexsort((seq, arrival))
    cut = len(order) if horizon is None else int(np.searchsorted(arrival[order], horizon,
                                                                   side="right"))
    ready = batch.take(order[:cut]) if cut else None
    rest = order[cut:]
    return ready, ([(batch.take(rest), arrival[rest])] if len(rest) else [])


def generate(cfg: GeneratorConfig, chunk_size: int = BLOCK) -> Iterator[EventBatch]:
    """Library entry point: the configured stream as columnar batches."""
    return StreamGenerator(cfg).batches(chunk_size)
