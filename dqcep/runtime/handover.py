"""One re-plan and one hand-over: a running engine goes on under another program of
its queries, with no event processed again. Live query changes (``dqcep.runtime.live``:
queries added and removed) and adaptive moves (``dqcep.runtime.adapt``: a query moved
between joins and a chain) both go this way.

``replan`` plans the queries on the running engine's universe: its event types come
first, the attribute columns a query still reads keep their order, and the string
codes stay (a new constant the engine has already coded gets that code).

``hand_over`` gives the new program the old state:

- what every engine over event time holds (the events, their strings, the reorder
  buffer, the watermark, the counters): as it is, rewritten only where the columns
  changed (a removed query's own attribute columns go);
- each vertex of the new plan that the old plan had (the same ``Plan.keys`` entry:
  what it computes, whatever its number) and holds the same tables takes them;
- a vertex the old plan lacked, or had built otherwise (on demand in one plan and
  materialized in the other: its queues and its parent's hold other things), is
  *rebuilt* when a query that ran before reads it: the stored events are replayed,
  in ts order, through the vertices of the queries that read it, with nothing
  emitted (every match of those events was emitted already, and what a later event
  completes needs only them), and it takes the state the replay built. So a query
  that stays loses nothing, whatever the plans' materialization;
- a vertex only an added query reads starts empty: an added query matches only the
  events that arrive from its addition on (``EngineState.fresh_since``), and its own
  NOT and RUN vertices exclude the events held at the change;
- a query that stays keeps its held matches, its after-match policy's state and its
  budget stop (by name); a removed query's are dropped.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from time import perf_counter_ns

import numpy as np

from dqcep._kernels.store import EventStore, ListStore
from dqcep.plan import Kind, build_plan
from dqcep.runtime.compile import StringDictionary, plan_attributes
from dqcep.runtime.eventtime import TimeState
from dqcep.runtime.program import Program, Universe
from dqcep.runtime.state import VERTEX_TABLES, EngineState

REPLAY_SLICE = 1024  # events a replay takes at a time (one over its limit stops there)


def replan(engine, queries, *, rates=None, materialize: str = "always", schemas=(),
           tables=(), epochs: dict[str, int] | None = None,
           constructions: dict[str, str] | None = None) -> tuple[Program, dict[str, str]]:
    """``queries`` planned (``build_plan`` with these options) and compiled on
    ``engine``'s universe, and the constructions it was planned with (``build_plan``'s
    ``constructions``: what builds the same program again, from a checkpoint). A query
    the engine runs keeps the construction it runs as (joins or chain) unless
    ``constructions`` says otherwise: the planner may choose anew for the whole set,
    and a query whose plan stays needs no rebuilding."""
    old = engine.program
    given = dict(constructions or {})

    def plan_with(fixed):
        return build_plan(queries, rates, materialize=materialize, schemas=schemas,
                          tables=tables, types=old.plan.types, epochs=epochs,
                          constructions=fixed or None)
    plan = plan_with(given)
    was = {q.name: q.spec.construction for q in old.queries}
    kept = {s.name: was[s.name] for s in plan.queries
            if s.name in was and s.name not in given and s.construction != was[s.name]
            and was[s.name] in ("joins", "chain") and s.construction in ("joins", "chain")}
    if kept:
        given |= kept
        plan = plan_with(given)
    if [q.name for q in plan.queries] == [q.name for q in old.queries]:
        # the same queries (a move): on the engine's universe as it is
        program = Program(plan)
        if old.based_on is None and (program.types, program.attrs, program.constants) == \
                (old.types, old.attrs, old.constants):
            return program, given  # as an engine built afresh has it
        program = Program(plan, Universe(tuple(old.types), tuple(old.attrs), old.constants))
        if program.attrs != old.attrs or program.constants != old.constants:
            raise ValueError("the queries planned again read other columns or constants")
        return program, given
    # another query set: the columns a query still reads, in the old order (a removed
    # query's own go: every stored event held them, every checkpoint wrote them), and
    # every string the engine has coded (an added query's constant gets its code)
    needed = set(plan_attributes(plan))
    return Program(plan, Universe(tuple(old.types), tuple(a for a in old.attrs if a in needed),
                                  tuple(engine.state.dictionary.values))), given


@dataclass
class HandedOver:
    """The state a new program goes on with, and what rebuilding it took."""

    state: EngineState
    rebuilt: frozenset[int]   # the new program's vertices built by the replay
    replayed: int             # stored events replayed (0: nothing to rebuild)
    ns: int                   # the replay's time


def hand_over(engine, program: Program, added=(), *, upto: int | None = None,
              limit_ns: float | None = None, refuse_over_budget: bool = False
              ) -> HandedOver | None:
    """``engine``'s state for ``program`` (see the module docstring). ``added``: the
    names of the queries added now. The replay takes the stored events with seq <
    ``upto`` (all when None). None when the replay went over ``limit_ns`` or, with
    ``refuse_over_budget``, over the budget; otherwise a query whose rebuilt vertices
    go over the budget is stopped as it would be while running."""
    old, old_prog = engine.state, engine.program
    state = EngineState.fresh(program, old.admission_rule)
    _take_time(state, old, old_prog, program)
    old_of = state.take_vertices(old, old_prog, program)
    if old.lists is not None and state.lists is not None:
        was, now = old_prog.attrs, program.attrs
        state.lists = list_store_for(old.lists, [was[c] for c in old_prog.list_aggs],
                                     [now[c] for c in program.list_aggs],
                                     program.list_aggs, old_prog.list_aggs)
    state.take_queries(old, old_prog, program)
    state.run_pending = old.run_pending
    unmatched = _unmatched(state, old, old_prog, program, old_of)
    added_index = {q.index for q in program.queries if q.name in added}
    # the queries that ran before and read a vertex with no state of its own
    rebuilt_by = {qi for v in unmatched for qi in program.readers[v]} - added_index
    since = _since(old) if added else None
    for v, key in enumerate(program.plan.keys):
        u = old_of.get(key)
        if u is not None and v not in unmatched:
            if u in old.excluded:
                state.excluded[v] = old.excluded[u]
        elif program.kind[v] in (Kind.NOT, Kind.RUN) and since is not None \
                and not rebuilt_by.intersection(program.readers[v]):
            state.excluded[v] = since  # an added query's own: no earlier event counts
    if since is not None:
        for q in program.queries:
            if q.name in added:
                state.fresh_since[q.index] = since
    if not rebuilt_by:
        return HandedOver(state, frozenset(), 0, 0)
    only = frozenset().union(*(query_vertices(program, qi) for qi in rebuilt_by))
    store = old.store
    seqs = np.arange(store.base, store.next_seq if upto is None else upto, dtype=np.int64)
    done = replay(engine, program, state.lists, only, seqs, limit_ns)
    if done is None:
        return None
    side, spent = done
    stopped = {qi: why for qi, why in side.stopped.items() if qi in rebuilt_by}
    if stopped and refuse_over_budget:
        return None
    rebuilt = unmatched & only
    for v in rebuilt:
        for table in VERTEX_TABLES:
            mine, theirs = getattr(state, table), getattr(side, table)
            if v in theirs:
                mine[v] = theirs[v]
            else:
                mine.pop(v, None)
    for qi, why in stopped.items():
        state.stopped.setdefault(qi, why)
    return HandedOver(state, frozenset(rebuilt), len(seqs), spent)


def query_vertices(program: Program, index: int) -> frozenset[int]:
    """The vertices a query's matches use (its root's descendants, its OUTPUT, its
    negations'): closed under children."""
    return frozenset(v for v, readers in program.readers.items() if index in readers)


