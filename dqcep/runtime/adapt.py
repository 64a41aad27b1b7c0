"""Adaptive plans: a running engine moves a query between DAG joins and a chain when
it measures the other faster (the planner's estimate can be wrong: a selectivity it
cannot see, rates that change as the stream goes).

    engine = AdaptiveEngine(queries, rates=rates, materialize="auto")
    out = engine.process(batch)      # may move a query between two slices of it
    engine.constructions             # {query: "joins" | "chain"}, as it runs now

How a query moves (``switch``, between two slices of events: the engine's own
batches, ``eventtime.RELEASE_SLICE`` events at most): it is planned again with the
other construction on the engine's own types, attribute columns and string codes (the
stored events read the same under both programs). Every vertex the two programs share
(the same ``Plan.keys`` entry) keeps its state; the new vertices get theirs by a replay
of the stored events, in ts order, through the query's vertices alone, with nothing
emitted: every match those events complete was emitted already, and what a later event
completes needs only them (an engine that may move keeps its store as far back as
either construction's vertices read, ``_retention_under_moves``; the reorder buffer's
events come later, as any). The new vertices' state is then what they would hold had
they run from the start. A query that holds matches for a trailing NOT stays as it is
until it holds none (those records are written in the old root's slots).

How it decides (``AdaptiveEngine.adapt``, after each slice): each vertex counts its
time (``VertexStats.ns``). Once ``LOOK_EVENTS`` events (and ``STORE_SHARE`` times
what the store holds then: after a first trial, a look waits while a window fills
and the store holds most of the run) have been stored since a switchable query's last
look and its vertices took ``LOOK_MIN_NS`` or more in them (times the cost model's
estimate of the other construction's work over its own, when that is more: a trial runs the other
for a while, and a query is not made to pay 10x for a guess the model was sure of
while the time it could save is small; a query under it is looked at again as many
times later, at most ``BACKOFF``, and needs as many times the time), the other
construction is tried: the
replay above, dropped (the query left as it is) once it has cost ``CAP`` times what
the current construction took for as many events, or by the state budget. A replay
starts cold and runs in other slices than the stream does, so its time only bounds;
the move is then on probation for ``PROBATION_EVENTS`` stored events, measured as it
really runs: kept if no slower per event than before, else moved back. After a
probation or a dropped replay the query's next look waits ``BACKOFF`` times as many
events as the last: a wrong guess costs a bounded time, and repeated guesses a
shrinking share of the run.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dqcep.core.events import STATE_BUDGET
from dqcep.lang import ast
from dqcep.plan import build_plan, switchable
from dqcep.plan.joins import ALWAYS
from dqcep.runtime.engine import Engine
from dqcep.runtime.eventtime import MatchBatch
from dqcep.runtime.handover import hand_over, query_vertices, replan, replay
from dqcep.runtime.program import Program, Universe
from dqcep.runtime.state import EngineState

# stored events between two looks at a query, and a move's probation: these many, and
# at least STORE_SHARE times what the store holds (a replay takes that many events)
LOOK_EVENTS = 4096
PROBATION_EVENTS = 2048
STORE_SHARE = 4
LOOK_MIN_NS = 1_000_000   # a query whose vertices took less since its last look is not tried
BACKOFF = 8               # after a probation or a dropped replay: the next look waits 8x longer
CAP = 2.0                 # a replay of the other construction is dropped past this many
#                           times what the replay of the query as it runs took
# a probation ends early, after these many stored events, once the move measures over
# EARLY_FACTOR times slower than before it (a run shorter than the probation spent the
# rest of itself in a construction 5x slower)
EARLY_EVENTS = 512
EARLY_FACTOR = 2.0
OTHER = {"joins": "chain", "chain": "joins"}


@dataclass
class Look:
    """What the engine knows of one switchable query's cost since its last look."""

    ns_at: int        # its vertices' time then
    seq_at: int       # the store's next seq then
    wait: int = LOOK_EVENTS  # stored events from a look to the next (not on probation)
    due: int = LOOK_EVENTS   # the store's next seq at which it is looked at
    before: float | None = None  # on probation: ns per event as it ran before its move
    stretch: float = 1.0     # a query too cheap to try: its look comes this many times
    #                          later than ``wait`` says, and must find as many times the time
    trials: int = 0
    switches: int = 0


