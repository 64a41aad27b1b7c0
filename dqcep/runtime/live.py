"""Queries added to and removed from a running engine (the service's live queries).

``change_queries(engine, queries, added)`` plans the new query set on top of the
running engine and hands its state over, with no event processed again:

- the new plan starts its event types with the engine's, and its program its
  attribute columns and string codes (``Universe``): the stored events, queues and
  lists read the same under it (new attribute columns are missing in old events);
- each vertex of the new plan that the old plan had (the same ``Plan.keys`` entry:
  what it computes, whatever its number) takes that vertex's queues, NOT store,
  lists and runs; a new vertex starts empty; a vertex no query reads any more is let
  go (its state with it);
- a query that stays keeps its held matches, its after-match policy's state and its
  budget stop; a removed query's are dropped;
- a query added here matches only events that arrive from now on (spec of the live
  queries: a match is its iff all its events arrived at or after its addition). Its
  NOT and RUN vertices are its own (the planner salts them with its epoch): no
  earlier event negates or runs there; and a match of it that holds an event the
  engine held now (in its store or its reorder buffer) is dropped
  (``EngineState.fresh_since``), until those events are gone.
"""
from __future__ import annotations

import numpy as np

from dqcep._kernels.store import EventStore, ListStore
from dqcep.plan import Kind, build_plan
from dqcep.runtime.engine import Engine
from dqcep.runtime.compile import StringDictionary, plan_attributes
from dqcep.runtime.program import Program, Universe
from dqcep.runtime.state import EngineState


def change_queries(engine: Engine, queries, epochs: dict[str, int], *, schemas=(),
                   tables=(), rates=None, materialize: str = "always",
                   lookup_source=None, budget: int | None = None) -> Engine:
    """A new engine running ``queries`` (ASTs) that goes on from ``engine``.
    ``epochs``: per live-added query (those already running included) the epoch it
    was added at; a query of ``queries`` the engine does not run is added now (it
    must have an epoch). The old engine must not be used afterwards."""
    old = engine.program
    plan = build_plan(queries, rates, materialize=materialize, schemas=schemas,
                      tables=tables, types=old.plan.types, epochs=epochs)
    running = {q.name for q in old.plan.queries}
    added = [q.name for q in plan.queries if q.name not in running]
    missing = [n for n in added if n not in epochs]
    if missing:
        raise ValueError(f"queries added without an epoch: {missing}")
    # the attribute columns a running query reads, in the old order: a removed query's
    # own columns go (every stored event held them, every checkpoint wrote them)
    needed = set(plan_attributes(plan))
    universe = Universe(tuple(old.types), tuple(a for a in old.attrs if a in needed),
                        tuple(engine.state.dictionary.values))
    program = Program(plan, universe)
    state = carry_over(engine.state, old, program, added)
    return Engine(program, state=state, lookup_source=lookup_source,
                  budget=engine.budget if budget is None else budget,
                  stop_over_budget=engine.stop_over_budget)


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


def carry_over(old: EngineState, old_prog: Program, new_prog: Program,
               added: list[str]) -> EngineState:
    """The state ``new_prog`` goes on with: ``old``'s, written in ``old_prog``'s
    universe (a prefix of ``new_prog``'s), handed over vertex by vertex."""
    state = EngineState.fresh(new_prog, old.lateness)
    was, now = old_prog.attrs, new_prog.attrs
    # what every engine over event time holds: the events, their strings, the buffer
    # every code the engine has given stays; the new constants have the program's
    state.dictionary = StringDictionary(new_prog.constants, new_prog.pinned)
    seqs, ts, ids, val, kind, types = old.store.dump()
    state.store = EventStore(len(now))
    state.store.load(old.store.base, ts, ids, _columns(val, was, now, 0.0),
                     _columns(kind, was, now, 0), types)
    state.buffer = [(b_ts, b_ids, b_types, _columns(b_val, was, now, 0.0),
                     _columns(b_kind, was, now, 0))
                    for b_ts, b_ids, b_types, b_val, b_kind in old.buffer]
    state.type_counts[:len(old.type_counts)] = old.type_counts
    state.attr_seen[:] = _columns(old.attr_seen[None, :], was, now, False)[0]
    state.wm, state.max_seen = old.wm, old.max_seen
    state.events_in, state.late, state.late_ids = old.events_in, old.late, old.late_ids
    state.peak_state_bytes, state.sweep_at = old.peak_state_bytes, old.sweep_at
    state.run_pending = old.run_pending
    old_of = state.take_vertices(old, old_prog, new_prog)  # by what they compute
    if old.lists is not None and state.lists is not None:
        state.lists = list_store_for(old.lists, [was[c] for c in old_prog.list_aggs],
                                     [now[c] for c in new_prog.list_aggs],
                                     new_prog.list_aggs, old_prog.list_aggs)
    state.take_queries(old, old_prog, new_prog)  # by name
    boundary = old.store.base + len(seqs)  # the seq the next stored event gets
    buffered = np.unique(np.concatenate([b[1] for b in old.buffer] + [np.zeros(0, np.int64)]))
    last = max((int(b[0].max()) for b in old.buffer if len(b[0])), default=-1)
    since = (int(boundary), buffered.astype(np.int64), last)
    for q in new_prog.queries:
        if q.name in added:
            state.fresh_since[q.index] = since
    for v, key in enumerate(new_prog.plan.keys):  # an added query's own NOT and RUN
        if key not in old_of and new_prog.kind[v] in (Kind.NOT, Kind.RUN):
            state.excluded[v] = since
        elif key in old_of and old_of[key] in old.excluded:
            state.excluded[v] = old.excluded[old_of[key]]
    return state


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
