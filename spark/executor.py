"""What runs inside Spark's Python workers: routing (late events, repeats, pushdown,
partition assignment), and the native engine per partition.

Source rows hold each event map as msgpack; the batch job's ``Router`` decodes a
batch of them once with the engine's ColumnDecoder kernel (no Python object per
event), takes the fast paths' ``ColumnPiece``s already in columns, and hands the
engines their columns through the shuffle; the streaming job decodes them where
its engines run. Everything here is plain functions over
Arrow batches or pandas DataFrames, so the tests call them without Spark too.
"""
from __future__ import annotations

import json
import zlib
import dataclasses
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pandas as pd

from dqcep.io.match_text import match_lines
from dqcep.lang import ast, parse
from dqcep.runtime import STATE_BUDGET, Engine, EventColumns, late_rule
from dqcep.runtime.program import program_for
from dqcep.core.tables import StaticTables
from dqcep.runtime.compile import KIND_MISSING, KIND_STR
from dqcep._kernels.timelines import Timelines
from dqcep.core.admission import LATE_REASONS, AdmissionRule
from dqcep.spark.partitioning import BROADCAST, Partitioning

GROUP_KEYED, GROUP_SLICED, GROUP_WHOLE = 0, 1, 2


def task_environment() -> list[str]:
    """Where this Python worker runs: its interpreter, its prefix and the dqcep it
    imported (``_stats.json``'s ``executors``: whether ``--archive`` took effect)."""
    import sys

    import dqcep
    return [sys.executable, sys.prefix, dqcep.__file__]


def sum_task_counts(lines) -> tuple[dict[str, int], list[list[str]]]:
    """The tasks' count lines (JSON, one per routed batch and per engine task) summed (a
    count no task gave is absent), and the distinct environments they ran in, sorted."""
    total: dict[str, int] = {}
    where = set()
    for line in lines:
        counts = json.loads(line)
        where.add(tuple(counts.pop("environment")))
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
    return total, [list(w) for w in sorted(where)]


def batch_payload(events) -> bytes:
    """msgpack event maps -> one ``{"events": [...]}`` payload: a sequence of bytes, or an
    Arrow binary array (its maps lie contiguous in its data buffer: no copy per event)."""
    head = b"\x81\xa6events" + msgpack.Packer().pack_array_header(len(events))
    if not hasattr(events, "buffers"):
        return head + b"".join(events)
    if not len(events):
        return head
    offsets = np.frombuffer(events.buffers()[1], np.int32, len(events) + 1, events.offset * 4)
    return head + events.buffers()[2][int(offsets[0]):int(offsets[-1])].to_pybytes()


def event_columns(engine: Engine, events) -> EventColumns:
    """msgpack event maps (as ``batch_payload`` takes them) -> the engine's columns."""
    decoder = engine.column_decoder()
    if decoder.decode(batch_payload(events)) < 0:
        raise ValueError("an event row does not decode; rows must come from the event source")
    return EventColumns(*decoder.take())


def record_lines(df, kind: str) -> list[str]:
    """The JSON lines of the dead-letter (``where``, ``reason``) or late (``where``,
    ``event``, ``reason``: lateness or skew) outputs, for the batch and the streaming
    job alike; ``df`` maps those column names to sequences (a pandas DataFrame, or a
    dict of lists)."""
    if kind == "dead":
        return [json.dumps({"where": w, "reason": r}, ensure_ascii=False)
                for w, r in zip(df["where"], df["reason"])]
    return [json.dumps({"where": w, "event": msgpack.unpackb(e, raw=False)} |
                       ({} if r is None else {"reason": r}), ensure_ascii=False)
            for w, e, r in zip(df["where"], df["event"],
                               df["reason"] if "reason" in df else [None] * len(df["where"]))]


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
    """What every worker needs: the queries' text and how they are partitioned, and
    the snapshots of the lookup tables the queries read (a Spark broadcast, or
    anything with ``.value``: ``{table name: dqcep.core.tables.TableSnapshot}``)."""

    queries_text: str
    partitioning: Partitioning
    partitions: int         # keyed: number of key partitions
    slice_ms: int = 0       # time slices: length L
    tables: Any = None      # broadcast snapshots of the lookup tables (None: no table)
    budget: int = STATE_BUDGET  # partial matches one buffer of a query may hold

    def engine(self, names=None, lateness: int = 0) -> Engine:
        """A fresh engine for the queries named (all when None). Its program is
        compiled once per worker process (``program_for``), however many engines
        are made (one per part and micro-batch in the streaming job); every engine
        reads the same snapshots of the lookup tables. A query over its budget fails
        the task with the engine's line (a UserError the driver says), not an executor
        out of memory: one part of a query stopped would be a wrong result."""
        source = None if self.tables is None else StaticTables(self.tables.value)
        return Engine(program_for(self.queries_text, None if names is None else tuple(names)),
                      lateness, lookup_source=source, budget=self.budget,
                      stop_over_budget=False)