@dataclass
class Move:
    """A query the engine moved, and the measurements that moved it."""

    query: str
    to: str            # joins or chain
    at_event: int      # the events stored before it (the store's next seq)
    was_ns: float      # per stored event, as it ran since its last look
    why: str           # what was measured

    def __str__(self) -> str:
        return (f"query {self.query} runs as {self.to} from stored event {self.at_event:,} on: "
                f"{self.why}")


@dataclass
class Trial:
    """The other construction of a query, built by a replay and measured."""

    program: Program
    state: EngineState
    ns_per_event: float   # its replay's time per event (a replay starts cold: a bound)
    events: int           # events replayed
    overrides: dict       # the constructions the program was planned with


@dataclass(frozen=True)
class Source:
    """What the engine's queries were planned from, to plan them again."""

    queries: tuple
    rates: dict
    materialize: str
    schemas: tuple = ()
    tables: tuple = ()
    epochs: dict = dataclasses.field(default_factory=dict)  # live-added queries' epochs

    def plan_again(self, engine: Engine, constructions: dict[str, str]
                   ) -> tuple[Program, dict[str, str]]:
        """The queries planned with ``constructions`` on ``engine``'s universe, and the
        constructions that build that program again (``replan``)."""
        return replan(engine, self.queries, rates=self.rates, materialize=self.materialize,
                      schemas=self.schemas, tables=self.tables, epochs=self.epochs,
                      constructions=constructions)


