"""The native engine: the general processor (result router) over the plan's DAG.

    engine = Engine(plan)
    matches = engine.process(batch)      # EventBatch or a list of Events
    matches += engine.advance_watermark(ts)
    matches += engine.flush()            # end of stream
    blob = engine.snapshot(); other = Engine(plan); other.restore(blob)

An engine is a compiled ``Program`` (``dqcep.runtime.program``: shared, never
changed) and an ``EngineState`` (``dqcep.runtime.state``: what it holds, to
bytes and back as whole arrays); ``Engine(program, state=...)`` pairs them
without compiling anything.

For each batch the router (1) puts the events in event-time order through a
K-slack reorder buffer (``lateness`` ms behind the largest ts that arrived
earlier; later events are counted as late and left out, never silently: see
``dqcep.runtime.eventtime``, shared with the SASE baseline), (2) stores them once in the EventStore, (3) runs the
vertices in topological order: EVENT vertices filter and key their type's
events, SEQ/AND vertices delta-join their inputs' new records with each other
and with their queues, OR vertices merge, NOT vertices collect their child's
records for the guards, KLEENE vertices grow lists, and every new record goes
to each parent that reads it (a shared vertex's records feed all its parents);
a RUN vertex (a query under a selection strategy) takes the events in stream
order once no event of their ts can still come (``_step_runs``), (4) at each query's OUTPUT
checks the exact window, the whole-match conditions and the guards, emits the
matches or holds those that wait on a trailing or AND negation
(``dqcep.runtime.output``), and (5)
advances the watermark: evicts what no future match can use and releases held
matches whose start + W has passed. (6) The matches of a query with an
after-match policy wait until they are decided in detection order
(``dqcep.runtime.policy``); an accepted one bounds where the query's own partial
matches may start, and those starting before are dropped (``_prune``). A query
whose state would pass the budget stops (``dqcep.runtime.budget``).

Matches come back columnar (``MatchBatch``); ``to_matches()`` makes Python
objects only when asked.
"""
from __future__ import annotations

from time import perf_counter_ns
from typing import Iterable

import numpy as np

from dqcep._kernels.chains import ChainSpec, chain_step, chain_step_ids
from dqcep._kernels.lists import kleene_step
from dqcep._kernels.joins import OnDemand, join_delta
from dqcep._kernels.leaves import leaf_keys
from dqcep._kernels.ring import RingBuffer, StateBudgetExceeded
from dqcep._kernels.runs import run_step
from dqcep.core.events import STATE_BUDGET
from dqcep.plan import Kind, Plan
from dqcep.runtime.budget import BudgetStage
from dqcep.runtime.eventtime import (EventColumns, EventTimeEngine, MatchBatch,
                                     ready_in_stream_order, wait_for_stream_order)
from dqcep.runtime.output import OutputStage
from dqcep.runtime.policy import PolicyStage
from dqcep.runtime.program import Program, QueryProgram
from dqcep.runtime.state import EngineState, Records, VertexStats

__all__ = ["Engine", "Records", "VertexStats", "run_events", "STATE_BUDGET"]

# A RUN vertex (runs, chains) takes the events of a batch this many at a time: its
# matches of one slice are one buffer, whatever the batch size.
RUN_SLICE = 4096