@dataclass(frozen=True)
class Snapshots:
    """Lookup tables' snapshots by value, where a broadcast cannot go: ``.value`` as a
    broadcast's."""

    value: dict


def read_tables(parsed) -> Snapshots | None:
    """The lookup tables of a query file, read once on the driver (one consistent
    read each); None when the file has none."""
    if not parsed.tables:
        return None
    from dqcep.io.database import DatabaseTables
    tables = DatabaseTables(parsed.tables)
    try:
        return Snapshots(dict(tables.snapshots))
    finally:
        tables.close()


def broadcast_tables(spark, parsed):
    """``read_tables``, broadcast to the executors (each reads its copy once)."""
    tables = read_tables(parsed)
    return None if tables is None else spark.sparkContext.broadcast(tables.value)


# ------------------------------------------------------------------ the rules

def slices_of(ts: np.ndarray, length: int, overlap: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) slice index per event: slice i holds iL - W <= ts < (i+1)L + W."""
    return np.floor_divide(ts - overlap, length), np.floor_divide(ts + overlap, length)


class Assigner:
    """Where each event must go: once per (group, part) that may need it."""

    def __init__(self, spec: JobSpec, rule=None):
        """``rule``: the stream's ``AdmissionRule`` (its engine then reads the timeline
        attribute too, and admits by it: ``Engine.admit_columns``)."""
        self.spec = spec
        self.engine = spec.engine(lateness=rule or 0)
        code = self.engine.type_code
        queries = parse(spec.queries_text).queries

        def types_of(names):
            return [code[e.type] for q in queries if q.name in names
                    for e, _ in ast.event_patterns(q.pattern) if e.type in code]
        self.sliced_types = types_of(spec.partitioning.sliced)
        self.whole_types = types_of(spec.partitioning.whole)

    def targets(self, cols: EventColumns):
        """(event index, group, part) of every copy, or None when no part wants any;
        ``cols`` decoded by ``self.engine``."""
        spec, p, engine = self.spec, self.spec.partitioning, self.engine
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
            for attr in p.every_type_attrs:  # partition-contiguity: every type counts
                present, part = key_parts(engine, cols, attr, spec.partitions)
                rows.append(np.flatnonzero(present))
                parts.append(part[present])
            if p.every_type_attrs:  # one copy per (event, partition)
                r, t = np.unique(np.stack([np.concatenate(rows), np.concatenate(parts)]), axis=1)
                rows, parts = [r], [t]
            groups.append(np.full(sum(len(r) for r in rows), GROUP_KEYED))
        if p.sliced:
            use = np.flatnonzero(np.isin(cols.type, self.sliced_types)) \
                if not p.sliced_every_type else np.arange(len(cols.ts))
            first, last = slices_of(cols.ts[use], spec.slice_ms, p.slice_window)
            count = last - first + 1
            r = np.repeat(use, count)
            offset = np.arange(len(r)) - np.repeat(np.cumsum(count) - count, count)
            rows.append(r)
            parts.append(np.repeat(first, count) + offset)
            groups.append(np.full(len(r), GROUP_SLICED))
        if p.whole:  # not split: one copy, to part 0
            use = np.flatnonzero(np.isin(cols.type, self.whole_types))
            rows.append(use)
            parts.append(np.zeros(len(use), np.int64))
            groups.append(np.full(len(use), GROUP_WHOLE))
        if not rows:
            return None
        return (np.concatenate(rows), np.concatenate(groups).astype(np.int32),
                np.concatenate(parts).astype(np.int64))

    def assign(self, df: pd.DataFrame, cols: EventColumns) -> pd.DataFrame | None:
        """Rows of ``df`` (its events decoded as ``cols``) once per copy, with columns
        group and part (the streaming job's form)."""
        found = self.targets(cols)
        if found is None:
            return None
        rows, groups, parts = found
        out = df.iloc[rows].reset_index(drop=True)
        out["group"], out["part"] = groups, parts
        return out


# --------------------------------------------------------------------- engine

class _Lookup:
    """id -> (ts, key partition per attribute) for the recent events of one part."""

    def __init__(self):
        self.chunks: list[tuple[int, np.ndarray, np.ndarray, dict]] = []

    def add(self, cols: EventColumns, parts: dict[str, np.ndarray]) -> None:
        if len(cols.ts):
            self.chunks.append((int(cols.ts.max()), cols.id, cols.ts, parts))

    def prune(self, kept_since: int | None) -> None:
        """Forget what no match still to come can name: chunks whose events are all
        older than what the engine still holds (called after each emit)."""
        if kept_since is not None:
            self.chunks = [c for c in self.chunks if c[0] >= kept_since]

    def find(self, ids: np.ndarray):
        all_ids = np.concatenate([c[1] for c in self.chunks])
        at = _positions(all_ids, ids)
        if not np.array_equal(all_ids[at], ids):
            raise RuntimeError("a match names an event the partition no longer holds")
        ts = np.concatenate([c[2] for c in self.chunks])[at]
        parts = {a: np.concatenate([c[3][a] for c in self.chunks])[at]
                 for a in self.chunks[0][3]}
        return ts, parts


def _positions(held: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """For each of ``ids``, a position in ``held`` that holds it (any position where an
    id is not held: callers compare). A part holds an event once. Recent ids are mostly
    dense: a table indexed by id - smallest id (no sort, one gather per id) when the
    span is at most 8 slots per id held, else a sort and binary searches."""
    if not len(held):
        return np.zeros(len(ids), np.int64)
    lo, hi = int(held.min()), int(held.max())
    if hi - lo < 8 * len(held) + 64:
        table = np.zeros(hi - lo + 1, np.int64)
        table[held - lo] = np.arange(len(held))
        return table[np.clip(ids, lo, hi) - lo]
    order = np.argsort(held, kind="stable")
    return order[np.minimum(np.searchsorted(held[order], ids), len(order) - 1)]


class PartRunner:
    """The native engine of one (group, part), and the matches it owns.

    ``feed`` takes the part's events in (ts, arrival) order, as columns of this
    runner's engine; ``advance`` moves event time on (held matches come out);
    ``flush`` closes the stream. Each returns the owned matches as JSON lines
    (bytes, one per line, newline-terminated), or None.
    ``snapshot``/``restore`` carry the whole state (engine and the recent
    events' ts and key partitions) between micro-batches of a streaming job.
    """

    def __init__(self, spec: JobSpec, group: int, part: int, lateness: int = 0):
        """``lateness``: how far behind the part's latest event one may still come (the
        batch job feeds a part in ts order: 0; the streaming job one micro-batch at a
        time, each in ts order, and the journal's next batch may go back by the job's
        lateness, which the engine must hold for)."""
        p = spec.partitioning
        self.spec, self.group, self.part = spec, group, part
        names = [k.name for k in p.keyed] if group == GROUP_KEYED else \
            list(p.whole) if group == GROUP_WHOLE else list(p.sliced)
        self.engine = spec.engine(names, lateness)
        self.keyed = {k.name: k for k in p.keyed}
        self.owner_attrs = sorted({a for k in p.keyed for _, a in k.keys}) \
            if group == GROUP_KEYED else []
        self.lookup = _Lookup()
        self.matches = 0  # owned matches given out

    def feed(self, cols: EventColumns) -> bytes | None:
        parts = {a: key_parts(self.engine, cols, a, self.spec.partitions)[1]
                 for a in self.owner_attrs}
        self.lookup.add(cols, parts)
        out = self._owned(self.engine.process(cols))
        self.lookup.prune(self.engine.kept_since)
        return out

    def advance(self, wm: int) -> bytes | None:
        return self._owned(self.engine.advance_watermark(wm))

    def flush(self) -> bytes | None:
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

    def _owned(self, mb) -> bytes | None:
        out = []
        for q, detected, ids, lists in mb.parts:
            if not len(detected):
                continue
            name, variables = mb.queries[q]
            ids_for_owner = ids
            if lists is not None:  # a list stands for its first element: its key, its start
                ids_for_owner = ids.copy()
                for c, col in enumerate(lists.columns):
                    ids_for_owner[:, col] = lists.first(c)
            bound = ids_for_owner >= 0
            some = ids_for_owner[bound][0]  # stands in for unbound slots in lookups
            ts, parts = self.lookup.find(np.where(bound, ids_for_owner, some).ravel())
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
            if self.group == GROUP_WHOLE:  # its one part owns every match
                keep = np.ones(len(ids), bool)
            if keep.any():
                out.append((q, detected[keep], ids[keep],
                            lists.take(keep) if lists is not None else None))
        if not out:
            return None
        mb.parts = out
        self.matches += len(mb)
        return match_lines(mb)


# ------------------------------------------------------------ the batch job's rows
#
# The batch job's one shuffle carries rows of two sorts, in one schema:
# - event blocks (group >= 0): the events of one source batch bound for one (group,
#   part), as one row (``encode_block``: the routing engine's columns, sorted by (ts,
#   arrival), strings as strings: engines code strings with their own dictionaries),
#   keyed by the block's first event; the engine stage merges a part's blocks
#   (``_Merge``) and parses no event map. Millions of events cross the JVM, its
#   shuffle and its sort as a few thousand rows;
# - lines (group < 0): a line of an output (dead-letter, late) or of a task's counts
#   (_stats), passed through to the writer.

GROUP_LINES, GROUP_STATS = -1, -2
OUTPUT_SCHEMA = "output string, line string"
STATS = "_stats"
_MIN = np.iinfo(np.int64).min
ROUTED_FIELDS = [("group", "int"), ("part", "long"), ("ts", "long"), ("file_index", "long"),
                 ("seq", "long"), ("block", "binary"), ("output", "string"), ("line", "string")]
ROUTED_SCHEMA = ", ".join(f"`{name}` {kind}" for name, kind in ROUTED_FIELDS)
_ARROW = {"int": "int32", "long": "int64", "binary": "binary", "string": "string"}


def routed_arrow_schema():
    import pyarrow as pa
    return pa.schema([(name, pa.type_for_alias(_ARROW[kind])) for name, kind in ROUTED_FIELDS])


_BLOCK_HEAD = np.dtype([("n", "<i8"), ("attrs", "<i8"), ("strings", "<i8")])


def encode_block(engine: Engine, cols: EventColumns, files, seq) -> bytes:
    """Events (sorted by ts, arrival) -> one block: their columns, arrival, and the
    strings of their string cells (the part engines code strings their own way)."""
    n, attrs = cols.val.shape  # the stored attributes (no timeline column: stored_columns)
    val = cols.val.copy()
    strings = cols.kind == KIND_STR
    words = b""
    if strings.any():
        distinct, index = np.unique(val[strings].astype(np.int64), return_inverse=True)
        val[strings] = index
        values = engine.dictionary.values
        words = msgpack.packb([values[k] for k in distinct.tolist()])
    head = np.array([(n, attrs, len(words))], _BLOCK_HEAD)
    return b"".join([head.tobytes(), np.ascontiguousarray(cols.ts, np.int64).tobytes(),
                     np.ascontiguousarray(files, np.int64).tobytes(),
                     np.ascontiguousarray(seq, np.int64).tobytes(),
                     np.ascontiguousarray(cols.id, np.int64).tobytes(),
                     np.ascontiguousarray(cols.type, np.int32).tobytes(),
                     np.ascontiguousarray(val, np.float64).tobytes(),
                     np.ascontiguousarray(cols.kind, np.int8).tobytes(), words])


def decode_block(routing: Engine, engine: Engine, blob: bytes):
    """A block (in ``routing``'s layout) -> (ts, files, seq, EventColumns in ``engine``'s
    layout: its type codes, attributes and string dictionary)."""
    head = np.frombuffer(blob, _BLOCK_HEAD, 1)[0]
    n, attrs, words = int(head["n"]), int(head["attrs"]), int(head["strings"])
    at = _BLOCK_HEAD.itemsize

    def take(dtype, count):
        nonlocal at
        a = np.frombuffer(blob, dtype, count, at)
        at += a.nbytes
        return a

    ts, files, seq, ids = (take(np.int64, n) for _ in range(4))
    types = take(np.int32, n)
    val = take(np.float64, n * attrs).reshape(n, attrs)
    kind = take(np.int8, n * attrs).reshape(n, attrs)
    strings = msgpack.unpackb(blob[at:at + words], raw=False) if words else []
    pick = [routing.attrs.index(a) for a in engine.attrs]
    val, kind = val[:, pick].copy(), kind[:, pick].copy()
    coded = kind == KIND_STR
    if coded.any():
        val[coded] = engine.dictionary.codes_for(strings)[val[coded].astype(np.int64)]
    table = np.array([engine.type_code.get(t, -1) for t in routing.types] + [-1], np.int32)
    return ts, files, seq, EventColumns(ts.copy(), ids.copy(), table[types], val, kind)


def _block_rows(engine: Engine, cols: EventColumns, groups, parts, files, seq) -> dict:
    """Routed events -> one row per (group, part): its events' block, keyed by the
    block's first event."""
    order = np.lexsort((seq, files, cols.ts, parts, groups))
    g, p = groups[order], parts[order]
    starts = np.r_[0, np.flatnonzero((g[1:] != g[:-1]) | (p[1:] != p[:-1])) + 1] \
        if len(order) else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], len(order)]
    first = order[starts]
    blocks = [encode_block(engine, cols.take(order[lo:hi]), files[order[lo:hi]],
                           seq[order[lo:hi]]) for lo, hi in zip(starts.tolist(), ends.tolist())]
    return {"group": groups[first], "part": parts[first], "ts": cols.ts[first],
            "file_index": files[first], "seq": seq[first], "block": blocks}


