"""The native engine's run-time state, apart from its compiled program.

An ``EngineState`` is everything one engine holds (the event store, the string
dictionary, the reorder buffer and watermark of ``TimeState``, plus the join
queues, NOT stores, held matches and per-vertex counters) and nothing it was
compiled with. ``to_bytes`` / ``from_bytes`` write and read it as whole arrays
(msgpack around raw column buffers, no per-record step), so restoring a state
costs time in proportion to its bytes and compiles nothing: the ``Program``
(``dqcep.runtime.program``) it runs under is passed in.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import msgpack
import numpy as np

from dqcep._kernels.chains import ChainStacks
from dqcep._kernels.ring import KeyedQueue, RingBuffer
from dqcep._kernels.runs import RunTable
from dqcep._kernels.store import ListStore
from dqcep.core.admission import AdmissionRule
from dqcep.core.errors import UserError
from dqcep.lang import ast
from dqcep.runtime.compile import StringDictionary
from dqcep.runtime.eventtime import NOTHING_WAITING, TimeState, in_ts_order
from dqcep.runtime.policy import PolicyState

SNAPSHOT_MAGIC = b"DQCEPSNP"
# the tables of per-vertex state (vertex -> its queue, NOT store, growing lists, runs)
VERTEX_TABLES = ("left_q", "right_q", "not_store", "growing", "runs")
SNAPSHOT_VERSION = 1
_EMPTY_I64 = np.empty(0, dtype=np.int64)


@dataclass
class Records:
    """Records of one vertex (new ones of a batch, or held ones), in end-ts order."""

    start: np.ndarray
    end: np.ndarray
    key: np.ndarray
    slots: np.ndarray  # int64 [n, n_slots]: event sequence numbers, -1 unbound

    def __len__(self) -> int:
        return len(self.start)

    @staticmethod
    def empty(n_slots: int) -> "Records":
        return Records(_EMPTY_I64, _EMPTY_I64, _EMPTY_I64, np.empty((0, n_slots), np.int64))

    def take(self, index) -> "Records":
        return Records(self.start[index], self.end[index], self.key[index], self.slots[index])

    def sorted_by_end(self) -> "Records":
        order = np.argsort(self.end, kind="stable")
        return self.take(order)

    def ring(self) -> RingBuffer:
        r = RingBuffer(self.slots.shape[1], max(16, len(self)))
        if len(self):
            r.push_batch(self.start, self.end, self.key, np.ascontiguousarray(self.slots))
        return r

    @staticmethod
    def from_ring(r: RingBuffer) -> "Records":
        s, e, k, ids = r.to_arrays()
        return Records(s, e, k, ids)


def run_state(items) -> RunTable | ChainStacks:
    """A RUN vertex's empty state (``items``: its ``RunItems``): the runs of a
    selection strategy, the stacks of a chain under skip-till-any-match."""
    k = len(items.types)
    return ChainStacks(k, items.kleene) if items.strategy == ast.ANY_MATCH else RunTable(k)


def _dumped(lists: ListStore | None, arr) -> list | None:
    """A ListStore's ``dump`` for a snapshot: its evicted count, then its arrays."""
    if lists is None:
        return None
    evicted, *columns = lists.dump()
    return [evicted, *map(arr, columns)]


@dataclass
class VertexStats:
    inputs: int = 0
    outputs: int = 0
    evictions: int = 0
    ns: int = 0  # time spent in it (dqcep.runtime.adapt compares a query's constructions by it)


