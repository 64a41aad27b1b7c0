"""The native engine: the general processor (result router) over the plan's DAG.

    engine = Engine(plan)
    matches = engine.process(batch)      # EventBatch or a list of Events
    matches += engine.advance_watermark(ts)
    matches += engine.flush()            # end of stream
    blob = engine.snapshot(); other = Engine(plan); other.restore(blob)

For each batch the router (1) puts the events in event-time order through a
K-slack reorder buffer (``lateness`` ms behind the largest ts that arrived
earlier; later events are counted as late and left out, never silently: see
``dqcep.runtime.eventtime``, shared with the SASE baseline), (2) stores them once in the EventStore, (3) runs the
vertices in topological order: EVENT vertices filter and key their type's
events, SEQ/AND vertices delta-join their inputs' new records with each other
and with their queues, OR vertices merge, NOT vertices collect their child's
records for the guards, and every new record goes to each parent that reads it
(a shared vertex's records feed all its parents), (4) at each query's OUTPUT
checks the exact window, the whole-match conditions and the guards, emits the
matches or holds those that wait on a trailing or AND negation, and (5)
advances the watermark: evicts what no future match can use and releases held
matches whose start + W has passed.

Matches come back columnar (``MatchBatch``); ``to_matches()`` makes Python
objects only when asked.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable

import msgpack
import numpy as np

from dqcep._kernels.operators import Guard, JoinSpec, join_delta, leaf_keys
from dqcep._kernels.ring import KeyedQueue, RingBuffer
from dqcep._kernels.store import EventStore
from dqcep.errors import UserError
from dqcep.plan import Kind, Op, Plan, Port
from dqcep.runtime.compile import (StringDictionary, effective_windows, guard_hosts,
                                   plan_attributes, predicate_set)
from dqcep.runtime.eventtime import EventColumns, EventTimeEngine, MatchBatch

SNAPSHOT_MAGIC = b"DQCEPSNP"
SNAPSHOT_VERSION = 1
_GUARD_MODES = {"GAP": 0, "LEADING": 1, "TRAILING": 2, "AND": 3}
_EMPTY_I64 = np.empty(0, dtype=np.int64)


@dataclass
class Records:
    """New records of one vertex in one batch, in end-ts order."""

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


@dataclass
class VertexStats:
    inputs: int = 0
    outputs: int = 0
    evictions: int = 0


class _Query:
    """What the OUTPUT of one query needs at run time."""

    def __init__(self, engine: "Engine", index: int, spec, guards: list[int]):
        plan = engine.plan
        self.index, self.spec = index, spec
        self.name, self.window, self.never = spec.name, spec.window_ms, spec.never
        slot_of = dict(spec.slot_of)
        self.var_slots = np.array([slot_of[v] for v in spec.variables], dtype=np.int64)
        self.identity_slots = self.var_slots.tolist() == list(range(len(slot_of)))
        self.preds = predicate_set(spec.preds, engine.attr_index, engine.dictionary)
        self.now_guards = [engine.guards[g] for g in guards if not plan.guard[g].holds_back]
        self.held_guards = [engine.guards[g] for g in guards if plan.guard[g].holds_back]
        self.held_active = [np.array(plan.guard[g].active_slots, dtype=np.int64)
                            for g in guards if plan.guard[g].holds_back]
        self.n_slots = len(spec.slot_of)
        self.pending = Records.empty(self.n_slots)


class Engine(EventTimeEngine):
    """Runs a plan over event batches; see the module docstring."""

    def __init__(self, plan: Plan, lateness: int = 0):
        super().__init__(plan.types, plan_attributes(plan), (), lateness)
        self.plan = plan
        self._fingerprint: str | None = None
        g = plan.graph
        self.eff_window = effective_windows(plan)
        hosts = guard_hosts(plan)
        self.topo = [int(v) for v in g.topo]
        self.kind = [plan.kind(v) for v in range(plan.n_vertices)]
        self.n_slots = [len(plan.slots[v]) for v in range(plan.n_vertices)]
        self.children = {v: (g.child(v, Port.LEFT), g.child(v, Port.RIGHT),
                             g.child(v, Port.CHILD)) for v in range(plan.n_vertices)}
        self.preds, self.keys, self.joins = {}, {}, {}
        self.left_q: dict[int, KeyedQueue] = {}
        self.out_ring: dict[int, RingBuffer] = {}
        self.right_q: dict[int, KeyedQueue] = {}
        self.not_store: dict[int, RingBuffer] = {}
        self.guards: dict[int, Guard] = {}
        self.host_guards: dict[int, list[int]] = {}
        for v in self.topo:
            k = self.kind[v]
            if k in (Kind.EVENT, Kind.SEQ, Kind.AND):
                self.preds[v] = predicate_set(plan.preds[v], self.attr_index, self.dictionary)
                self.keys[v] = np.array([self.attr_index[a] for a in plan.key_attrs[v]],
                                        dtype=np.int32)
            if k in (Kind.SEQ, Kind.AND):
                left, right = self.children[v][:2]
                self.joins[v] = JoinSpec(1 if k == Kind.SEQ else 2, int(self.eff_window[v]),
                                         self.n_slots[left], self.n_slots[right],
                                         self.keys[v], self.preds[v])
                self.left_q[v] = KeyedQueue(self.n_slots[left])
                self.out_ring[v] = RingBuffer(self.n_slots[v], 1024)  # reused every batch
                if k == Kind.AND:
                    self.right_q[v] = KeyedQueue(self.n_slots[right])
                self.host_guards[v] = hosts[v]
            elif k == Kind.NOT:
                spec = plan.guard[v]
                store = RingBuffer(self.n_slots[self.children[v][2]])
                self.not_store[v] = store
                self.guards[v] = Guard(
                    _GUARD_MODES[spec.mode], store, spec.n_host, spec.left_slots,
                    spec.right_slots, spec.active_slots,
                    predicate_set(spec.preds, self.attr_index, self.dictionary),
                    spec.window_ms)
        self.eq_index = self._equality_indexes()
        self.queries = [_Query(self, i, spec, hosts[spec.output])
                        for i, spec in enumerate(plan.queries)]
        self.match_queries = tuple((q.name, tuple(q.spec.variables)) for q in self.queries)
        # how far back (ms) each kind of state must reach behind the watermark
        windows = [int(w) for w in self.eff_window] + [0]
        self.store_retention = 2 * max(windows) + 2
        self.stats = {v: VertexStats() for v in range(plan.n_vertices)}
        self._constants_coded()

    def _equality_indexes(self) -> dict[int, tuple[int, int, int, int]]:
        """Join keys from equality conjuncts: vertex -> (left slot, attr, right slot, attr).

        A SEQ/AND vertex without an [attr] key whose predicates include
        ``l.x = r.y`` (one slot from each operand, neither under an OR, so the
        conjunct is always required) joins on hash(l.x) = hash(r.y). The
        conjunct stays a predicate, so a hash collision cannot make a match.
        """
        plan, out = self.plan, {}
        maybe_unbound: dict[int, list[bool]] = {}
        for v in self.topo:
            k = self.kind[v]
            left, right, child = self.children[v]
            if k == Kind.EVENT:
                maybe_unbound[v] = [False]
            elif k == Kind.OR:
                maybe_unbound[v] = [True] * self.n_slots[v]
            elif k in (Kind.SEQ, Kind.AND):
                maybe_unbound[v] = maybe_unbound[left] + maybe_unbound[right]
            if k not in (Kind.SEQ, Kind.AND) or plan.key_attrs[v]:
                continue
            nl = self.n_slots[left]
            for p in plan.preds[v]:
                code = p.code
                if len(code) != 3 or code[0][0] != Op.LOAD or code[1][0] != Op.LOAD \
                        or code[2][0] != Op.EQ:
                    continue
                (s1, a1), (s2, a2) = (code[0][1], p.attrs[code[0][2]]), \
                    (code[1][1], p.attrs[code[1][2]])
                if s1 >= nl:
                    (s1, a1), (s2, a2) = (s2, a2), (s1, a1)
                if not s1 < nl <= s2 or a1 in ("ts", "id") or a2 in ("ts", "id"):
                    continue
                if maybe_unbound[v][s1] or maybe_unbound[v][s2]:
                    continue
                out[v] = (s1, self.attr_index[a1], s2 - nl, self.attr_index[a2])
                break
        return out

    def _join_input(self, v: int, recs: Records, side: int) -> Records:
        """The records as this vertex's queue sees them: keyed for its join."""
        if self.plan.key_attrs[v] or not len(recs):
            return recs  # [attr] keys come up from the leaves
        index = self.eq_index.get(v)
        if index is None:
            if recs.key.any():
                recs = Records(recs.start, recs.end, np.zeros(len(recs), np.int64), recs.slots)
            return recs
        slot, attr = index[2 * side], index[2 * side + 1]
        ok, keys = leaf_keys(self.store, np.ascontiguousarray(recs.slots[:, slot]),
                             np.array([attr], np.int32))
        return Records(recs.start[ok], recs.end[ok], keys[ok], recs.slots[ok])

    # ------------------------------------------------------------------ input
    def needed(self, cols: EventColumns) -> np.ndarray:
        """Boolean mask: the events some EVENT vertex accepts (its type, its key
        attributes present, its leaf predicates true). No other event can take
        part in a match or violate a negation, so a preprocessing stage may drop
        them before the shuffle (``plan.pushdown_filters()`` lists the same rules).
        """
        n = len(cols.ts)
        keep = np.zeros(n, dtype=bool)
        if not n:
            return keep
        store = EventStore(len(self.attrs))  # scratch: evaluated, then dropped
        first = store.append(np.ascontiguousarray(cols.ts), np.ascontiguousarray(cols.id),
                             np.ascontiguousarray(cols.val), np.ascontiguousarray(cols.kind))
        seqs = np.arange(first, first + n, dtype=np.int64)
        for v in self.topo:
            if self.kind[v] != Kind.EVENT:
                continue
            rows = np.flatnonzero(cols.type == self.plan.event_type[v])
            ok, _ = leaf_keys(store, seqs[rows], self.keys[v])
            rows = rows[ok]
            if len(rows) and self.preds[v].n:
                rows = rows[self.preds[v].mask(store, seqs[rows].reshape(-1, 1))]
            keep[rows] = True
        return keep

    def _flush_held(self) -> MatchBatch:
        out = MatchBatch(self.match_queries)
        for q in self.queries:
            out += self._release_held(q, None)
        return out

    def next_release(self) -> int | None:
        """The smallest watermark at which a held match is released (None: none held).

        A streaming host with event-time timers registers one here, and calls
        ``advance_watermark`` when it fires.
        """
        due = [int(q.pending.start.min()) + int(q.window) + 1
               for q in self.queries if len(q.pending)]
        return min(due) if due else None

    def _match(self, seqs, ts, types) -> MatchBatch:
        out = MatchBatch(self.match_queries)
        delta: dict[int, Records] = {}
        plan = self.plan
        for v in self.topo:
            k = self.kind[v]
            if k == Kind.EVENT:
                sel = types == plan.event_type[v]
                s, t = seqs[sel], ts[sel]
                ok, keys = leaf_keys(self.store, s, self.keys[v])
                recs = Records(t[ok], t[ok], keys[ok], s[ok].reshape(-1, 1))
                if len(recs) and self.preds[v].n:
                    recs = recs.take(self.preds[v].mask(self.store, recs.slots))
                self.stats[v].inputs += int(sel.sum())
            elif k == Kind.OR:
                left, right = delta[self.children[v][0]], delta[self.children[v][1]]
                nl, nr = self.n_slots[self.children[v][0]], self.n_slots[self.children[v][1]]
                recs = Records(
                    np.concatenate([left.start, right.start]),
                    np.concatenate([left.end, right.end]),
                    np.concatenate([left.key, right.key]),
                    np.concatenate([
                        np.hstack([left.slots, np.full((len(left), nr), -1, np.int64)]),
                        np.hstack([np.full((len(right), nl), -1, np.int64), right.slots])]),
                ).sorted_by_end()
                self.stats[v].inputs += len(left) + len(right)
            elif k in (Kind.SEQ, Kind.AND):
                recs = self._join(v, delta)
            elif k == Kind.NOT:
                child = delta[self.children[v][2]]
                if len(child):
                    self.not_store[v].push_batch(child.start, child.end, child.key,
                                                 np.ascontiguousarray(child.slots))
                self.stats[v].inputs += len(child)
                recs = child
            else:  # OUTPUT
                continue
            delta[v] = recs
            self.stats[v].outputs += len(recs)
        for q in self.queries:
            out += self._output(q, delta[q.spec.root])
        self._measure_state()
        return out

    def _join(self, v: int, delta: dict[int, Records]) -> Records:
        left, right = self.children[v][0], self.children[v][1]
        dl, dr = delta[left], delta[right]
        self.stats[v].inputs += len(dl) + len(dr)
        dl, dr = self._join_input(v, dl, 0), self._join_input(v, dr, 1)
        n_out = self.n_slots[v]
        if not len(dl) and not len(dr):
            return Records.empty(n_out)
        out_ring = self.out_ring[v]
        out_ring.reset()
        join_delta(self.joins[v], self.store, self.left_q[v], self.right_q.get(v),
                   dl.start, dl.end, dl.key, np.ascontiguousarray(dl.slots),
                   dr.start, dr.end, dr.key, np.ascontiguousarray(dr.slots), out_ring)
        recs = Records.from_ring(out_ring)  # the join emits in end-ts order
        for gv in self.host_guards[v]:
            if len(recs):
                recs = recs.take(self.guards[gv].keep(self.store, recs.start, recs.end,
                                                       np.ascontiguousarray(recs.slots)))
        return recs

    def _output(self, q: _Query, recs: Records) -> MatchBatch:
        out = MatchBatch(self.match_queries)
        if q.never or not len(recs):
            return out
        inside = recs.end - recs.start <= q.window
        if not inside.all():
            recs = recs.take(inside)
        slots = np.ascontiguousarray(recs.slots)
        if len(recs) and q.preds.n:
            recs = recs.take(q.preds.mask(self.store, slots))
            slots = np.ascontiguousarray(recs.slots)
        for guard in q.now_guards:
            if len(recs):
                recs = recs.take(guard.keep(self.store, recs.start, recs.end, slots))
                slots = np.ascontiguousarray(recs.slots)
        if not len(recs):
            return out
        held = np.zeros(len(recs), bool)
        for active in q.held_active:
            held |= (slots[:, active] >= 0).any(axis=1)
        if held.any():
            hold = recs.take(held)
            q.pending = Records(*(np.concatenate([a, b]) for a, b in zip(
                (q.pending.start, q.pending.end, q.pending.key, q.pending.slots),
                (hold.start, hold.end, hold.key, hold.slots))))
            recs = recs.take(~held)
        self._emit(out, q, recs.end, recs.slots)
        return out

    def _emit(self, out: MatchBatch, q: _Query, detected: np.ndarray, slots: np.ndarray):
        if len(detected):
            picked = slots if q.identity_slots else slots[:, q.var_slots]
            ids = self.store.ids_of(np.ascontiguousarray(picked))
            out.parts.append((q.index, detected.astype(np.int64), ids))
            self.stats[q.spec.output].outputs += len(detected)

    def _release_held(self, q: _Query, wm: int | None) -> MatchBatch:
        """Held matches whose start + W is behind the watermark (all when wm is None)."""
        out = MatchBatch(self.match_queries)
        p = q.pending
        if not len(p):
            return out
        due = np.ones(len(p), bool) if wm is None else p.start + q.window < wm
        if not due.any():
            return out
        ready, q.pending = p.take(due), p.take(~due)
        slots = np.ascontiguousarray(ready.slots)
        for guard in q.held_guards:
            if len(ready):
                keep = guard.keep(self.store, ready.start, ready.end, slots)
                ready = ready.take(keep)
                slots = np.ascontiguousarray(ready.slots)
        self._emit(out, q, ready.start + q.window, ready.slots)
        return out

    def _after_watermark(self) -> MatchBatch:
        """Release held matches that are due, then evict what the watermark made useless."""
        out = MatchBatch(self.match_queries)
        wm = self.wm
        for q in self.queries:
            out += self._release_held(q, wm)
        for v, queue in self.left_q.items():
            w = int(self.eff_window[v])
            n = queue.py_evict_end_before(wm - w)
            if v in self.right_q:
                n += self.right_q[v].py_evict_end_before(wm - w)
            self.stats[v].evictions += n
        for v, store in self.not_store.items():
            self.stats[v].evictions += store.evict_before(wm - 2 * self.plan.guard[v].window_ms - 1)
        held_start = min((int(q.pending.start.min()) for q in self.queries if len(q.pending)),
                         default=wm)
        self.store.evict_before(min(wm - self.store_retention, held_start))
        return out

    # ---------------------------------------------------------- introspection
    def state_bytes(self) -> int:
        """Bytes held by queues, NOT stores, the event store and held matches."""
        total = self.store.nbytes
        total += sum(q.nbytes for q in self.left_q.values())
        total += sum(q.nbytes for q in self.right_q.values())
        total += sum(s.nbytes for s in self.not_store.values())
        total += sum(q.pending.slots.nbytes + 24 * len(q.pending) for q in self.queries)
        return total

    def vertex_stats(self) -> list[dict]:
        rows = []
        for v in self.topo:
            st = self.stats[v]
            high = 0
            if v in self.left_q:
                high = self.left_q[v].high_water + (self.right_q[v].high_water
                                                    if v in self.right_q else 0)
            elif v in self.not_store:
                high = self.not_store[v].high_water
            rows.append({"vertex": v, "operator": self.plan.label(v), "inputs": st.inputs,
                         "outputs": st.outputs, "queue_high_water": high,
                         "evictions": st.evictions})
        return rows

    # ------------------------------------------------------------- snapshots
    def snapshot(self) -> bytes:
        """The complete engine state, versioned (restore it into an Engine of the same plan)."""
        def arr(a: np.ndarray):
            a = np.ascontiguousarray(a)
            return [a.dtype.str, list(a.shape), a.tobytes()]

        def recs(r: Records):
            return [arr(r.start), arr(r.end), arr(r.key), arr(r.slots)]

        seqs, ts, ids, val, kind = self.store.dump()
        state = {
            "plan": self._plan_fingerprint(),
            "wm": self.wm, "max_seen": self.max_seen, "lateness": self.lateness,
            "dictionary": self.dictionary.values,
            "store": [int(self.store.base), arr(ts), arr(ids), arr(val), arr(kind)],
            "buffer": [[arr(c) for c in b] for b in self._buffer],
            "left": {str(v): self._queue_state(q, arr) for v, q in self.left_q.items()},
            "right": {str(v): self._queue_state(q, arr) for v, q in self.right_q.items()},
            "not": {str(v): recs(Records.from_ring(s)) for v, s in self.not_store.items()},
            "pending": [recs(q.pending) for q in self.queries],
            "stats": {str(v): [s.inputs, s.outputs, s.evictions] for v, s in self.stats.items()},
            "counters": [self.events_in, self.late],
        }
        body = msgpack.packb(state, use_bin_type=True)
        return SNAPSHOT_MAGIC + struct.pack("<I", SNAPSHOT_VERSION) + body

    @staticmethod
    def _queue_state(q: KeyedQueue, arr):
        s, e, k, ids = q.records.to_arrays()
        return [int(q.evicted), arr(s), arr(e), arr(k), arr(ids[:, :q.n_ids])]

    def _plan_fingerprint(self) -> str:
        """Which plan a snapshot belongs to; computed once per engine (it pickles the
        plan's queries, which cost more than restoring a small state)."""
        if self._fingerprint is None:
            import hashlib
            import pickle
            self._fingerprint = hashlib.sha256(pickle.dumps((
                self.plan.queries, self.plan.types, self.plan.graph.tail.tobytes(),
                self.plan.graph.head.tobytes()))).hexdigest()
        return self._fingerprint

    def restore(self, blob: bytes) -> None:
        """Load a snapshot taken by ``snapshot()`` of an engine running the same plan."""
        if not blob.startswith(SNAPSHOT_MAGIC):
            raise UserError("not a dqcep engine snapshot")
        (version,) = struct.unpack("<I", blob[len(SNAPSHOT_MAGIC):len(SNAPSHOT_MAGIC) + 4])
        if version != SNAPSHOT_VERSION:
            raise UserError(f"snapshot version {version} is not supported "
                            f"(this engine reads version {SNAPSHOT_VERSION})")
        state = msgpack.unpackb(blob[len(SNAPSHOT_MAGIC) + 4:], raw=False,
                                strict_map_key=False)
        self._decoder = None  # its string codes belong to the dictionary replaced below
        if state["plan"] != self._plan_fingerprint():
            raise UserError("the snapshot was taken by an engine running other queries")

        def arr(x):
            dtype, shape, data = x
            return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()

        self.wm, self.max_seen, self.lateness = state["wm"], state["max_seen"], state["lateness"]
        self.dictionary = StringDictionary(state["dictionary"], self.dictionary.pinned)
        base, ts, ids, val, kind = state["store"]
        self.store = EventStore(len(self.attrs))
        self.store.load(base, arr(ts), arr(ids), arr(val), arr(kind))
        self._buffer = [tuple(arr(c) for c in b) for b in state["buffer"]]
        for side, queues in (("left", self.left_q), ("right", self.right_q)):
            for v_str, (evicted, s, e, k, ids_) in state[side].items():
                q = KeyedQueue(queues[int(v_str)].n_ids)
                q.load(evicted, arr(s), arr(e), arr(k), arr(ids_).astype(np.int64))
                queues[int(v_str)] = q
        for v_str, r in state["not"].items():
            v = int(v_str)
            store = Records(*(arr(x) for x in r)).ring()
            self.not_store[v] = store
            spec = self.plan.guard[v]
            self.guards[v] = Guard(_GUARD_MODES[spec.mode], store, spec.n_host,
                                   spec.left_slots, spec.right_slots, spec.active_slots,
                                   self.guards[v].preds, spec.window_ms)
        for q, r in zip(self.queries, state["pending"]):
            q.pending = Records(*(arr(x) for x in r))
            q.now_guards = [self.guards[g] for g in self._query_guards(q, held=False)]
            q.held_guards = [self.guards[g] for g in self._query_guards(q, held=True)]
        for v_str, (i, o, e) in state["stats"].items():
            self.stats[int(v_str)] = VertexStats(i, o, e)
        self.events_in, self.late = state["counters"]

    def _query_guards(self, q: _Query, held: bool) -> list[int]:
        g = self.plan.graph
        return [int(g.tail[a]) for a in g.in_arcs(q.spec.output) if g.port[a] == Port.GUARD
                and self.plan.guard[int(g.tail[a])].holds_back == held]


def run_events(plan: Plan, batches: Iterable, lateness: int = 0) -> tuple[MatchBatch, Engine]:
    """Convenience: every match of a finite stream (batches of events), flushed at the end."""
    engine = Engine(plan, lateness)
    out = MatchBatch(engine.match_queries)
    for b in batches:
        out += engine.process(b)
    out += engine.flush()
    return out, engine