class _Merge:
    """The blocks of one (group, part), which Spark's sort hands over in order of their
    first (smallest) ts, merged into (ts, arrival) order: no later block holds an event
    before the latest block's first ts, so the events before it are ready."""

    def __init__(self):
        self.pending = None  # (ts, files, seq, EventColumns), sorted

    def add(self, block) -> EventColumns | None:
        """Take a block; give the events now ready, in order (or None)."""
        head = block[0][0]
        merged = block if self.pending is None else _joined(self.pending, block)
        order = np.lexsort((merged[2], merged[1], merged[0]))
        ready = int(np.searchsorted(merged[0][order], head, side="left"))
        self.pending = _taken(merged, order[ready:])
        return _taken(merged, order[:ready])[3] if ready else None

    def rest(self) -> EventColumns | None:
        """The events still held (the part's last)."""
        out, self.pending = self.pending, None
        return None if out is None or not len(out[0]) else out[3]


def _joined(a, b):
    return (*(np.concatenate([x, y]) for x, y in zip(a[:3], b[:3])),
            EventColumns.concat([a[3], b[3]]))


def _taken(block, rows):
    return (*(x[rows] for x in block[:3]), block[3].take(rows))


LINES_PER_ROW_BYTES = 1 << 23


def line_rows(data: bytes, limit: int = LINES_PER_ROW_BYTES):
    """Newline-terminated lines (bytes) -> an Arrow string array of a few rows, each
    rows' worth of whole lines joined by newlines (at most ``limit`` bytes unless one
    line is longer): Spark's text writer ends each row with a newline, so the file
    holds the same bytes as one row per line, and millions of match lines cross from
    the Python worker into the JVM, and through the writer, as a few long strings."""
    import pyarrow as pa
    if data and not data.endswith(b"\n") or len(data) >= 2 ** 31:
        raise ValueError("lines must end with a newline and hold under 2 GiB")
    buf = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(buf == 10)  # each line's newline
    cuts, start = [], 0
    while start < len(buf):
        # the last newline within limit bytes of start, else the first one after it
        i = np.searchsorted(ends, start + limit, side="right") - 1
        if i < 0 or ends[i] < start:
            i = np.searchsorted(ends, start)
        cuts.append((start, int(ends[i])))
        start = int(ends[i]) + 1
    offsets = np.zeros(len(cuts) + 1, np.int32)
    offsets[1:] = np.cumsum([hi - lo for lo, hi in cuts])
    body = b"".join(data[lo:hi] for lo, hi in cuts)
    return pa.Array.from_buffers(pa.string(), len(cuts), [
        None, pa.py_buffer(offsets), pa.py_buffer(body)])


