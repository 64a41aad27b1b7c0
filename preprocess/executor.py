"""What runs inside Spark's Python workers: events as engine columns, the pushdown
filter, partition assignment and the native engine per partition.

Events travel through Spark as rows whose ``event`` column holds the event map
as msgpack; a worker joins a batch of them into one ``{"events": [...]}``
payload and decodes it with the engine's ColumnDecoder kernel (no Python object
per event). Everything here is plain functions over pandas DataFrames, so the
tests call them without Spark too.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Iterator

import msgpack
import numpy as np
import pandas as pd

from dqcep.io.sinks import match_lines
from dqcep.lang import ast, parse
from dqcep.runtime import Engine, EventColumns, late_rule
from dqcep.runtime.program import program_for
from dqcep.runtime.compile import KIND_MISSING, KIND_STR
from dqcep.spark.partitioning import BROADCAST, Partitioning

GROUP_KEYED, GROUP_SLICED = 0, 1


def batch_payload(events) -> bytes:
    """msgpack event maps (a sequence of bytes) -> one ``{"events": [...]}`` payload."""
    packer = msgpack.Packer()
    return b"\x81\xa6events" + packer.pack_array_header(len(events)) + b"".join(events)


def event_columns(engine: Engine, events) -> EventColumns:
    decoder = engine.column_decoder()
    if decoder.decode(batch_payload(events)) < 0:
        raise ValueError("an event row does not decode; rows must come from the event source")
    return EventColumns(*decoder.take())


def record_lines(df: pd.DataFrame, kind: str) -> list[str]:
    """The JSON lines of the dead-letter (``where``, ``reason``) or late (``where``,
    ``event``) outputs, for the batch and the streaming job alike."""
    if kind == "dead":
        return [json.dumps({"where": w, "reason": r}, ensure_ascii=False)
                for w, r in zip(df["where"], df["reason"])]
    return [json.dumps({"where": w, "event": msgpack.unpackb(e, raw=False)}, ensure_ascii=False)
            for w, e in zip(df["where"], df["event"])]


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser over uint64 (vectorised)."""
    h = h.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(31)
    return h


def key_parts(engine: Engine, cols: EventColumns, attr: str, n: int):
    """(present mask, partition of the value) of one key attribute, per event.

    Equal values under the spec's equality get equal partitions in every worker:
    numbers by their float64 value (1 and 1.0 are equal), strings by their
    UTF-8 bytes (not by the worker's dictionary codes), booleans apart from both.
    """
    a = engine.attr_index[attr]
    kind, val = cols.kind[:, a], cols.val[:, a].copy()
    present = kind != KIND_MISSING
    val[val == 0.0] = 0.0  # -0.0 and 0.0 are equal
    bits = val.view(np.uint64)
    strings = kind == KIND_STR
    if strings.any():  # one crc32 per distinct string, not per event
        values = engine.dictionary.values
        distinct, where = np.unique(val[strings].astype(np.int64), return_inverse=True)
        crc = np.array([zlib.crc32(values[c].encode()) for c in distinct.tolist()], np.uint64)
        bits = bits.copy()
        bits[strings] = crc[where]
    h = _mix(bits ^ (kind.astype(np.uint64) << np.uint64(56)))
    return present, (h % np.uint64(n)).astype(np.int64)


@dataclass(frozen=True)
class JobSpec:
    """What every worker needs: the queries' text and how they are partitioned."""

    queries_text: str
    partitioning: Partitioning
    partitions: int         # keyed: number of key partitions
    slice_ms: int = 0       # time slices: length L

    def engine(self, names=None) -> Engine:
        """A fresh engine for the queries named (all when None). Its program is
        compiled once per worker process (``program_for``), however many engines
        are made (one per part and micro-batch in the streaming job)."""
        return Engine(program_for(self.queries_text, None if names is None else tuple(names)))


# ------------------------------------------------------------------ pushdown

def late_flags(before: pd.Series, ts: pd.Series, lateness: int) -> np.ndarray:
    """The engine's late rule (``dqcep.runtime.late_rule``) over Spark rows: ``before``
    is the largest ts that arrived before each row (its own ts where nothing did).

    Both must come as int64, so the caller fills nulls in Spark SQL: a null turns a
    pandas column of longs into float64, which holds a ts exactly only up to 2**53."""
    if before.dtype != np.int64 or ts.dtype != np.int64:
        raise TypeError(f"late_flags needs int64 columns without nulls, got {before.dtype} "
                        f"and {ts.dtype}")
    return late_rule(before.to_numpy(), ts.to_numpy(), lateness)


