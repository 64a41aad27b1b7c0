"""Adaptive plans: a running engine moves a query between DAG joins and a chain when
it measures the other faster (the planner's estimate can be wrong: a selectivity it
cannot see, rates that change as the stream goes).

    engine = AdaptiveEngine(queries, rates=rates, materialize="auto")
    out = engine.process(batch)      # may move a query at the end of the batch
    engine.constructions             # {query: "joins" | "chain"}, as it runs now

How a query moves (``Switch``, at a batch boundary): it is planned again with the
other construction on the engine's own types, attribute columns and string codes (the
stored events read the same under both programs). Every vertex the two programs share
(the same ``Plan.keys`` entry) keeps its state; the new vertices get theirs by a replay
of the stored events, in ts order, through the query's vertices alone, with nothing
emitted: every match those events complete was emitted already, and what a later event
completes needs only them (the store reaches two windows back; the reorder buffer's
events come later, as any). The new vertices' state is then what they would hold had
they run from the start. A query that holds matches for a trailing NOT stays as it is
until it holds none (those records are written in the old root's slots).

How it decides (``AdaptiveEngine.adapt``, after each batch): each vertex counts its
time (``VertexStats.ns``). Once ``LOOK_EVENTS`` events have been stored since a
switchable query's last look and its vertices took ``LOOK_MIN_NS`` or more, the other
construction is tried: the replay above, timed per event on the events from one
window after the first on (the new state's steady part). It is kept if it cost under
1/``GAIN`` of the current construction's time per stored event since the last look;
otherwise it is dropped and the query's next look waits twice as many events. A
trial is stopped once it has cost ``CAP`` times the current construction's time for
the events it replayed (and by the state budget): a wrong guess costs a bounded time,
and repeated wrong guesses a shrinking share of it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Sequence

import numpy as np

from dqcep.events import STATE_BUDGET
from dqcep.lang import ast
from dqcep.plan import build_plan, switchable
from dqcep.plan.joins import ALWAYS
from dqcep.runtime.engine import Engine
from dqcep.runtime.eventtime import TimeState
from dqcep.runtime.live import list_store_for
from dqcep.runtime.program import Program, Universe
from dqcep.runtime.state import EngineState

LOOK_EVENTS = 8192        # stored events between two looks at a query (doubled per kept choice)
LOOK_MIN_NS = 5_000_000   # a query whose vertices took less since its last look is not tried
GAIN = 1.5                # the other construction is kept if this many times faster per event
CAP = 2.0                 # a trial stops once it cost this many times the current per event
REPLAY_SLICE = 1024       # events a replay takes at a time (a trial over its cap stops there)
OTHER = {"joins": "chain", "chain": "joins"}


@dataclass
class Look:
    """What the engine knows of one switchable query's cost since its last look."""

    ns_at: int        # its vertices' time then
    seq_at: int       # the store's next seq then
    wait: int = LOOK_EVENTS  # stored events until the next look
    trials: int = 0
    switches: int = 0


@dataclass
class Move:
    """A query the engine moved, and the measurements that moved it."""

    query: str
    to: str            # joins or chain
    at_event: int      # the events stored before it (the store's next seq)
    was_ns: float      # per stored event, as it ran since its last look
    trial_ns: float    # per event, the trial's replay (its steady part)

    def __str__(self) -> str:
        return (f"query {self.query} runs as {self.to} from stored event {self.at_event:,} on "
                f"(measured {self.trial_ns:,.0f} ns/event, against {self.was_ns:,.0f} as "
                f"{OTHER[self.to]})")


@dataclass
class Trial:
    """The other construction of a query, built by a replay and measured."""

    program: Program
    state: EngineState
    ns_per_event: float   # its replay's time per event, on the steady part
    events: int           # events replayed


class Source(tuple):
    """What the engine's queries were planned from, to plan them again."""

    __slots__ = ()

    def __new__(cls, queries, rates, materialize, schemas, tables):
        return tuple.__new__(cls, (tuple(queries), dict(rates or {}), materialize,
                                   tuple(schemas), tuple(tables)))