class Engine(OutputStage, PolicyStage, BudgetStage, EventTimeEngine):
    """Runs a plan over event batches; see the module docstring."""

    def __init__(self, plan: Plan | Program, lateness: int = 0,
                 state: EngineState | None = None, lookup_source=None,
                 budget: int = STATE_BUDGET, stop_over_budget: bool = True):
        """A plan (compiled here) or a compiled ``Program``, and a fresh state with
        ``lateness`` or a given ``state`` (which carries its own lateness).
        ``lookup_source`` (``dqcep.core.tables.LookupSource``) gives the snapshots of the
        tables the plan's lookups read. ``budget``: the partial matches one buffer of a
        query may hold (rounded up to a power of two; 0: no limit); a query whose state
        would grow past it is stopped (``take_stopped``), the others go on; without
        ``stop_over_budget`` the batch fails instead (UserError: a Spark task, whose
        engine holds one partition of the queries)."""
        if budget < 0:
            raise ValueError(f"a state budget is >= 0 records, got {budget}")
        program = plan if isinstance(plan, Program) else Program(plan)
        if state is None:
            state = EngineState.fresh(program, lateness)
        super().__init__(program.types, program.attrs, program.match_queries, lateness, state,
                         program.plan.schemas, program.plan.lookups, program.plan.tables,
                         lookup_source)
        self.budget, self.stop_over_budget = budget, stop_over_budget
        self.lookup_source = lookup_source  # a replay's engine is built with it too
        self._stopped_news: list[tuple[str, str]] = []  # (query, why), for take_stopped
        self._bind(program)

    def _bind(self, program: Program) -> None:
        """What the engine derives from its program (and ``self.state``): set at the
        start, and again when a query changes how it runs (``dqcep.runtime.adapt``,
        which hands in a program of the same queries, types and attribute columns)."""
        self.program = program
        self.plan = program.plan
        self.store_retention = program.store_retention
        self.every_event = program.every_event
        self._out_rings: dict[int, RingBuffer] = {}
        # a batch's new input records of the vertices built on demand, until their
        # parent's join takes them (see _keep_inputs)
        self._new_inputs: dict[int, tuple[Records, Records]] = {}
        self._swept_at: dict[int, int] = {}  # RUN: the watermark of its last sweep
        # RUN vertices: chains step on the stored events at once, the strategies' runs
        # once stream order is known
        self._chains = [v for v, r in program.runs.items() if isinstance(r.spec, ChainSpec)]
        self._waiting_runs = [v for v in program.runs if v not in self._chains]
        # per vertex that makes records from its children's (EVENT vertices are routed
        # before, all in one pass: ``_route``), in topological order: the method that
        # makes them, chosen once here (``_match`` calls it for every slice of events)
        steps = {Kind.OR: self._merge, Kind.SEQ: self._join, Kind.AND: self._join,
                 Kind.KLEENE: self._lists, Kind.NOT: self._negated}
        self._steps = [(v, self._keep_inputs if self.plan.on_demand[v] and k in (
            Kind.SEQ, Kind.AND) else steps[k]) for v, k in (
                (v, program.kind[v]) for v in program.topo) if k in steps]
        if program.pipeline is not None:  # its joins' scratch rings, for its calls
            for v in program.pipeline.join_vertices:
                self._scratch(v, program.n_slots[v])
        self._budget_state()

    stats = property(lambda self: self.state.stats, doc="``self.state.stats``")

    def _join_input(self, v: int, recs: Records, side: int) -> Records:
        """The records as this vertex's queue sees them: keyed for its join."""
        if self.program.keyless or self.plan.key_attrs[v] or not len(recs):
            return recs  # [attr] keys come up from the leaves
        index = self.program.eq_index.get(v)
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
        """Boolean mask: the events some EVENT vertex accepts (``Program.needed``);
        ``cols`` coded with this engine's dictionary. Lookups are read first, from the
        snapshot a batch would see now (a filter may read them)."""
        if self.lookup_filler is not None and len(cols.ts):
            cols = EventColumns(*self.lookup_filler.fill(tuple(cols), self.dictionary))
        return self.program.needed(cols.ts, cols.id, cols.type, cols.val, cols.kind)

    def _flush_held(self) -> MatchBatch:
        out = self._step_runs(None)
        for q in self.program.queries:
            out += self._release_held(q, None)
        out += self._decide(None)
        return out

    def next_release(self) -> int | None:
        """The smallest watermark at which a held match is released (None: none held).

        A streaming host with event-time timers registers one here, and calls
        ``advance_watermark`` when it fires.
        """
        due = [int(p.start.min()) + int(q.window) + 1
               for q, p in zip(self.program.queries, self.state.pending) if len(p)]
        # a match waiting for its policy's decision: once its last event's ts is past
        due += [min(c.key[0][0] for c in p.waiting) + 1
                for p in self.state.policies.values() if p.waiting]
        return min(due) if due else None

    def _match(self, seqs, ts, types, only: frozenset[int] | None = None,
               emit: bool | None = None) -> MatchBatch:
        """The matches stored events make (seqs, in ts order). ``only``: these vertices
        alone (a query's, closed under children: ``dqcep.runtime.adapt``), which emit
        nothing unless ``emit`` (a replay builds their state; a redo of a slice emits
        their query's matches). Each vertex's time goes to its ``VertexStats.ns``."""
        if emit is None:
            emit = only is None
        out = MatchBatch(self.match_queries)
        # per vertex, its new records of this slice (a join of Program.ring_roots: the
        # ring it wrote them to, for its query's OUTPUT)
        delta: dict[int, Records | RingBuffer] = {}
        prog, state = self.program, self.state
        stats = state.stats
        if prog.pipeline is not None and only is None and not self._dead:
            self._run_pipeline(delta, seqs, ts, types)
        else:
            self._vertices(delta, seqs, ts, types, only)
        if only is None and self._waiting_runs:
            state.run_pending = wait_for_stream_order(state.run_pending, state.store,
                                                      seqs, ts, types)
        if emit:
            for q in prog.queries:
                if q.spec.root in delta and (only is None or q.spec.output in only):
                    began = perf_counter_ns()
                    self._output(out, q, delta[q.spec.root])
                    stats[q.spec.output].ns += perf_counter_ns() - began
        if self._chains:
            made = self._step_chains(seqs, ts, types, only)
            if emit:
                out += made
        if only is None:
            self._measure_state()
        return out

    def _vertices(self, delta: dict[int, Records | RingBuffer], seqs, ts, types,
                  only: frozenset[int] | None) -> None:
        """Vertex by vertex (of ``only``), in topological order: each one's new records
        of the slice to ``delta``, its time to its ``VertexStats.ns``."""
        prog, stats = self.program, self.state.stats
        if prog.leaf_index:
            self._route(delta, seqs, ts, types, only)
        for v, step in (self._steps if only is None else
                        [(v, step) for v, step in self._steps if v in only]):
            if v in self._dead:  # every query reading it was stopped by its budget
                delta[v] = Records.empty(prog.n_slots[v])
                self._new_inputs.pop(v, None)
                continue
            began = perf_counter_ns()
            try:
                recs = step(v, delta)
            except StateBudgetExceeded as err:
                self._stop(v, err)
                recs = Records.empty(prog.n_slots[v])
            stats[v].ns += perf_counter_ns() - began
            delta[v] = recs
            stats[v].outputs += len(recs)

    def _run_pipeline(self, delta: dict[int, Records | RingBuffer], seqs, ts, types) -> None:
        """The slice through the plan's EVENT vertices and joins in one call
        (``Program.pipeline``); the query roots' new records to ``delta`` (a ring for a
        root of ``Program.ring_roots``)."""
        prog, state = self.program, self.state
        prog.pipeline.run(state.store, seqs, ts, types, state.left_q, state.right_q,
                          self._out_rings, state.stats, self._stop_for_pipeline)
        for q in prog.queries:
            root = q.spec.root
            if prog.kind[root] in (Kind.SEQ, Kind.AND):  # (a RUN's are its own)
                ring = self._out_rings[root]
                delta[root] = ring if root in prog.ring_roots else Records.from_ring(ring)

    def _route(self, delta: dict[int, Records], seqs, ts, types,
               only: frozenset[int] | None) -> None:
        """The EVENT vertices (of ``only``): the events their type, key and filters let
        through, to ``delta``, routed in one pass (``Program.leaves``) whose time they
        share."""
        prog, stats = self.program, self.state.stats
        began = perf_counter_ns()
        inputs, taken = prog.leaves.route(self.state.store, seqs, ts, types)
        leaves = [v for v in prog.leaf_index if (only is None or v in only)
                  and v not in self._dead]
        share = (perf_counter_ns() - began) // max(len(leaves), 1)
        for v in leaves:
            j = prog.leaf_index[v]
            t, keys, s = taken[j]
            delta[v] = Records(t, t, keys, s.reshape(-1, 1))
            counts = stats[v]
            counts.inputs += int(inputs[j])
            counts.outputs += len(t)
            counts.ns += share
        for v in self._dead.intersection(prog.leaf_index):  # its queries were stopped
            delta[v] = Records.empty(1)

    # The steps of ``_match``, one per kind of vertex: (v, this slice's new records of
    # the vertices before it) -> v's new records.
    def _merge(self, v: int, delta: dict[int, Records]) -> Records:
        """An OR vertex: both children's records, each with the other's slots unbound."""
        prog = self.program
        left, right = delta[prog.children[v][0]], delta[prog.children[v][1]]
        nl, nr = prog.n_slots[prog.children[v][0]], prog.n_slots[prog.children[v][1]]
        self.state.stats[v].inputs += len(left) + len(right)
        return Records(
            np.concatenate([left.start, right.start]),
            np.concatenate([left.end, right.end]),
            np.concatenate([left.key, right.key]),
            np.concatenate([
                np.hstack([left.slots, np.full((len(left), nr), -1, np.int64)]),
                np.hstack([np.full((len(right), nl), -1, np.int64), right.slots])]),
        ).sorted_by_end()

    def _negated(self, v: int, delta: dict[int, Records]) -> Records:
        """A NOT vertex: its child's records, kept in its store for the guards."""
        state = self.state
        child = delta[self.program.children[v][2]]
        if len(child) and v in state.excluded:  # a live-added query's: no earlier event
            child = child.take(~self._early(state.excluded[v], child.slots))
        if len(child):
            state.not_store[v].push_batch(child.start, child.end, child.key,
                                          np.ascontiguousarray(child.slots))
        state.stats[v].inputs += len(child)
        return child

    def _step_runs(self, limit: int | None) -> MatchBatch:
        """The strategies' RUN vertices take the waiting events with ts < ``limit`` (all
        when None): no event can still come before them in stream order (ts, id),
        which the strategies read."""
        out = MatchBatch(self.match_queries)
        state = self.state
        if not self._waiting_runs:
            return out
        state.run_pending, ready = ready_in_stream_order(state.run_pending, limit)
        if ready is None:
            return out
        for v in self._waiting_runs:
            began = perf_counter_ns()
            out += self._run_vertex(v, *ready)
            state.stats[v].ns += perf_counter_ns() - began
        return out

    def _step_chains(self, seqs, ts, types, only: frozenset[int] | None = None) -> MatchBatch:
        """The chains take the events as they are stored: in ts order, which is all
        they read (they pair no two events of equal ts), so they wait for nothing.
        ``only``: those of a replay (``_match``)."""
        out = MatchBatch(self.match_queries)
        for v in self._chains:
            if only is None or v in only:
                began = perf_counter_ns()
                out += self._run_vertex(v, seqs, ts, types)
                self.state.stats[v].ns += perf_counter_ns() - began
        return out

    def _run_vertex(self, v: int, seqs, ts, types) -> MatchBatch:
        """A RUN vertex (runs or a chain) steps through events in order; its matches
        to its queries' outputs."""
        out = MatchBatch(self.match_queries)
        prog, state = self.program, self.state
        run = prog.runs[v]
        if v in self._dead:
            return out
        if v in state.excluded and len(seqs):  # a live-added query's: no earlier event
            keep = ~self._early(state.excluded[v], seqs.reshape(-1, 1))
            seqs, ts, types = seqs[keep], ts[keep], types[keep]
        ok, keys = leaf_keys(state.store, seqs, run.key)
        keyed = ok.view(np.uint8)
        step = chain_step if isinstance(run.spec, ChainSpec) else run_step
        if step is chain_step and len(run.queries) == 1 and \
                self._plain_output(prog.queries[run.queries[0]]):
            return self._chain_ids(v, run, prog.queries[run.queries[0]], seqs, ts, types,
                                   keys, keyed)
        # in slices: the ring holds one slice's matches, so the budget bounds what
        # one slice of events makes, not how many events a batch brings
        for a in range(0, max(len(seqs), 1), RUN_SLICE):
            b = a + RUN_SLICE
            ring = self._scratch(v, prog.n_slots[v])
            try:
                step(run.spec, state.runs[v], state.store, state.lists, seqs[a:b], ts[a:b],
                     types[a:b], keys[a:b], keyed[a:b], ring)
            except StateBudgetExceeded as err:
                self._stop(v, err)
                break
            state.stats[v].outputs += len(ring)
            for qi in run.queries:
                self._output(out, prog.queries[qi], ring)
        state.stats[v].inputs += len(seqs)
        return out

    def _chain_ids(self, v: int, run, q: QueryProgram, seqs, ts, types, keys,
                   keyed) -> MatchBatch:
        """A chain read by one query that passes its matches on as they are: the
        kernel writes the matches' user ids itself, no records in between."""
        out = MatchBatch(self.match_queries)
        state = self.state
        for a in range(0, max(len(seqs), 1), RUN_SLICE):
            b = a + RUN_SLICE
            try:
                detected, ids = chain_step_ids(
                    run.spec, state.runs[v], state.store, state.lists, seqs[a:b], ts[a:b],
                    types[a:b], keys[a:b], keyed[a:b], q.var_slots, self.budget)
            except StateBudgetExceeded as err:
                self._stop(v, err)
                break
            if len(detected):
                out.parts.append((q.index, detected, ids, None))
                state.stats[v].outputs += len(detected)
                state.stats[q.spec.output].outputs += len(detected)
        state.stats[v].inputs += len(seqs)
        return out

    def _lists(self, v: int, delta: dict[int, Records]) -> Records:
        """A KLEENE vertex: the new lists its events make (one slot: the list handle)."""
        state, spec = self.state, self.program.kleene[v]
        elements = delta[spec.child]
        state.stats[v].inputs += len(elements)
        if not len(elements):
            return Records.empty(1)
        out_ring = self._scratch(v, 1)
        kleene_step(state.lists, state.store, state.growing[v], spec.window,
                    np.ascontiguousarray(elements.slots[:, 0]), elements.end, elements.key,
                    *spec.sets, out_ring)
        return Records.from_ring(out_ring)  # in the end-ts order the events came in

    def _scratch(self, v: int, n_slots: int) -> RingBuffer:
        """Vertex v's ring for one batch's new records, emptied: scratch, reused every
        batch (neither program nor state), limited to the budget as the state is."""
        ring = self._out_rings.get(v)
        if ring is None:
            ring = self._out_rings[v] = RingBuffer(n_slots, 1024)
            ring.limit = self.budget
        ring.reset()
        return ring

    def _keep(self, guard_vertex: int, recs: Records) -> Records:
        """The records the NOT at ``guard_vertex`` does not forbid."""
        if not len(recs):
            return recs
        keep = self.program.guards[guard_vertex].keep(
            self.store, self.state.not_store[guard_vertex], recs.start, recs.end,
            np.ascontiguousarray(recs.slots), self.state.lists)
        return recs.take(keep)

    def _keep_inputs(self, v: int, delta: dict[int, Records]) -> Records:
        """A SEQ vertex built on demand makes no records: its inputs' new records wait
        for its parent's join, which appends them to its queues as it goes."""
        left, right = self.program.children[v][:2]
        dl, dr = delta[left], delta[right]
        self.state.stats[v].inputs += len(dl) + len(dr)
        self._new_inputs[v] = (self._join_input(v, dl, 0), self._join_input(v, dr, 1))
        return Records.empty(self.program.n_slots[v])

    def _on_demand(self, v: int) -> OnDemand:
        """Vertex v's join bound to its queues and this batch's new input records, for
        the parent that builds its records."""
        prog, state = self.program, self.state
        left = prog.children[v][0]
        od = OnDemand(prog.joins[v], state.left_q.get(v),
                      self._on_demand(left) if self.plan.on_demand[left] else None,
                      state.right_q[v])
        dl, dr = self._new_inputs.pop(v)
        od.new_records(dl.start, dl.end, dl.key, np.ascontiguousarray(dl.slots),
                       dr.start, dr.end, dr.key, np.ascontiguousarray(dr.slots))
        return od

    def _join(self, v: int, delta: dict[int, Records]) -> Records:
        """A SEQ or AND vertex: its inputs' new records joined with each other and with
        its queues (built on demand: its left input's chain too)."""
        prog, state = self.program, self.state
        left, right, _ = prog.children[v]
        dl, dr = delta[left], delta[right]
        state.stats[v].inputs += len(dl) + len(dr)
        dl, dr = self._join_input(v, dl, 0), self._join_input(v, dr, 1)
        on_demand = self._on_demand(left) if self.plan.on_demand[left] else None
        if not len(dl) and not len(dr) and on_demand is None:
            return Records.empty(prog.n_slots[v])
        out_ring = self._scratch(v, prog.n_slots[v])
        state.stats[v].evictions += join_delta(
            prog.joins[v], state.store, state.left_q.get(v), state.right_q.get(v),
            dl.start, dl.end, dl.key, np.ascontiguousarray(dl.slots),
            dr.start, dr.end, dr.key, np.ascontiguousarray(dr.slots), out_ring,
            state.lists, on_demand)
        while on_demand is not None:  # the chain's queues count what they dropped
            state.stats[left].evictions += on_demand.evicted
            on_demand, left = on_demand.left_on_demand, prog.children[left][0]
        for gv in prog.host_guards[v]:  # the NOTs checked on its records, in the ring
            prog.guards[gv].drop_violated(state.store, state.not_store[gv], out_ring,
                                          state.lists)
        if v in prog.ring_roots:
            return out_ring  # to its query's OUTPUT alone (_output)
        return Records.from_ring(out_ring)  # the join emits in end-ts order

    # ------------------------------------------------------------ the watermark

    def _after_watermark(self) -> MatchBatch:
        """Release held matches that are due, then evict what the watermark made useless."""
        prog, state, wm = self.program, self.state, self.wm
        out = self._step_runs(wm)
        held = [(q, p) for q, p in zip(prog.queries, state.pending) if len(p)]
        for q, _ in held:
            out += self._release_held(q, wm)
        self._evict_vertices(wm)
        out += self._decide(wm)
        # (after the release: what is still held; nothing when nothing was)
        held_start = min((int(p.start.min()) for p in state.pending if len(p)),
                         default=wm) if held else wm
        for table in (state.fresh_since, state.excluded):
            for x, (boundary, ids, last) in list(table.items()):
                # every event held at the query's addition is gone: nothing to filter
                if state.store.base >= boundary and (not len(ids) or (
                        wm - self.store_retention > last and held_start > last)):
                    del table[x]
        horizon = self.kept_since = min(wm - self.store_retention, held_start)
        state.store.evict_before(horizon)
        if state.lists is not None:  # a list in a queue or held starts after this
            state.lists.py_evict_end_before(horizon)
        return out

    def _evict_vertices(self, wm: int) -> None:
        """The vertices let go of what no match can use once every event to come has
        ts >= ``wm``: queue records, negated matches, lists that can no longer grow,
        runs (chains' stacks) that started a window ago."""
        prog, state = self.program, self.state
        for v, run in prog.runs.items():  # runs of keys no event came for
            if wm - self._swept_at.setdefault(v, wm) >= run.window:
                state.stats[v].evictions += state.runs[v].evict_start_before(wm - run.window)
                self._swept_at[v] = wm
        for queues in (state.left_q, state.right_q):
            for v, queue in queues.items():
                state.stats[v].evictions += queue.py_evict_end_before(
                    wm - prog.queue_window[v])
        for v, store in state.not_store.items():
            state.stats[v].evictions += store.evict_before(
                wm - 2 * self.plan.guard[v].window_ms - 1)
        for v, growing in state.growing.items():  # no list ending before can grow
            state.stats[v].evictions += growing.py_evict_end_before(wm - prog.kleene[v].window)

    # ---------------------------------------------------------- introspection
    def state_bytes(self) -> int:
        """Bytes held by queues, NOT stores, the event store and held matches."""
        return self.state.nbytes()

    def query_state_bytes(self) -> dict[str, int]:
        """Per query: the bytes of the vertices it reads (a vertex shared by several
        queries counts for each), its held matches and its after-match policy's. The
        event store and the Kleene list nodes, which every query shares, are only in
        ``state_bytes()``."""
        state, plan = self.state, self.plan
        out = {q.name: 0 for q in plan.queries}
        for v, n in state.vertex_nbytes().items():
            for name in plan.users[v]:
                out[name] += n
        for q in self.program.queries:
            held = state.pending[q.index]
            out[q.name] += held.slots.nbytes + 24 * len(held)
            if q.index in state.policies:
                out[q.name] += state.policies[q.index].nbytes()
        return out

    def vertex_stats(self) -> list[dict]:
        rows, state = [], self.state
        for v in self.program.topo:
            st = state.stats[v]
            high = 0
            if v in state.left_q or v in state.right_q:
                high = sum(queues[v].high_water for queues in (state.left_q, state.right_q)
                           if v in queues)
            elif v in state.not_store:
                high = state.not_store[v].high_water
            label = self.plan.label(v)
            if self.plan.on_demand[v]:  # its parent builds its records: it outputs none
                label += " (on demand)"
            rows.append({"vertex": v, "operator": label, "inputs": st.inputs,
                         "outputs": st.outputs, "queue_high_water": high,
                         "evictions": st.evictions, "ms": st.ns / 1e6})
        return rows

    # ------------------------------------------------------------- snapshots
    def snapshot(self) -> bytes:
        """The complete engine state, versioned (restore it into an Engine of the same
        plan): ``EngineState.to_bytes``."""
        return self.state.to_bytes(self.program.fingerprint())

    def restore(self, blob: bytes) -> None:
        """Load a snapshot taken by ``snapshot()`` of an engine running the same plan;
        nothing is recompiled."""
        self.state = EngineState.from_bytes(self.program, blob)
        self._budget_state()


def run_events(plan: Plan, batches: Iterable, lateness: int = 0) -> tuple[MatchBatch, Engine]:
    """Convenience: every match of a finite stream (batches of events), flushed at the end."""
    engine = Engine(plan, lateness)
    out = MatchBatch(engine.match_queries)
    for b in batches:
        out += engine.process(b)
    out += engine.flush()
    return out, engine