class AdaptiveEngine(Engine):
    """An ``Engine`` of ``queries`` planned by ``build_plan(queries, rates, materialize,
    schemas, tables)`` that moves its switchable queries between joins and a chain as
    it measures them (see the module docstring); ``adapt=False``: never (the plan as
    built). ``constructions``: per query, how it runs at the start (overriding the
    planner's choice; e.g. those of an adapted engine whose snapshot is restored).
    ``epochs`` and ``universe``: those of an engine whose queries changed live
    (``change_queries``), to build its program again from a checkpoint."""

    def __init__(self, queries: Sequence[ast.Query], *, rates: dict | None = None,
                 materialize: str = ALWAYS, schemas=(), tables=(), lateness: int = 0,
                 lookup_source=None, budget: int = STATE_BUDGET, adapt: bool = True,
                 constructions: dict[str, str] | None = None,
                 epochs: dict[str, int] | None = None, universe: Universe | None = None):
        self.source = Source(tuple(queries), dict(rates or {}), materialize, tuple(schemas),
                             tuple(tables), dict(epochs or {}))
        plan = build_plan(queries, rates, materialize=materialize, schemas=schemas,
                          tables=tables, types=universe.types if universe else (),
                          epochs=epochs, constructions=constructions)
        self._reach = 0  # the store's retention under every construction (_bind)
        super().__init__(Program(plan, universe), lateness, lookup_source=lookup_source,
                         budget=budget)
        self.adaptive = adapt
        # the constructions its program was planned with (what builds it again)
        self.overrides: dict[str, str] = dict(constructions or {})
        self._over_budget: dict[str, object] = {}  # stopped in this slice: held matches
        self._rescued: set[str] = set()  # moved over the budget in this slice already
        self.moves: list[Move] = []  # the engine's own moves (adapt, over the budget)
        self.looks: dict[str, Look] = {}
        self._planned()

    def _planned(self) -> None:
        """What the engine derives from its query set (at the start, after a change)."""
        looks, self.looks = self.looks, {}
        for name in switchable(self.source.queries, self.source.tables):
            self.looks[name] = looks.get(name) or Look(0, 0)
        self._index = {q.name: q.index for q in self.program.queries}  # in every program
        # per combination of constructions (sorted items): its compiled program
        # and the constructions it was planned with (the engine's overrides while it runs)
        self._programs = {tuple(sorted(self.constructions.items())):
                          (self.program, dict(self.overrides))}
        # per query: the work per window the cost model estimated for each construction
        self.estimated = {q.name: dict(q.spec.construction_work)
                          for q in self.program.queries if q.name in self.looks}
        self._reach = 0
        self.store_retention = self.program.store_retention
        self._reach = self._retention_under_moves()
        self.store_retention = max(self.store_retention, self._reach)

    def change_queries(self, queries, epochs: dict[str, int], *, schemas=(),
                       tables=()) -> list[str]:
        """Go on running ``queries`` (ASTs) from here, as ``dqcep.runtime.live`` says;
        returns the names of those added. ``epochs``: per live-added query (those
        already running included) the epoch it was added at. A query that stays keeps
        how it runs and what the engine measured of it."""
        running = {q.name for q in self.program.queries}
        names = {q.name for q in queries}
        source = Source(tuple(queries), self.source.rates, self.source.materialize,
                        tuple(schemas), tuple(tables), dict(epochs))
        overrides = {n: c for n, c in self.overrides.items() if n in names}
        program, overrides = source.plan_again(self, overrides)
        added = [q.name for q in program.queries if q.name not in running]
        missing = [n for n in added if n not in epochs]
        if missing:
            raise ValueError(f"queries added without an epoch: {missing}")
        handed = hand_over(self, program, added)
        self.source, self.overrides = source, overrides
        # what an engine derives from its program and state, as for a new one (the
        # types, columns and matches' layout changed), then what this one measured
        Engine.__init__(self, program, state=handed.state, lookup_source=self.lookup_source,
                        budget=self.budget, stop_over_budget=self.stop_over_budget)
        self._planned()
        return added

    def _retention_under_moves(self) -> int:
        """How far back the store must reach for a move's replay to rebuild what the
        other construction's vertices hold: the larger retention of the program as
        planned and of the one with every switchable query moved (a query's vertices
        are its own, whatever the others run as)."""
        if not self.looks:
            return self.store_retention
        moved = {name: OTHER[c] for name, c in self.constructions.items()}
        try:
            other, built_with = self.source.plan_again(self, self.overrides | moved)
        except ValueError:  # it cannot be compiled here: as far as any vertex reads
            return 2 * int(max(self.program.eff_window, default=0)) + 2
        self._programs.setdefault(tuple(sorted(moved.items())), (other, built_with))
        return max(self.store_retention, other.store_retention)

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
        trial = self.try_construction(name, construction, capped=False)
        if trial is None:
            return False
        self.install(name, trial)
        return True

    def install(self, name: str, trial: Trial) -> None:
        """The engine goes on with the trial's program and state."""
        self.overrides = dict(trial.overrides)
        self.state = trial.state
        self._bind(trial.program)

    def try_construction(self, name: str, construction: str, capped: bool = True,
                         upto: int | None = None) -> Trial | None:
        """Query ``name`` planned as ``construction``, its new vertices built by a
        replay of the stored events (those with seq < ``upto``: all when None); None
        where it cannot move now (it holds matches for a trailing NOT, is stopped or
        live-added, an event in the store has no type code) or the replay went over
        the budget, or (``capped``) over ``CAP`` times what a replay of the query as it
        runs now takes (both start cold, on the same events and slices)."""
        old_prog, old = self.program, self.state
        index = self._index[name]
        if len(old.pending[index]) or index in old.stopped or index in old.fresh_since:
            return None
        store = old.store
        events = (store.next_seq if upto is None else upto) - store.base
        try:
            limit = None
            if capped:  # the query as it runs, replayed the same way
                seqs = np.arange(store.base, store.base + events, dtype=np.int64)
                side, spent = replay(self, old_prog, old.lists,
                                     query_vertices(old_prog, index), seqs)
                if index in side.stopped:
                    return None
                limit = CAP * spent
            program, built_with = self._program_for(name, construction)
            handed = hand_over(self, program, upto=upto, limit_ns=limit,
                               refuse_over_budget=True)
        except ValueError:  # it cannot be compiled here, or no type codes to replay
            return None
        if handed is None:  # over the budget or the cap
            return None
        return Trial(program, handed.state, handed.ns / max(events, 1), events, built_with)

    def _after_watermark(self):
        """After each slice of events (``eventtime.RELEASE_SLICE``, the watermark
        moved): the looks that are due. A batch of many events is many slices, so a
        probation lasts its own events, not the rest of the batch."""
        out = super()._after_watermark()
        if self.adaptive:
            self.adapt()
        return out

    # ------------------------------------------------------ a move over the budget
    def _stop(self, v: int, err) -> None:
        """A switchable query whose construction goes over the budget keeps its held
        matches: ``_match`` then moves it to the other construction (back, if it was
        on probation) and redoes the slice there; only if that goes over too (or
        cannot be built) is the query stopped. Once per query and slice; never
        without ``adaptive`` (the plan as built, as a plain ``Engine``)."""
        for qi in self.program.readers[v]:
            name = self.program.queries[qi].name
            if self.adaptive and name in self.looks and name not in self._rescued \
                    and qi not in self.state.stopped:
                self._over_budget[name] = self.state.pending[qi]
        super()._stop(v, err)

    def _match(self, seqs, ts, types, only=None, emit=None):
        out = super()._match(seqs, ts, types, only, emit)
        while self._over_budget:
            name, held = self._over_budget.popitem()
            self._rescued.add(name)
            out += self._rescue(name, held, seqs, ts, types)
        self._rescued.clear()
        return out

    def _rescue(self, name: str, held, seqs, ts, types) -> MatchBatch:
        """Query ``name`` went over the budget in this slice (none of its matches of
        the slice emitted): it moves to its other construction, rebuilt from the
        events stored before the slice, which then takes the slice. Its budget stop
        is taken back; if the other construction cannot be built, it stands."""
        index = self._index[name]
        why = self.state.stopped.pop(index)
        news = self._stopped_news
        self._stopped_news = [(n, w) for n, w in news if n != name]
        self.state.pending[index] = held
        look = self.looks[name]
        now = self.program.queries[index].spec.construction
        trial = self.try_construction(name, OTHER[now], capped=False, upto=int(seqs[0]))
        if trial is None:
            self.state.stopped[index] = why
            self._stopped_news = news
            return MatchBatch(self.match_queries)
        was = "on probation" if look.before is not None else f"as {now}"
        look.before = None
        self._move(name, trial, look, 0.0,
                   f"over the budget {was} ({self.budget:,} partial matches)")
        look.wait *= BACKOFF
        look.due = self._due(look.wait)
        return super()._match(seqs, ts, types, query_vertices(self.program, index), True)

    def adapt(self) -> list[str]:
        """Look at each switchable query whose time has come; returns those moved."""
        moved = []
        store_next = self.state.store.next_seq
        for name, look in self.looks.items():
            if store_next < look.due and not self._clearly_slower(name, look, store_next):
                continue
            if look.before is None and self._store_outgrew(look, store_next):
                continue
            spent = self._spent(name)
            took, events = spent - look.ns_at, store_next - look.seq_at
            look.ns_at, look.seq_at = spent, store_next
            current = took / max(events, 1)
            now = self.program.queries[self._index[name]].spec.construction
            if look.before is not None:  # on probation: kept if no slower than before
                before, look.before = look.before, None
                look.wait *= BACKOFF  # either way: the next try waits longer
                if current <= before:
                    look.due = self._due(look.wait)
                    continue
                trial = self.try_construction(name, OTHER[now], capped=False)  # ran before
                look.due = self._due(look.wait)
                if trial is not None:
                    self._move(name, trial, look, current,
                               f"{current:,.0f} ns/event as {now}, {before:,.0f} before")
                    moved.append(name)
                continue
            need = LOOK_MIN_NS * self._doubt(name, now)
            per_look = took / look.stretch  # what it took per look of the usual length
            if per_look < need:  # too cheap to try: the next look comes later, when it
                # may have taken that long at its rate (at most BACKOFF times later: a
                # query that grows costly is not left for long), and needs as many times
                # the time (many cheap queries then cost no look every slice)
                look.stretch = min(float(BACKOFF), need / max(per_look, 1.0))
                look.due = self._due(int(look.wait * look.stretch))
                continue
            look.stretch = 1.0
            look.due = self._due(look.wait)
            look.trials += 1
            trial = self.try_construction(name, OTHER[now])
            if trial is None:  # over its cap or the budget (or it cannot move now)
                look.wait *= BACKOFF
                look.due = self._due(look.wait)
                continue
            self._move(name, trial, look, current,
                       f"on probation ({current:,.0f} ns/event as {now}; the replay "
                       f"{trial.ns_per_event:,.0f})")
            look.before = current
            look.due = self._due(PROBATION_EVENTS)
            moved.append(name)
        return moved

    def _doubt(self, name: str, now: str) -> float:
        """How many times the work the cost model estimated for the query's other
        construction is of the one it runs now, at least 1 (1: not estimated)."""
        work = self.estimated[name]
        mine, other = work.get(now, 0.0), work.get(OTHER[now], 0.0)
        return max(1.0, other / mine) if mine > 0 and other > 0 else 1.0

    def _clearly_slower(self, name: str, look, store_next: int) -> bool:
        """On probation, EARLY_EVENTS stored events in: over EARLY_FACTOR times slower
        per event than before the move (the probation then ends now)."""
        events = store_next - look.seq_at
        return look.before is not None and events >= EARLY_EVENTS and \
            (self._spent(name) - look.ns_at) / events > EARLY_FACTOR * look.before

    def _store_outgrew(self, look, store_next: int) -> bool:
        """After the query's first trial: has the store grown past a share of what came
        since its last look (a window filling up: it then holds most of the run)? A
        trial replays the store, so the look then waits until ``STORE_SHARE`` times
        what it holds has come (``_due`` counted what it held at the last look). The
        first trial replays what the run has stored so far, once."""
        need = STORE_SHARE * len(self.state.store)
        if look.trials == 0 or store_next - look.seq_at >= need:
            return False
        look.due = look.seq_at + need
        return True

    def _due(self, wait: int) -> int:
        """The store's next seq at which to look again: ``wait`` stored events on, and
        at least ``STORE_SHARE`` times what the store holds (a replay of it then costs
        a bounded share of the run)."""
        store = self.state.store
        return store.next_seq + max(wait, STORE_SHARE * len(store))

    def _bind(self, program: Program) -> None:
        super()._bind(program)
        self.store_retention = max(self.store_retention, self._reach)
        self._mine: dict[str, tuple[int, ...]] = {}  # per query: its vertices (_spent)

    def _program_for(self, name: str, construction: str) -> tuple[Program, dict[str, str]]:
        """The program with query ``name`` run as ``construction``, the others as they
        run now, and the constructions it was planned with: compiled once per
        combination (a move back reuses the one before)."""
        key = tuple(sorted((self.constructions | {name: construction}).items()))
        found = self._programs.get(key)
        if found is None:
            found = self._programs[key] = self.source.plan_again(
                self, self.overrides | {name: construction})
        return found

    def _spent(self, name: str) -> int:
        """The time the vertices of query ``name`` have taken (its program's now)."""
        mine = self._mine.get(name)
        if mine is None:
            mine = self._mine[name] = tuple(query_vertices(self.program, self._index[name]))
        stats = self.state.stats
        return sum(stats[v].ns for v in mine)

    def _move(self, name: str, trial: Trial, look: Look, current: float, why: str) -> None:
        self.install(name, trial)
        look.switches += 1
        look.ns_at = self._spent(name)
        self.moves.append(Move(name, self.constructions[name], int(look.seq_at), current, why))