@dataclass
class EngineState(TimeState):
    """What one native engine holds; see the module docstring."""

    left_q: dict[int, KeyedQueue] = field(default_factory=dict)    # SEQ/AND left inputs
    # AND right inputs, and those of SEQ vertices built on demand (plan/joins.py)
    right_q: dict[int, KeyedQueue] = field(default_factory=dict)
    not_store: dict[int, RingBuffer] = field(default_factory=dict)  # NOT: negated matches
    pending: list[Records] = field(default_factory=list)  # per query: held matches
    stats: dict[int, VertexStats] = field(default_factory=dict)
    lists: ListStore | None = None    # every Kleene list (plans with KLEENE vertices)
    growing: dict[int, KeyedQueue] = field(default_factory=dict)  # KLEENE: lists that may grow
    # RUN: its runs (a chain's stacks under skip-till-any-match: ``run_state``)
    runs: dict[int, RunTable | ChainStacks] = field(default_factory=dict)
    # RUN: released events not yet stepped (seq, ts, id, type): the events of the newest
    # ts may still be joined by others of that ts, and runs take events in (ts, id) order
    run_pending: tuple = NOTHING_WAITING  # RUN vertices' events, until stream order is known
    stopped: dict[int, str] = field(default_factory=dict)  # query index -> why (its budget)
    # query index -> its after-match policy's state (spec section 6; dqcep.runtime.policy)
    policies: dict[int, PolicyState] = field(default_factory=dict)
    # per query added to a running engine (dqcep.runtime.live): what it must not match,
    # the events the engine held when it came: (the store's next seq then, the ids of
    # the events its reorder buffer held then, the largest ts among those)
    fresh_since: dict[int, tuple[int, np.ndarray, int]] = field(default_factory=dict)
    # the same per NOT and RUN vertex of such a query: the events it must not take in
    # (an earlier event neither negates nor runs there)
    excluded: dict[int, tuple[int, np.ndarray, int]] = field(default_factory=dict)

    @classmethod
    def fresh(cls, program, lateness: "AdmissionRule | int" = 0) -> "EngineState":
        """An empty state for ``program`` (a ``dqcep.runtime.program.Program``) that
        admits by ``lateness`` (an ``AdmissionRule``, or a lateness in ms)."""
        state = super().fresh(len(program.types), len(program.attrs), lateness,
                              program.constants, program.pinned)
        n_slots, children = program.n_slots, program.children
        for v in program.left_vertices:
            state.left_q[v] = KeyedQueue(n_slots[children[v][0]])
        for v in program.right_vertices:
            state.right_q[v] = KeyedQueue(n_slots[children[v][1]])
        for v in program.not_vertices:
            state.not_store[v] = RingBuffer(n_slots[children[v][2]])
        state.pending = [Records.empty(q.n_slots) for q in program.queries]
        if program.kleene or program.runs:
            state.lists = ListStore(program.list_aggs)
            state.growing = {v: KeyedQueue(1) for v in program.kleene}
        state.runs = {v: run_state(program.plan.run[v]) for v in program.runs}
        state.stats = {v: VertexStats() for v in range(program.plan.n_vertices)}
        state.policies = {q.index: PolicyState(q.spec.after_match) for q in program.queries
                          if q.spec.after_match is not None}
        return state

    def take_vertices(self, old: "EngineState", old_prog, new_prog) -> dict:
        """Each vertex of ``new_prog`` that ``old_prog`` had (the same ``Plan.keys``
        entry: what it computes, whatever its number) takes ``old``'s queues, NOT
        store, lists, runs and counters; the others stay as they are. Returns the old
        programs' vertices by key."""
        old_of = {key: v for v, key in enumerate(old_prog.plan.keys)}
        for v, key in enumerate(new_prog.plan.keys):
            u = old_of.get(key)
            if u is None:
                continue
            for name in VERTEX_TABLES:
                mine, theirs = getattr(self, name), getattr(old, name)
                if u in theirs and v in mine:
                    mine[v] = theirs[u]
            self.stats[v] = old.stats[u]
        return old_of

    def take_queries(self, old: "EngineState", old_prog, new_prog) -> None:
        """Each query of ``new_prog`` that ``old_prog`` ran (by name) takes ``old``'s
        held matches, after-match policy state, budget stop and live boundary."""
        old_index = {q.name: q.index for q in old_prog.queries}
        for q in new_prog.queries:
            i = old_index.get(q.name)
            if i is None:
                continue
            self.pending[q.index] = old.pending[i]
            if i in old.policies and q.index in self.policies:
                self.policies[q.index] = old.policies[i]
            if i in old.stopped:
                self.stopped[q.index] = old.stopped[i]
            if i in old.fresh_since:
                self.fresh_since[q.index] = old.fresh_since[i]

    def vertex_nbytes(self) -> dict[int, int]:
        """Bytes held per vertex: its queues, NOT store, growing lists and runs (the
        event store, the list nodes and held matches belong to no one vertex)."""
        out: dict[int, int] = {}
        for name in VERTEX_TABLES:
            for v, x in getattr(self, name).items():
                out[v] = out.get(v, 0) + x.nbytes
        return out

    def nbytes(self) -> int:
        """Bytes held by queues, NOT stores, the event store and held matches."""
        total = self.store.nbytes
        for name in VERTEX_TABLES:
            for x in getattr(self, name).values():
                total += x.nbytes
        for p in self.pending:
            total += p.slots.nbytes + 24 * len(p)
        if self.lists is not None:
            total += self.lists.nbytes
        for a in self.run_pending:
            total += a.nbytes
        for policy in self.policies.values():
            total += policy.nbytes()
        return total

    # ------------------------------------------------------------ bytes
    def to_bytes(self, fingerprint: str) -> bytes:
        """The whole state, versioned, tagged with the program's fingerprint."""
        def arr(a: np.ndarray):
            a = np.ascontiguousarray(a)
            return [a.dtype.str, list(a.shape), a.tobytes()]

        def recs(r: Records):
            return [arr(r.start), arr(r.end), arr(r.key), arr(r.slots)]

        def queue(q: KeyedQueue):
            s, e, k, ids = q.records.to_arrays()
            return [int(q.evicted), arr(s), arr(e), arr(k), arr(ids[:, :q.n_ids])]

        _, ts, ids, val, kind, types = self.store.dump()
        body = {
            "plan": fingerprint,
            "wm": self.wm, "max_seen": self.max_seen, "lateness": self.lateness,
            "dictionary": self.dictionary.values,
            "store": [int(self.store.base), arr(ts), arr(ids), arr(val), arr(kind), arr(types)],
            "buffer": [[arr(c) for c in b] for b in self.buffer],
            "left": {str(v): queue(q) for v, q in self.left_q.items()},
            "right": {str(v): queue(q) for v, q in self.right_q.items()},
            "not": {str(v): recs(Records.from_ring(s)) for v, s in self.not_store.items()},
            "pending": [recs(p) for p in self.pending],
            "stats": {str(v): [s.inputs, s.outputs, s.evictions, s.ns]
                      for v, s in self.stats.items()},
            "counters": [self.events_in, self.late],
            "time": {"skew": self.skew, "timeline": self.timeline, "ticks": self.ticks,
                     "late_by": self.late_by,
                     "timelines": [arr(a) for a in self.timelines.arrays()]},
            "lists": _dumped(self.lists, arr),
            "growing": {str(v): queue(q) for v, q in self.growing.items()},
            "runs": {str(v): arr(r.dump()) for v, r in self.runs.items()},
            "run_pending": [arr(a) for a in self.run_pending],
            "stopped": {str(q): why for q, why in self.stopped.items()},
            "policies": {str(q): p.to_obj() for q, p in self.policies.items()},
            "fresh_since": {str(q): [b, arr(ids), t] for q, (b, ids, t)
                            in self.fresh_since.items()},
            "excluded": {str(v): [b, arr(ids), t] for v, (b, ids, t)
                         in self.excluded.items()},
        }
        return SNAPSHOT_MAGIC + struct.pack("<I", SNAPSHOT_VERSION) + \
            msgpack.packb(body, use_bin_type=True)

    @classmethod
    def from_bytes(cls, program, blob: bytes) -> "EngineState":
        """The state ``to_bytes`` wrote, for an engine running ``program``."""
        if not blob.startswith(SNAPSHOT_MAGIC):
            raise UserError("not a dqcep engine snapshot")
        (version,) = struct.unpack("<I", blob[len(SNAPSHOT_MAGIC):len(SNAPSHOT_MAGIC) + 4])
        if version != SNAPSHOT_VERSION:
            raise UserError(f"snapshot version {version} is not supported "
                            f"(this engine reads version {SNAPSHOT_VERSION})")
        body = msgpack.unpackb(blob[len(SNAPSHOT_MAGIC) + 4:], raw=False,
                               strict_map_key=False)
        if body["plan"] != program.fingerprint():
            raise UserError("the snapshot was taken by an engine running other queries, or "
                            "the same queries planned otherwise (--materialize, --rates)")

        def view(x):  # for a kernel that copies it in (store, queues, rings)
            dtype, shape, data = x
            return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)

        def arr(x):  # kept as numpy: owned and writable
            return view(x).copy()

        time = body.get("time", {})  # none: a snapshot before spec section 7
        state = cls.fresh(program, AdmissionRule(body["lateness"], time.get("skew"),
                                             time.get("timeline")))
        if time:
            state.ticks, state.late_by = time["ticks"], list(time["late_by"])
            state.timelines.add(*(arr(a) for a in time["timelines"]))
        state.wm, state.max_seen = body["wm"], body["max_seen"]
        state.dictionary = StringDictionary(body["dictionary"], program.pinned)
        base, ts, ids, val, kind, *types = body["store"]  # no types: a snapshot before them
        state.store.load(base, view(ts), view(ids), view(val), view(kind),
                         view(types[0]) if types else None)
        # runs in ts order (a snapshot before the runs kept batches as they came)
        state.buffer = [in_ts_order(tuple(arr(c) for c in b)) for b in body["buffer"]]
        for side, queues in (("left", state.left_q), ("right", state.right_q)):
            for v_str, (evicted, s, e, k, ids_) in body[side].items():
                queues[int(v_str)].load(evicted, view(s), view(e), view(k),
                                        np.ascontiguousarray(view(ids_), np.int64))
        for v_str, r in body["not"].items():
            state.not_store[int(v_str)] = Records(*(view(x) for x in r)).ring()
        state.pending = [Records(*(arr(x) for x in r)) for r in body["pending"]]
        for v_str, counters in body["stats"].items():  # (no ns in a snapshot before it)
            state.stats[int(v_str)] = VertexStats(*counters)
        state.events_in, state.late = body["counters"]
        if body.get("lists") is not None:
            evicted, *columns = body["lists"]
            state.lists.load(evicted, *(view(c) for c in columns))
            for v_str, (evicted, s, e, k, ids_) in body["growing"].items():
                state.growing[int(v_str)].load(evicted, view(s), view(e), view(k),
                                               np.ascontiguousarray(view(ids_), np.int64))
        for v_str, rows in body.get("runs", {}).items():
            state.runs[int(v_str)].load(np.ascontiguousarray(view(rows)))
        if "run_pending" in body:
            state.run_pending = tuple(arr(a) for a in body["run_pending"])
        state.stopped = {int(q): why for q, why in body.get("stopped", {}).items()}
        for q, obj in body.get("policies", {}).items():
            state.policies[int(q)] = PolicyState.from_obj(obj)
        for q, (boundary, ids, last) in body.get("fresh_since", {}).items():
            state.fresh_since[int(q)] = (boundary, arr(ids), last)
        for v, (boundary, ids, last) in body.get("excluded", {}).items():
            state.excluded[int(v)] = (boundary, arr(ids), last)
        return state