def replay(engine, program: Program, lists, only: frozenset[int], seqs,
           limit_ns: float | None = None) -> tuple[EngineState, int] | None:
    """The state the vertices ``only`` of ``program`` build from ``engine``'s stored
    events ``seqs`` (in ts order; nothing emitted), and the time it took; None over
    ``limit_ns``. A query stopped by the budget shows in the state's ``stopped``."""
    from dqcep.runtime.engine import Engine

    store = engine.state.store
    ts, types = store.ts_of(seqs), store.types_of(seqs)
    if len(types) and types.min() < 0:
        raise ValueError("a stored event has no type code (restored from a snapshot "
                         "that kept none): nothing to replay")
    state = EngineState.fresh(program, engine.state.admission_rule)
    state.store, state.dictionary, state.lists = store, engine.state.dictionary, lists
    side = Engine(program, state=state, budget=engine.budget,
                  lookup_source=engine.lookup_source)
    spent = 0
    for a in range(0, len(seqs), REPLAY_SLICE):
        b = min(a + REPLAY_SLICE, len(seqs))
        began = perf_counter_ns()
        side._match(seqs[a:b], ts[a:b], types[a:b], only=only)
        side._evict_vertices(int(ts[b - 1]))
        spent += perf_counter_ns() - began
        if limit_ns is not None and spent > limit_ns:
            return None
    if engine.wm is not None:
        side._evict_vertices(int(engine.wm))
    return state, spent