def query_vertices(program: Program, index: int) -> frozenset[int]:
    """The vertices a query's matches use (its root's descendants, its OUTPUT, its
    negations'): closed under children."""
    return frozenset(v for v, readers in program.readers.items() if index in readers)


def replan(engine: Engine, source: Source, constructions: dict[str, str]) -> Program:
    """The engine's queries planned with ``constructions``, compiled in the engine's
    universe (its types, attribute columns and string codes)."""
    queries, rates, materialize, schemas, tables = source
    old = engine.program
    plan = build_plan(queries, rates, materialize=materialize, schemas=schemas,
                      tables=tables, types=old.plan.types, constructions=constructions)
    program = Program(plan)
    if program.types == old.types and program.attrs == old.attrs and \
            program.constants == old.constants:
        return program  # as an engine built with these constructions has it (snapshots)
    program = Program(plan, Universe(tuple(old.types), tuple(old.attrs), old.constants))
    if program.attrs != old.attrs or program.constants != old.constants:
        raise ValueError("the queries planned again read other columns or constants")
    return program


def hand_over(engine: Engine, program: Program) -> EngineState:
    """``engine``'s state for ``program`` (the same queries, another construction of
    some): the events and clock as they are, the shared vertices' state by key, the
    queries' by name; the new vertices empty. Refuses (ValueError) where a vertex both
    programs have is built otherwise (on demand in one of them)."""
    old, old_prog = engine.state, engine.program
    state = EngineState.fresh(program, old.lateness)
    for f in dataclasses.fields(TimeState):  # one universe: the same objects
        setattr(state, f.name, getattr(old, f.name))
    old_of = state.take_vertices(old, old_prog, program)
    for v, key in enumerate(program.plan.keys):
        u = old_of.get(key)
        if u is None:
            continue
        if program.plan.on_demand[v] != old_prog.plan.on_demand[u]:
            raise ValueError(f"vertex {v} is built on demand in one program only")
        if u in old.excluded:
            state.excluded[v] = old.excluded[u]
    if old.lists is not None and state.lists is not None:
        state.lists = list_store_for(old.lists, old_prog.list_aggs, program.list_aggs)
    state.take_queries(old, old_prog, program)
    state.run_pending = old.run_pending
    return state


