"""The compiled program of a plan: what the engine runs, apart from what it holds.

As FlinkCEP keeps the compiled ``NFA`` apart from the per-key ``NFAState`` and
``SharedBuffer``, dqcep keeps a ``Program`` (the plan's vertices compiled into
kernel specs: predicate sets, join specs, guard specs, keys, windows; never
changed once built) apart from an ``EngineState`` (``dqcep.runtime.state``:
event store, queues, NOT stores, held matches, watermark, string dictionary).
Processing is ``program x state x columns -> matches``; one program serves any
number of states (one per key in a Spark job), and restoring a state compiles
nothing. ``program_for(text)`` compiles a query file once per process.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from dqcep._kernels.guards import GUARD_MODES, Guard
from dqcep._kernels.joins import JoinPipeline, JoinSpec
from dqcep._kernels.leaves import LeafRouter, leaf_keys
from dqcep._kernels.predicates import PredicateSet
from dqcep._kernels.store import EventStore
from dqcep.plan import Kind, Plan, Port
from dqcep.plan.joins import equality_joins
from dqcep.runtime.compile import (ConstantCodes, aggregated_columns, effective_windows,
                                   guard_hosts, kleene_sets, plan_attributes, predicate_set,
                                   run_spec)


def _reads_negated(spec) -> bool:
    """Whether a NOT's conditions read its negated events' attributes (slots after the
    host's) from the event store."""
    return any(slot >= spec.n_host for p in spec.preds for slot in p.slots)


class QueryProgram(NamedTuple):
    """What the OUTPUT of one query runs."""

    index: int
    spec: object                 # the plan's QuerySpec
    name: str
    window: int
    never: bool
    var_slots: np.ndarray        # slot of each variable, in the query's variable order
    identity_slots: bool         # var_slots is 0..n-1: no column reordering needed
    preds: PredicateSet          # whole-match conditions
    now_guards: tuple[int, ...]  # NOT vertices checked when the match is found
    held_guards: tuple[int, ...]  # NOT vertices that hold the match until start + W
    held_active: tuple[np.ndarray, ...]  # per held guard: the slots that make it apply
    n_slots: int
    list_columns: tuple[int, ...] = ()  # the variables (by position) bound to Kleene lists
    list_mask: np.ndarray | None = None  # per root slot: it holds a list (None: none does)
    partition_cols: tuple[int, ...] = ()  # store columns of its [attr]s (after-match policy)
    # its root is a join or a RUN whose window is no wider than the query's: every
    # record the root makes is inside the query's window (the output need not check it)
    root_within: bool = False


class KleeneProgram(NamedTuple):
    """What a KLEENE vertex runs (``dqcep._kernels.lists.kleene_step``)."""

    child: int                   # its EVENT vertex
    window: int
    sets: tuple                  # (pairs, first, whole, whole_each, whole_pairs) PredicateSets


class RunProgram(NamedTuple):
    """What a RUN vertex runs: ``dqcep._kernels.runs.run_step`` under a selection
    strategy, ``dqcep._kernels.chains.chain_step`` under skip-till-any-match."""

    spec: object                 # the kernel's RunSpec or ChainSpec
    window: int
    key: np.ndarray              # int32 store columns of its [attr]s
    queries: tuple[int, ...]     # the queries whose matches it makes


class Universe(NamedTuple):
    """The codes a state's data are written in: event types (the plan's), attribute
    columns and string codes (the first ones pinned). A program compiled on top of a
    universe (``Program(plan, universe)``) starts its own with it, so a state written
    in that universe reads the same under the new program (``dqcep.runtime.live``)."""

    types: tuple[str, ...]
    attrs: tuple[str, ...]
    constants: tuple[str | None, ...]


class Program:
    """A plan compiled for the native engine; see the module docstring.

    Attributes are read-only by convention: every engine running this program
    shares them (kernel specs hold no state).
    """

    def __init__(self, plan: Plan, universe: Universe | None = None):
        self.plan = plan
        self.types = list(plan.types)
        self.attrs = plan_attributes(plan)
        # The queries' string constants get the first codes of every state's
        # dictionary (pinned there): a compiled constant means the same string
        # in every state this program runs.
        constants = ConstantCodes()
        if universe is not None:  # its columns and codes first, the plan's new ones after
            if tuple(self.types[:len(universe.types)]) != tuple(universe.types):
                raise ValueError("the plan's event types do not start with the universe's "
                                 "(build_plan(types=...))")
            self.attrs = list(universe.attrs) + [a for a in self.attrs
                                                 if a not in universe.attrs]
            # the universe's strings keep their codes (events in a state hold them);
            # only this program's constants are pinned (a change pinned every string the
            # engine held then: 300 changes, 72,000 strings never freed)
            constants = ConstantCodes(universe.constants)
        self.based_on = universe
        self.attr_index = {a: i for i, a in enumerate(self.attrs)}
        g = plan.graph
        self.eff_window = effective_windows(plan)
        hosts = guard_hosts(plan)
        self.topo = [int(v) for v in g.topo]
        self.kind = [plan.kind(v) for v in range(plan.n_vertices)]
        self.n_slots = [len(plan.slots[v]) for v in range(plan.n_vertices)]
        self.children = {v: (g.child(v, Port.LEFT), g.child(v, Port.RIGHT),
                             g.child(v, Port.CHILD)) for v in range(plan.n_vertices)}
        self.keys: dict[int, np.ndarray] = {}
        self.joins: dict[int, JoinSpec] = {}
        self.guards: dict[int, Guard] = {}
        self.host_guards: dict[int, list[int]] = {}
        self.kleene: dict[int, KleeneProgram] = {}
        self.runs: dict[int, RunProgram] = {}
        for v in self.topo:
            k = self.kind[v]
            if k == Kind.RUN:
                items = plan.run[v]
                self.runs[v] = RunProgram(
                    run_spec(items, plan.preds[v], plan.key_attrs[v], int(self.eff_window[v]),
                             self.attr_index, constants),
                    int(self.eff_window[v]),
                    np.array([self.attr_index[a] for a in plan.key_attrs[v]], np.int32),
                    tuple(i for i, q in enumerate(plan.queries) if q.root == v))
            if k == Kind.KLEENE:
                self.kleene[v] = KleeneProgram(
                    self.children[v][2], int(self.eff_window[v]),
                    kleene_sets(plan.preds[v], self.attr_index, constants))
            if k in (Kind.EVENT, Kind.SEQ, Kind.AND):
                self.keys[v] = np.array([self.attr_index[a] for a in plan.key_attrs[v]],
                                        dtype=np.int32)
            if k in (Kind.SEQ, Kind.AND):  # (EVENT vertices' filters: self.leaves, below)
                left, right = self.children[v][:2]
                self.joins[v] = JoinSpec(1 if k == Kind.SEQ else 2, int(self.eff_window[v]),
                                         self.n_slots[left], self.n_slots[right], self.keys[v],
                                         predicate_set(plan.preds[v], self.attr_index,
                                                       constants), list(plan.lists[v]))
                self.host_guards[v] = hosts[v]
            elif k == Kind.NOT:
                spec = plan.guard[v]
                self.guards[v] = Guard(
                    GUARD_MODES[spec.mode], spec.n_host, spec.left_slots, spec.right_slots,
                    spec.active_slots, predicate_set(spec.preds, self.attr_index, constants),
                    spec.window_ms, spec.host_lists, self.n_slots[self.children[v][2]])
        # the columns whose sum, min and max every list keeps (its aggregates)
        self.list_aggs = aggregated_columns(
            [p for ps in plan.preds for p in ps] + [p for q in plan.queries for p in q.preds]
            + [p for g in plan.guard if g is not None for p in g.preds], self.attr_index)
        # a contiguity strategy sees every event, of any type: the engine stores them all
        self.every_event = plan.every_event
        # SEQ vertices built on demand by their parent (plan/joins.py): they keep their
        # right input too, their parent keeps no queue of them
        self.on_demand = [v for v in self.topo if plan.on_demand[v]]
        self.left_vertices = [v for v in self.topo if v in self.joins
                              and not plan.on_demand[self.children[v][0]]]
        self.and_vertices = [v for v in self.topo if self.kind[v] == Kind.AND]
        self.right_vertices = self.and_vertices + self.on_demand
        # how long a vertex's queues keep a record: its window, and for a vertex built
        # on demand the window of whatever builds it
        self.queue_window = self.eff_window.tolist()  # (ints: read every slice)
        for v in reversed(self.topo):
            if plan.on_demand[v]:
                parent = int(g.head[next(iter(g.out_arcs(v)))])
                self.queue_window[v] = max(self.queue_window[v], self.queue_window[parent])
        self.not_vertices = [v for v in self.topo if v in self.guards]
        # the EVENT vertices' types, keys and filters, run in one pass per batch
        leaves = [v for v in self.topo if self.kind[v] == Kind.EVENT]
        self.leaf_index = {v: j for j, v in enumerate(leaves)}
        self.leaves = LeafRouter(
            [plan.event_type[v] for v in leaves],
            np.cumsum([0] + [len(self.keys[v]) for v in leaves]),
            np.concatenate([self.keys[v] for v in leaves] + [np.zeros(0, np.int32)]),
            predicate_set([p for v in leaves for p in plan.preds[v]], self.attr_index,
                          constants),
            np.cumsum([0] + [len(plan.preds[v]) for v in leaves]), len(self.types))
        self.eq_index = {v: (s1, self.attr_index[a1], s2, self.attr_index[a2])
                         for v, (s1, a1, s2, a2) in equality_joins(plan).items()}
        # no vertex is keyed ([attr]s or an equality join): every record's key is 0
        self.keyless = not self.eq_index and not any(map(len, self.keys.values()))
        # the joins whose records only their query's OUTPUT reads: they hand it the ring
        # they wrote them to (``Engine._output`` takes the matches from there)
        self.ring_roots = frozenset(
            q.root for q in plan.queries if self.kind[q.root] in (Kind.SEQ, Kind.AND)
            and not plan.on_demand[q.root] and g.parents(q.root) == (q.output,))
        self.pipeline = self._pipeline(leaves)
        self.queries = [self._query(i, spec, hosts[spec.output], constants)
                        for i, spec in enumerate(plan.queries)]
        self.match_queries = tuple((q.name, tuple(q.spec.variables)) for q in self.queries)
        self.store_retention = self._store_retention(plan)
        self.constants = tuple(constants.values)
        # the codes a state of this program never frees: its string constants'
        self.pinned = tuple(range(len(self.constants))) if universe is None else \
            tuple(sorted(constants.used))
        self._fingerprint: str | None = None
        # per vertex, the queries whose matches it takes part in (its root's descendants,
        # and their negations'): a query stopped by its budget takes its vertices' state
        self.readers: dict[int, tuple[int, ...]] = {v: () for v in range(plan.n_vertices)}
        for q in self.queries:
            seen, todo = set(), [q.spec.root, q.spec.output, *q.now_guards, *q.held_guards]
            while todo:
                v = todo.pop()
                if v < 0 or v in seen:
                    continue
                seen.add(v)
                todo += [*self.children[v], *self.host_guards.get(v, ())]
            for v in seen:
                self.readers[v] += (q.index,)
        self.prunable = {q.index: self._prunable(q) for q in self.queries
                         if q.spec.after_match is not None}

    @property
    def universe(self) -> Universe:
        return Universe(tuple(self.types), tuple(self.attrs), self.constants)

    def _prunable(self, q: QueryProgram) -> tuple[int, ...]:
        """The vertices whose partial matches a query's after-match policy may drop
        (``Engine._prune``): its KLEENE, SEQ and AND vertices below its root (not in a
        negation) that no other query reads, whose records, and their inputs', are
        keyed by the query's [attr]s (or by nothing, when it has none)."""
        plan, out, todo, seen = self.plan, [], [q.spec.root], set()
        while todo:
            v = todo.pop()
            if v < 0 or v in seen or self.kind[v] == Kind.NOT:
                continue
            seen.add(v)
            todo += list(self.children[v])
            keyed = [u for u in (v, *self.children[v]) if u >= 0]
            if self.kind[v] in (Kind.KLEENE, Kind.SEQ, Kind.AND) and \
                    self.readers[v] == (q.index,) and \
                    all(tuple(plan.key_attrs[u]) == tuple(q.spec.partition) for u in keyed):
                out.append(v)
        return tuple(sorted(out))

    def _pipeline(self, leaves: list[int]) -> JoinPipeline | None:
        """The plan's EVENT vertices and joins as one ``JoinPipeline`` (the engine runs
        a slice of events through them in one call), when every vertex that makes
        records as events come is one of those: no OR, NOT, KLEENE, join built on
        demand, join with a NOT to check or whose inputs are keyed for it (an equality
        join, or [attr] keys it does not share), no EVENT vertex a query's root or a
        RUN's child. None otherwise (the engine goes vertex by vertex)."""
        plan, g = self.plan, self.plan.graph
        joins = [v for v in self.topo if self.kind[v] in (Kind.SEQ, Kind.AND)]
        if not joins or any(k not in (Kind.EVENT, Kind.SEQ, Kind.AND, Kind.RUN, Kind.OUTPUT)
                            for k in self.kind):
            return None
        for v in joins:
            if plan.on_demand[v] or self.host_guards[v] or v in self.eq_index or \
                    not (self.keyless or plan.key_attrs[v]):
                return None
        if any(self.kind[p] not in (Kind.SEQ, Kind.AND) for v in leaves for p in g.parents(v)):
            return None
        index = {v: j for j, v in enumerate(leaves + joins)}
        if any(c not in index for v in joins for c in self.children[v][:2]):
            return None
        return JoinPipeline(self.leaves, leaves, joins, [self.joins[v] for v in joins],
                            [index[self.children[v][0]] for v in joins],
                            [index[self.children[v][1]] for v in joins])

    def _store_retention(self, plan: Plan) -> int:
        """How far back (ms) the event store must reach behind the watermark: to the
        oldest event a record may still be read from it for. A vertex's records are
        kept by its consumers (a join's queues: ``queue_window``; a NOT's store: two of
        its windows, and read from the event store only where its conditions name the
        negated events; an OUTPUT: not past the slice, held matches are kept apart) and
        by its own state (a RUN's runs, a KLEENE's growing lists: its window); a
        record of several events starts up to its window before it ends, one of one
        event does not. (Twice the largest vertex window, the rule before, kept an
        event type under a NOT four windows where its records are read for at most
        two, and not at all where the NOT names no attribute of it.)"""
        g = plan.graph
        need = [0]
        for v in range(plan.n_vertices):
            if self.kind[v] == Kind.NOT:  # a guard: no records of its own (its child's)
                continue
            keep = [int(self.eff_window[v]) if self.kind[v] in (Kind.RUN, Kind.KLEENE) else 0]
            for a in g.out_arcs(v):
                p = int(g.head[a])
                if self.kind[p] == Kind.NOT:
                    if _reads_negated(plan.guard[p]):
                        keep.append(2 * plan.guard[p].window_ms + 1)
                elif self.kind[p] != Kind.OUTPUT:
                    keep.append(self.queue_window[p])
            span = 0 if self.kind[v] == Kind.EVENT else int(self.eff_window[v])
            need.append(max(keep) + span)
        return max(need) + 2

    def _query(self, index: int, spec, guards: list[int], constants) -> QueryProgram:
        plan = self.plan
        slot_of = dict(spec.slot_of)
        var_slots = np.array([slot_of[v] for v in spec.variables], dtype=np.int64)
        held = [g for g in guards if plan.guard[g].holds_back]
        return QueryProgram(
            index, spec, spec.name, spec.window_ms, spec.never, var_slots,
            var_slots.tolist() == list(range(len(slot_of))),
            predicate_set(spec.preds, self.attr_index, constants),
            tuple(g for g in guards if not plan.guard[g].holds_back), tuple(held),
            tuple(np.array(plan.guard[g].active_slots, dtype=np.int64) for g in held),
            len(spec.slot_of),
            tuple(j for j, var in enumerate(spec.variables) if var in spec.lists),
            self._list_mask(spec), tuple(self.attr_index[a] for a in spec.partition),
            self.kind[spec.root] in (Kind.SEQ, Kind.AND, Kind.RUN)
            and 0 <= self.eff_window[spec.root] <= spec.window_ms)

    def _list_mask(self, spec) -> np.ndarray | None:
        root_lists = self.plan.lists[spec.root]
        if not root_lists:
            return None
        mask = np.zeros(len(spec.slot_of), np.uint8)
        mask[list(root_lists)] = 1
        return mask

    def fingerprint(self) -> str:
        """Which plan a snapshot belongs to; computed once per program (it pickles the
        plan's queries, which costs more than restoring a small state). The vertices
        built on demand are part of it: their queues are not those of a materialized
        vertex."""
        if self._fingerprint is None:
            import hashlib
            plan = self.plan
            parts = (plan.queries, plan.types, plan.graph.tail.tobytes(),
                     plan.graph.head.tobytes(), plan.on_demand, plan.schemas, plan.lookups)
            if self.based_on is not None:  # the universe's columns and codes too
                parts += (tuple(self.attrs), self.constants)
            self._fingerprint = hashlib.sha256(_unshared_pickle(parts)).hexdigest()
        return self._fingerprint

    def needed(self, ts: np.ndarray, ids: np.ndarray, types: np.ndarray, val: np.ndarray,
               kind: np.ndarray) -> np.ndarray:
        """Boolean mask: the events some EVENT vertex accepts (its type, its key
        attributes present, its leaf predicates true). No other event can take
        part in a match or violate a negation, so a preprocessing stage may drop
        them before the shuffle (``plan.pushdown_filters()`` lists the same rules).
        Strings in ``val`` are codes of a dictionary that starts with ``constants``.
        """
        n = len(ts)
        keep = np.zeros(n, dtype=bool)
        if not n:
            return keep
        store = EventStore(len(self.attrs))  # scratch: evaluated, then dropped
        first = store.append(np.ascontiguousarray(ts), np.ascontiguousarray(ids),
                             np.ascontiguousarray(val), np.ascontiguousarray(kind))
        seqs = np.arange(first, first + n, dtype=np.int64)
        if self.every_event:
            keep[:] = True  # any event may lie between a contiguous match's events
            return keep
        for v, run in self.runs.items():
            for t in self.plan.run[v].types:
                rows = np.flatnonzero(types == t)
                if len(run.key):
                    rows = rows[leaf_keys(store, seqs[rows], run.key)[0]]
                keep[rows] = True
        _, taken = self.leaves.route(store, seqs, np.ascontiguousarray(ts, np.int64),
                                     np.ascontiguousarray(types, np.int32))
        for _, _, leaf_seqs in taken:
            keep[leaf_seqs - first] = True
        return keep


@lru_cache(maxsize=16)
def program_for(queries_text: str, names: tuple[str, ...] | None = None) -> Program:
    """The program of a query file (its queries named in ``names``; all when None),
    parsed, planned and compiled once per process however many engines run it
    (one per partition key and micro-batch in a Spark job)."""
    from dqcep.lang import parse
    from dqcep.plan import build_plan

    parsed = parse(queries_text)
    queries = parsed.queries
    if names is not None:
        queries = [q for q in queries if q.name in names]
    return Program(build_plan(queries, tables=parsed.tables, schemas=parsed.schemas))


def _unshared_pickle(obj) -> bytes:
    """``obj`` pickled without the memo: equal objects give equal bytes whichever of
    their parts are one object (a plan built from a checkpoint's strings shares
    fewer than the running one, whose were the planner's own)."""
    import io
    import pickle
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.fast = True  # no memo (the parts hold no cycles)
    pickler.dump(obj)
    return out.getvalue()