# what a state's time and counters are, apart from its events and strings
TIME_COUNTERS = ("wm", "max_seen", "timelines", "timelines_kept", "ticks",
                 "events_in", "late", "late_ids", "late_why", "late_by")


def _take_time(state: EngineState, old: EngineState, old_prog: Program,
               program: Program) -> None:
    """The events, strings, buffer, watermark and counters: the same objects where the
    universe is the same, else written in the new columns."""
    was, now = old_prog.attrs, program.attrs
    if list(was) == list(now) and program.constants == old_prog.constants and \
            len(program.types) == len(old_prog.types):
        for f in dataclasses.fields(TimeState):
            setattr(state, f.name, getattr(old, f.name))
        return
    # every code the engine has given stays (the program's universe holds them all);
    # only the new program's constants are pinned
    state.dictionary = StringDictionary(program.constants, program.pinned)
    seqs, ts, ids, val, kind, types = old.store.dump()
    state.store = EventStore(len(now))
    state.store.load(old.store.base, ts, ids, _columns(val, was, now, 0.0),
                     _columns(kind, was, now, 0), types)
    state.buffer = [(b_ts, b_ids, b_types, _columns(b_val, was, now, 0.0),
                     _columns(b_kind, was, now, 0))
                    for b_ts, b_ids, b_types, b_val, b_kind in old.buffer]
    state.type_counts[:len(old.type_counts)] = old.type_counts
    state.attr_seen[:] = _columns(old.attr_seen[None, :], was, now, False)[0]
    for name in TIME_COUNTERS:
        setattr(state, name, getattr(old, name))
    state.peak_state_bytes, state.sweep_at = old.peak_state_bytes, old.sweep_at


def _unmatched(state: EngineState, old: EngineState, old_prog: Program, program: Program,
               old_of: dict) -> set[int]:
    """The new program's vertices with no state of their own in ``old``: new ones, and
    those built otherwise (on demand in one plan only, or holding other tables)."""
    out = set()
    for v, key in enumerate(program.plan.keys):
        u = old_of.get(key)
        if u is None or program.plan.on_demand[v] != old_prog.plan.on_demand[u] or any(
                (v in getattr(state, t)) != (u in getattr(old, t)) for t in VERTEX_TABLES):
            out.add(v)
    return out


def _since(old: EngineState) -> tuple[int, np.ndarray, int]:
    """The live boundary of a query added now: the seq the next stored event gets,
    the ids the reorder buffer holds and its largest ts."""
    boundary = old.store.next_seq
    buffered = np.unique(np.concatenate([b[1] for b in old.buffer] + [np.zeros(0, np.int64)]))
    last = max((int(b[0].max()) for b in old.buffer if len(b[0])), default=-1)
    return int(boundary), buffered.astype(np.int64), last


def _columns(a: np.ndarray, old_attrs, new_attrs, fill) -> np.ndarray:
    """Rows of ``a`` [n, len(old_attrs)] in the columns ``new_attrs`` (one the old
    columns lack: ``fill``; one the new lack: dropped)."""
    if list(old_attrs) == list(new_attrs):
        return a
    where = {x: i for i, x in enumerate(old_attrs)}
    out = np.full((a.shape[0], len(new_attrs)), fill, a.dtype)
    for j, x in enumerate(new_attrs):
        if x in where:
            out[:, j] = a[:, where[x]]
    return out


def list_store_for(old: ListStore, old_aggs, new_aggs, columns=None,
                   old_columns=None) -> ListStore:
    """The list nodes under the new program's aggregated attributes (``old_aggs``,
    ``new_aggs``: by name, or by column where the columns stay; ``columns``,
    ``old_columns``: the new and old programs' column of each, when named): one both
    keep is carried, a new one is unknown in the old nodes (a list built on them holds
    an event from before the change, which no added query may match). The same
    attributes in the same columns: the old store itself."""
    if list(old_aggs) == list(new_aggs) and (
            columns is None or list(columns) == list(old_columns)):
        return old
    evicted, seq, parent, count, first, start, end, agg, ok = old.dump()
    n = len(seq)
    new_agg = np.zeros((n, 3 * len(new_aggs)), np.float64)
    new_ok = np.zeros((n, len(new_aggs)), np.uint8)
    where = {a: k for k, a in enumerate(old_aggs)}
    for j, a in enumerate(new_aggs):
        k = where.get(a)
        if k is not None:
            new_agg[:, 3 * j:3 * j + 3] = agg[:, 3 * k:3 * k + 3]
            new_ok[:, j] = ok[:, k]
    store = ListStore(np.asarray(new_aggs if columns is None else columns, np.int32))
    store.load(evicted, seq, parent, count, first, start, end, new_agg, new_ok)
    return store