@dataclass
class Router:
    """What the batch job does to each source row before the shuffle, in the task that
    reads it: dead letters and late events become lines of their outputs, repeats are
    dropped, the events some query needs (pushdown) go to every (group, part) they
    must reach, in the engine's columns. Built on the driver from the job's index
    (``dqcep.spark.batch``); called on the source's Arrow batches in the executors."""

    spec: JobSpec
    lateness: "AdmissionRule | int"  # spec section 7's rule (an int: the lateness alone)
    earlier: dict       # file index -> the largest ts of the files before it (none: absent)
    repeated: np.ndarray  # sorted ids seen more than once
    first_file: np.ndarray  # the (file index, seq) of each repeated id's first copy
    first_seq: np.ndarray
    # with a timeline attribute: file index -> T(k) of the timelines before it that
    # still say more than the skew test there (``timeline_values`` rows; ``job_index``)
    timelines: dict = dataclasses.field(default_factory=dict)

    def __getstate__(self):
        # The router travels in the event source's options (plain pickle, read where no
        # broadcast is registered): it carries the lookup tables' snapshots by value.
        state = {k: v for k, v in self.__dict__.items() if k not in ("_assigner", "_units")}
        if self.spec.tables is not None and not isinstance(self.spec.tables, Snapshots):
            state["spec"] = dataclasses.replace(self.spec,
                                                tables=Snapshots(self.spec.tables.value))
        return state

    @property
    def rule(self) -> AdmissionRule:
        return AdmissionRule.of(self.lateness)

    @property
    def assigner(self) -> Assigner:
        if "_assigner" not in self.__dict__:
            # with a timeline, its engine reads the timeline attribute too
            self._assigner = Assigner(self.spec, self.rule if self.rule.timeline else None)
        return self._assigner

    def admit(self, unit: int, cols: EventColumns) -> np.ndarray:
        """With a timeline attribute: why each event of ``cols`` (a unit's next events,
        in arrival order) is late, 0 admitted (spec section 7, ``Engine.admit_columns``).
        A unit is read in one task, in order: its G and timelines run on from batch to
        batch, starting from the largest ts of the units before it (``earlier``) and
        their timelines (``timelines``: ``job_index`` chained them)."""
        engine = self.assigner.engine
        units = self.__dict__.setdefault("_units", {})
        if unit not in units:
            engine.state.timelines = Timelines()
            engine.add_timelines(self.timelines.get(unit, []))
            units[unit] = [engine.state.timelines, self.earlier.get(unit)]
        engine.state.timelines, g = units[unit]
        why, units[unit][1] = engine.admit_columns(cols, g)
        return why

    def unit_timelines(self, unit: int, batches) -> list:
        """The index's summary of a unit (a router with no ``earlier``): the largest ts
        per timeline of its events that pass the skew test within the unit alone
        (``timeline_values`` rows). Since an event late by its timeline is behind that
        timeline's largest ts already, T(k) after the unit is the largest of T(k)
        before it and this one's (``chain_timelines``): units are indexed in parallel.
        ``batches``: the unit's event columns in arrival order."""
        engine = self.assigner.engine
        for cols in batches:
            if engine.schema_checks:  # misdeclared events are dead letters: not admitted
                bad, _ = engine.misdeclared(cols)
                cols = cols.take(np.flatnonzero(~bad))
            if len(cols.ts):
                self.admit(unit, cols)
        if unit not in self.__dict__.get("_units", {}):
            return []
        engine.state.timelines = self._units[unit][0]
        return engine.timeline_values()


    def schema(self) -> str:
        return ROUTED_SCHEMA

    def route(self, batch):
        """Source rows (``dqcep.spark.source.SCHEMA``) -> routed rows (``schema()``)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        c = dict(zip(batch.schema.names, batch.columns))
        dead = c["reason"].is_valid().to_numpy(zero_copy_only=False)
        events, where = c["event"], c["where"]

        def columns(rows):
            return event_columns(self.assigner.engine, events.take(pa.array(rows)))

        def lines(rows, kind, reasons=None):
            pick = pa.array(rows)
            if kind == "dead":
                return record_lines({"where": where.take(pick).to_pylist(),
                                     "reason": reasons or c["reason"].take(pick).to_pylist()},
                                    kind)
            return record_lines({"where": where.take(pick).to_pylist(),
                                 "event": c["event"].take(pick).to_pylist(),
                                 "reason": reasons}, kind)

        return self._route(dead, c["file_index"].to_numpy(), c["seq"].to_numpy(),
                           pc.fill_null(c["id"], 0).to_numpy(), pc.fill_null(c["ts"], 0).to_numpy(),
                           pc.fill_null(c["file_before"], _MIN).to_numpy().copy(), columns, lines)

    def route_piece(self, piece):
        """A ``dqcep.spark.source.ColumnPiece`` (events a fast path read, in this
        router's engine's columns) -> routed rows; only its late events are read again
        whole, for their lines."""
        cols, n = piece.columns, len(piece.seq)

        def lines(rows, kind, reasons):  # late lines, and misdeclared events'
            read = piece.records()  # the piece's rows again, once
            records = [read[i] for i in rows]
            where = [f"{piece.path}:{w}" for w, _ in records]
            if kind == "dead":
                return record_lines({"where": where, "reason": reasons}, kind)
            return record_lines({"where": where,
                                 "event": [msgpack.packb(e.as_mapping()) for _, e in records],
                                 "reason": reasons}, kind)

        return self._route(np.zeros(n, bool), np.full(n, piece.file_index, np.int64), piece.seq,
                           cols.id, cols.ts, piece.before.copy(), cols.take, lines)

    def _route(self, dead, files, seq, ids, ts, before, columns, lines):
        """The rules, on a batch's rows: ``dead`` marks the records that are not events;
        ``before`` the largest ts before each row in its file (``_MIN``: none);
        ``columns(rows)`` the engine columns of those (event) rows; ``lines(rows, kind,
        reasons)`` the dead-letter or late lines of those rows (a dead row's reason: its
        own when None).

        Late (spec section 7): without a timeline attribute files have no ticks and one
        timeline, so an event is late iff ts < G - L, G the largest ts before it
        (``before``: the source's within its file, ``earlier`` across files), reason
        ``lateness``; with one, by the engines' kernel (``admit``), the events of the
        unit in arrival order (repeats too, as G counts them; not the misdeclared,
        which are dead letters)."""
        n = len(dead)
        for f in np.unique(files).tolist():
            if (e := self.earlier.get(f)) is not None:
                at = files == f
                before[at] = np.maximum(before[at], e)
        nothing = before == _MIN
        before[nothing] = ts[nothing]  # nothing arrived before it: never late
        repeat = np.zeros(n, bool)
        if len(self.repeated):
            at = np.minimum(np.searchsorted(self.repeated, ids), len(self.repeated) - 1)
            repeat = ~dead & (self.repeated[at] == ids) & \
                ((self.first_file[at] != files) | (self.first_seq[at] != seq))
        first = ~dead & ~repeat
        engine = self.assigner.engine
        timeline = self.rule.timeline is not None
        events = ~dead  # what admission takes in: with a timeline, the repeats too
        misdeclared, whys = np.zeros(0, np.int64), []
        if engine.schema_checks and first.any():  # as the service: before lateness
            rows = np.flatnonzero(events if timeline else first)
            bad, found = engine.misdeclared(columns(rows))
            events[rows[bad]] = False
            keep = first[rows[bad]]  # a repeat's is no line: the repeat is dropped
            misdeclared = rows[bad][keep]
            whys = [why for (_, _, why), k in zip(found, keep.tolist()) if k]
            first[misdeclared] = False
        why = np.zeros(n, np.int8)
        if not timeline:
            why[first] = late_rule(before[first], ts[first], self.rule.lateness)
        else:
            for f in np.unique(files[events]).tolist():
                rows = np.flatnonzero(events & (files == f))
                why[rows] = self.admit(f, columns(rows))
            why[~first] = 0
        late = why != 0
        on_time = np.flatnonzero(first & ~late)

        needed, targets = np.zeros(0, np.int64), None
        if len(on_time):
            cols = engine.stored_columns(columns(on_time))
            keep = engine.needed(cols)
            needed, cols = on_time[keep], cols.take(np.flatnonzero(keep))
            targets = self.assigner.targets(cols)
        out = []
        if targets is not None:
            rows, groups, parts = targets
            at = needed[rows]
            out.append(_block_rows(engine, cols.take(rows), groups, parts, files[at], seq[at]))
        if dead.any():
            out.append(_line_rows(lines(np.flatnonzero(dead), "dead"), "dead-letter",
                                  files[dead], seq[dead]))
        if late.any():
            out.append(_line_rows(lines(np.flatnonzero(late), "late",
                                        [LATE_REASONS[w - 1] for w in why[late].tolist()]),
                                  "late", files[late], seq[late]))
        if len(misdeclared):
            out.append(_line_rows(lines(misdeclared, "dead", whys), "dead-letter",
                                  files[misdeclared], seq[misdeclared]))
        counts = {"records": n, "dead_letter": int(dead.sum()) + len(misdeclared),
                  "duplicates": int(repeat.sum()), "late": int(late.sum()),
                  "after_pushdown": len(needed),
                  "assigned": 0 if targets is None else len(targets[0]),
                  "environment": task_environment()}
        at = np.zeros(1, np.int64) + (files[0] if n else 0)
        out.append(_line_rows([json.dumps(counts)], STATS, at, at * 0, GROUP_STATS))
        return _concat(out, routed_arrow_schema())


def chain_timelines(units: list, rule: AdmissionRule, earlier: dict) -> dict:
    """``Router.timelines`` from the index: ``units`` (file index, ``unit_timelines``)
    in arrival order -> per unit, T(k) of the timelines before it on which its events
    may still be late beyond the skew test there (T(k) - L > G - D; the others say
    nothing more).

    T(k) is the largest ts of the events on k that pass the skew test (an event that
    passes it but is late on its timeline is below T(k) already), so it is the largest
    of the units' shares. A share that is behind G - D at its unit's start would not
    count, but it says nothing either: T(k) - L is then below G - D for good."""
    running: dict = {}
    out = {}
    for unit, summary in units:
        g = earlier.get(unit)
        floor = None if g is None else g - rule.tolerance + rule.lateness
        here = [[k, v, running[(k, v)]] for k, v, _ in summary
                if (k, v) in running and (floor is None or running[(k, v)] > floor)]
        if here:
            out[unit] = here
        for k, v, t in summary:
            running[(k, v)] = max(running.get((k, v), t), t)
    return out


def _line_rows(lines, output: str, files, seq, group: int = GROUP_LINES) -> dict:
    """Lines of one output, keyed so that each file's lines stay in arrival order."""
    return {"group": np.full(len(lines), group, np.int32), "part": files, "ts": seq,
            "file_index": files, "seq": seq, "output": [output] * len(lines), "line": lines}


def _concat(pieces: list[dict], schema):
    import pyarrow as pa
    columns = []
    for field in schema:
        parts = []
        for p in pieces:
            v = p.get(field.name)
            if v is None:
                v = pa.nulls(len(p["group"]), field.type)
            parts.append(v.cast(field.type) if isinstance(v, pa.Array)
                         else pa.array(v, field.type))
        columns.append(pa.concat_arrays(parts))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def engine_batches(spec: JobSpec, batches):
    """Routed rows (Arrow batches) sorted by (group, part, ts, arrival) -> output lines:
    one PartRunner per (group, part) over the events of its blocks, merged; lines
    passed through; this task's count of matches last."""
    import pyarrow as pa
    runner, merge, matches, routing = None, None, 0, spec.engine()

    def lines(data, output):
        a = line_rows(data)
        return pa.RecordBatch.from_arrays([pa.array([output] * len(a), pa.string()), a],
                                          names=["output", "line"])

    def close():
        """The part's held events, then its end."""
        if (cols := merge.rest()) is not None and (out := runner.feed(cols)) is not None:
            yield lines(out, "matches")
        if (out := runner.flush()) is not None:
            yield lines(out, "matches")

    for b in batches:
        if not b.num_rows:
            continue
        g, pt = b.column("group").to_numpy(), b.column("part").to_numpy()
        bounds = np.flatnonzero((g[1:] != g[:-1]) | (pt[1:] != pt[:-1])) + 1
        for lo, hi in zip(np.r_[0, bounds].tolist(), np.r_[bounds, len(g)].tolist()):
            group, part = int(g[lo]), int(pt[lo])
            rows = b.slice(lo, hi - lo)
            if group < 0:
                yield rows.select(["output", "line"])
                continue
            if runner is None or (runner.group, runner.part) != (group, part):
                if runner is not None:
                    yield from close()
                    matches += runner.matches
                runner, merge = PartRunner(spec, group, part), _Merge()
            for blob in rows.column("block").to_pylist():
                cols = merge.add(decode_block(routing, runner.engine, blob))
                if cols is not None and (out := runner.feed(cols)) is not None:
                    yield lines(out, "matches")
    if runner is not None:
        yield from close()
        matches += runner.matches
    yield pa.RecordBatch.from_arrays([pa.array([STATS]), pa.array([json.dumps(
        {"matches": matches, "environment": task_environment()})])], names=["output", "line"])