class AdaptiveEngine(Engine):
    """An ``Engine`` of ``queries`` planned by ``build_plan(queries, rates, materialize,
    schemas, tables)`` that moves its switchable queries between joins and a chain as
    it measures them (see the module docstring); ``adapt=False``: never (the plan as
    built). ``constructions``: per query, how it runs at the start (overriding the
    planner's choice; e.g. those of an adapted engine whose snapshot is restored)."""

    def __init__(self, queries: Sequence[ast.Query], *, rates: dict | None = None,
                 materialize: str = ALWAYS, schemas=(), tables=(), lateness: int = 0,
                 lookup_source=None, budget: int = STATE_BUDGET, adapt: bool = True,
                 constructions: dict[str, str] | None = None):
        self.source = Source(queries, rates, materialize, schemas, tables)
        plan = build_plan(queries, rates, materialize=materialize, schemas=schemas,
                          tables=tables, constructions=constructions)
        super().__init__(plan, lateness, lookup_source=lookup_source, budget=budget)
        self.lookup_source = lookup_source  # a replay's engine is built with it too
        self.adaptive = adapt
        self.looks = {name: Look(0, 0) for name in switchable(queries, tables)}
        self.overrides: dict[str, str] = dict(constructions or {})  # replan() keeps them
        self.moves: list[Move] = []  # by adapt(), in order

    @property
    def constructions(self) -> dict[str, str]:
        """How each switchable query runs now: joins or chain."""
        return {q.name: q.spec.construction for q in self.program.queries
                if q.name in self.looks}

    def switch(self, name: str, construction: str) -> bool:
        """Move query ``name`` to ``construction`` now (call it between batches); False
        where it cannot move now (see ``try_construction``)."""
        if name not in self.looks:
            raise ValueError(f"query {name} cannot change how it runs (switchable: "
                             f"{', '.join(self.looks) or 'none'})")
        if self.constructions[name] == construction:
            return True
        trial = self.try_construction(name, construction)
        if trial is None:
            return False
        self.install(name, trial)
        return True

    def install(self, name: str, trial: Trial) -> None:
        """The engine goes on with the trial's program and state."""
        self.overrides[name] = trial.program.plan.queries[
            next(q.index for q in trial.program.queries if q.name == name)].construction
        self.state = trial.state
        self._bind(trial.program)

    def try_construction(self, name: str, construction: str,
                         cap_ns_per_event: float | None = None) -> Trial | None:
        """Query ``name`` planned as ``construction``, its new vertices built by a
        replay of the stored events; None where it cannot move now (it holds matches
        for a trailing NOT, is stopped or live-added, an event in the store has no
        type code) or the replay went over the budget or over ``CAP`` times
        ``cap_ns_per_event`` per event."""
        old_prog, old = self.program, self.state
        index = next(q.index for q in old_prog.queries if q.name == name)
        if len(old.pending[index]) or index in old.stopped or index in old.fresh_since:
            return None
        program = replan(self, self.source, self.overrides | {name: construction})
        state = hand_over(self, program)
        store = state.store
        seqs = np.arange(store.base, store.next_seq, dtype=np.int64)
        ts, types = store.ts_of(seqs), store.types_of(seqs)
        if len(types) and types.min() < 0:
            return None  # restored from a snapshot that kept no types: nothing to replay
        mine = query_vertices(program, index)
        old_keys = set(old_prog.plan.keys)
        side_state = EngineState.fresh(program, state.lateness)
        side_state.store, side_state.dictionary, side_state.lists = \
            store, state.dictionary, state.lists
        side = Engine(program, state=side_state, budget=self.budget,
                      lookup_source=self.lookup_source)
        window = int(program.queries[index].window)
        steady = int(np.searchsorted(ts, ts[0] + window, "left")) if len(ts) else 0
        if steady >= len(ts):
            steady = 0  # under one window stored: all of it
        spent = steady_ns = 0
        for a in range(0, len(seqs), REPLAY_SLICE):
            b = min(a + REPLAY_SLICE, len(seqs))
            began = perf_counter_ns()
            side._match(seqs[a:b], ts[a:b], types[a:b], only=mine)
            side._evict_vertices(int(ts[b - 1]))
            took = perf_counter_ns() - began
            spent += took
            if a >= steady:
                steady_ns += took
            if index in side_state.stopped:
                return None
            if cap_ns_per_event is not None and spent > CAP * cap_ns_per_event * b:
                return None
        if old.wm is not None:
            side._evict_vertices(int(old.wm))
        for v in mine:
            if program.plan.keys[v] in old_keys:
                continue  # shared with the old program: its state is the real one
            for table in ("left_q", "right_q", "not_store", "growing", "runs"):
                theirs = getattr(side_state, table)
                if v in theirs:
                    getattr(state, table)[v] = theirs[v]
        return Trial(program, state, steady_ns / max(len(seqs) - steady, 1), len(seqs))

    def process(self, events):
        out = super().process(events)
        if self.adaptive:
            self.adapt()
        return out

    def adapt(self) -> list[str]:
        """Look at each switchable query whose time has come; returns those moved."""
        moved = []
        store_next = self.state.store.next_seq
        for name, look in self.looks.items():
            if store_next - look.seq_at < look.wait:
                continue
            index = next(q.index for q in self.program.queries if q.name == name)
            spent = sum(self.state.stats[v].ns for v in query_vertices(self.program, index))
            events = store_next - look.seq_at
            took = spent - look.ns_at
            look.ns_at, look.seq_at = spent, store_next
            if took < LOOK_MIN_NS:
                continue
            current = took / events
            look.trials += 1
            trial = self.try_construction(name, OTHER[self.constructions[name]], current)
            if trial is not None and trial.ns_per_event * GAIN < current:
                self.install(name, trial)
                look.switches += 1
                moved.append(name)
                self.moves.append(Move(name, self.constructions[name], store_next, current,
                                       trial.ns_per_event))
                index = next(q.index for q in self.program.queries if q.name == name)
                look.ns_at = sum(self.state.stats[v].ns
                                 for v in query_vertices(self.program, index))
            else:
                look.wait *= 2
        return moved