def pushdown_batches(spec: JobSpec, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Keep the events some query can use (``Engine.needed``)."""
    engine = spec.engine()
    for df in batches:
        if len(df):
            df = df[engine.needed(event_columns(engine, df["event"].tolist()))]
        yield df


# ----------------------------------------------------------------- partitions

def slices_of(ts: np.ndarray, length: int, overlap: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) slice index per event: slice i holds iL - W <= ts < (i+1)L + W."""
    return np.floor_divide(ts - overlap, length), np.floor_divide(ts + overlap, length)


class Assigner:
    """Each event row once per (group, part) it must reach (adds columns group, part)."""

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.engine = spec.engine()
        code = self.engine.type_code
        sliced = [q for q in parse(spec.queries_text).queries
                  if q.name in spec.partitioning.sliced]
        self.sliced_types = [code[e.type] for q in sliced
                             for e, _ in ast.event_patterns(q.pattern) if e.type in code]

    def assign(self, df: pd.DataFrame, cols: EventColumns | None = None) -> pd.DataFrame | None:
        """``cols``: the rows' events already decoded by ``self.engine``, if at hand."""
        spec, p, engine = self.spec, self.spec.partitioning, self.engine
        if cols is None:
            cols = event_columns(engine, df["event"].tolist())
        rows, groups, parts = [], [], []
        if p.keyed:
            for etype, attrs in p.roles.items():
                code = engine.type_code.get(etype)
                of_type = np.flatnonzero(cols.type == code) if code is not None else []
                if not len(of_type):
                    continue
                if BROADCAST in attrs:
                    rows.append(np.repeat(of_type, spec.partitions))
                    parts.append(np.tile(np.arange(spec.partitions), len(of_type)))
                    continue
                sub = cols.take(of_type)
                found = [key_parts(engine, sub, attr, spec.partitions) for attr in attrs]
                r = np.concatenate([of_type[present] for present, _ in found])
                t = np.concatenate([part[present] for present, part in found])
                if len(attrs) > 1:  # one copy per distinct partition
                    r, t = np.unique(np.stack([r, t]), axis=1)
                rows.append(r)
                parts.append(t)
            groups.append(np.full(sum(len(r) for r in rows), GROUP_KEYED))
        if p.sliced:
            use = np.flatnonzero(np.isin(cols.type, self.sliced_types))
            first, last = slices_of(cols.ts[use], spec.slice_ms, p.slice_window)
            count = last - first + 1
            r = np.repeat(use, count)
            offset = np.arange(len(r)) - np.repeat(np.cumsum(count) - count, count)
            rows.append(r)
            parts.append(np.repeat(first, count) + offset)
            groups.append(np.full(len(r), GROUP_SLICED))
        if not rows:
            return None
        out = df.iloc[np.concatenate(rows)].reset_index(drop=True)
        out["group"] = np.concatenate(groups).astype(np.int32)
        out["part"] = np.concatenate(parts).astype(np.int64)
        return out


def assign_batches(spec: JobSpec, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    assigner = Assigner(spec)
    for df in batches:
        if len(df) and (out := assigner.assign(df)) is not None:
            yield out


# --------------------------------------------------------------------- engine

class _Lookup:
    """id -> (ts, key partition per attribute) for the recent events of one part."""

    def __init__(self, horizon: int):
        self.horizon = horizon
        self.chunks: list[tuple[int, np.ndarray, np.ndarray, dict]] = []

    def add(self, cols: EventColumns, parts: dict[str, np.ndarray]) -> None:
        if len(cols.ts):
            self.chunks.append((int(cols.ts.max()), cols.id, cols.ts, parts))

    def prune(self) -> None:
        """Forget what no match still to come can name (called after each emit)."""
        if self.chunks:
            newest = max(c[0] for c in self.chunks)
            self.chunks = [c for c in self.chunks if c[0] >= newest - self.horizon]

    def find(self, ids: np.ndarray):
        all_ids = np.concatenate([c[1] for c in self.chunks])
        order = np.argsort(all_ids, kind="stable")
        pos = np.minimum(np.searchsorted(all_ids[order], ids), len(order) - 1)
        at = order[pos]
        if not np.array_equal(all_ids[at], ids):
            raise RuntimeError("a match names an event the partition no longer holds")
        ts = np.concatenate([c[2] for c in self.chunks])[at]
        parts = {a: np.concatenate([c[3][a] for c in self.chunks])[at]
                 for a in self.chunks[0][3]}
        return ts, parts


class PartRunner:
    """The native engine of one (group, part), and the matches it owns.

    ``feed`` takes the part's events in (ts, arrival) order; ``advance`` moves
    event time on (held matches come out); ``flush`` closes the stream. Each
    returns a DataFrame (query, detected_at, line) of the owned matches, or None.
    ``snapshot``/``restore`` carry the whole state (engine and the recent
    events' ts and key partitions) between micro-batches of a streaming job.
    """

    def __init__(self, spec: JobSpec, group: int, part: int):
        p = spec.partitioning
        self.spec, self.group, self.part = spec, group, part
        names = [k.name for k in p.keyed] if group == GROUP_KEYED else list(p.sliced)
        self.engine = spec.engine(names)
        self.keyed = {k.name: k for k in p.keyed}
        self.owner_attrs = sorted({a for k in p.keyed for _, a in k.keys}) \
            if group == GROUP_KEYED else []
        self.lookup = _Lookup(self.engine.store_retention)

    def feed(self, events) -> pd.DataFrame | None:
        """Events (msgpack maps, in ts then arrival order)."""
        cols = event_columns(self.engine, events)
        parts = {a: key_parts(self.engine, cols, a, self.spec.partitions)[1]
                 for a in self.owner_attrs}
        self.lookup.add(cols, parts)
        out = self._owned(self.engine.process(cols))
        self.lookup.prune()
        return out

    def advance(self, wm: int) -> pd.DataFrame | None:
        return self._owned(self.engine.advance_watermark(wm))

    def flush(self) -> pd.DataFrame | None:
        return self._owned(self.engine.flush())

    def snapshot(self) -> bytes:
        chunks = [(m, ids.tobytes(), ts.tobytes(), {a: v.tobytes() for a, v in parts.items()})
                  for m, ids, ts, parts in self.lookup.chunks]
        return msgpack.packb([self.engine.snapshot(), chunks], use_bin_type=True)

    def restore(self, blob: bytes) -> None:
        engine, chunks = msgpack.unpackb(blob, raw=False)
        self.engine.restore(engine)
        self.lookup.chunks = [
            (m, np.frombuffer(ids, np.int64), np.frombuffer(ts, np.int64),
             {a: np.frombuffer(v, np.int64) for a, v in parts.items()})
            for m, ids, ts, parts in chunks]

    def _owned(self, mb) -> pd.DataFrame | None:
        out = []
        for q, detected, ids in mb.parts:
            if not len(detected):
                continue
            name, variables = mb.queries[q]
            bound = ids >= 0
            some = ids[bound][0]  # stands in for unbound slots in lookups
            ts, parts = self.lookup.find(np.where(bound, ids, some).ravel())
            if self.group == GROUP_KEYED:  # the key partition of the first bound variable
                owner = np.full(len(ids), -1, dtype=np.int64)
                for var, attr in self.keyed[name].keys:
                    j = variables.index(var)
                    fill = (owner < 0) & bound[:, j]
                    owner[fill] = parts[attr].reshape(ids.shape)[fill, j]
                keep = owner == self.part
            else:  # the slice holding the match's start
                ts = np.where(bound.ravel(), ts, np.iinfo(np.int64).max).reshape(ids.shape)
                keep = np.floor_divide(ts.min(axis=1), self.spec.slice_ms) == self.part
            if keep.any():
                out.append((q, detected[keep], ids[keep]))
        if not out:
            return None
        mb.parts = out
        lines = match_lines(mb).decode().splitlines()
        queries = [mb.queries[q][0] for q, d, _ in out for _ in range(len(d))]
        detected = np.concatenate([d for _, d, _ in out])
        return pd.DataFrame({"query": queries, "detected_at": detected, "line": lines})


def engine_batches(spec: JobSpec, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """Rows sorted by (group, part, ts, arrival): one PartRunner per (group, part)."""
    runner = None
    for df in batches:
        if not len(df):
            continue
        g, pt = df["group"].to_numpy(), df["part"].to_numpy()
        bounds = np.flatnonzero((g[1:] != g[:-1]) | (pt[1:] != pt[:-1])) + 1
        for run in np.split(np.arange(len(df)), bounds):
            group, part = int(g[run[0]]), int(pt[run[0]])
            if runner is None or (runner.group, runner.part) != (group, part):
                if runner is not None and (out := runner.flush()) is not None:
                    yield out
                runner = PartRunner(spec, group, part)
            if (out := runner.feed(df["event"].iloc[run].tolist())) is not None:
                yield out
    if runner is not None and (out := runner.flush()) is not None:
        yield out
