"""The plan's records: what ``build_plan`` (``dqcep.plan.planner``) gives the runtime.

Plain data: numpy arrays, tuples and small frozen records; a plan pickles small and
carries no parser objects or closures (FlinkCEP keeps its compiled ``State`` and
``StateTransition`` apart from the ``NFACompiler`` alike).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dqcep.lang import ast
from dqcep.plan.bytecode import Predicate
from dqcep.plan.lookups import LookupColumn
from dqcep.plan.orthogonal import NIL, Kind, OrthogonalList, Port, VertexView

UNBOUNDED = -1  # window of a vertex used only under a negation


@dataclass(frozen=True)
class GuardSpec:
    """A NOT vertex: no match of its child may lie in the interval (spec section 3).

    Slots: ``0..n_host-1`` are the host record's, ``n_host..`` the child's.
    GAP:      end(left_slots)   <  ts <  start(right_slots)
    LEADING:  end(match) - W    <= ts <  start(right_slots)
    TRAILING: end(left_slots)   <  ts <= start(match) + W
    AND:      end(match) - W    <= ts <= start(match) + W
    The guard applies only to records where one of ``active_slots`` is bound
    (a NOT inside an OR branch that was not taken imposes nothing).
    """

    mode: str
    n_host: int
    left_slots: tuple[int, ...]
    right_slots: tuple[int, ...]
    active_slots: tuple[int, ...]
    preds: tuple[Predicate, ...]
    window_ms: int
    holds_back: bool  # TRAILING / AND: detected at start + W, after the watermark
    host_lists: tuple[int, ...] = ()  # host slots that hold Kleene lists (first..last ts)

    @property
    def signature(self) -> tuple:
        return (self.mode, self.n_host, self.left_slots, self.right_slots, self.active_slots,
                tuple(p.signature for p in self.preds), self.window_ms, self.host_lists)


@dataclass(frozen=True)
class RunItems:
    """What a RUN vertex runs: a flat SEQ under a selection strategy (spec 5.2)."""

    strategy: str                  # skip-till-next-match | strict- | partition-contiguity
    types: tuple[int, ...]         # per slot (positive item, in SEQ order): its type index
    kleene: tuple[bool, ...]       # per slot: a Kleene item (the slot holds a list)

    @property
    def contiguity(self) -> bool:
        """Does every event count (not only those of the items' types)?"""
        return self.strategy in (ast.STRICT, ast.PARTITION)


@dataclass(frozen=True)
class QuerySpec:
    name: str
    output: int                    # the OUTPUT vertex
    root: int                      # the vertex whose results the OUTPUT emits
    variables: tuple[str, ...]     # positive variables in source order
    slot_of: tuple[tuple[str, int], ...]  # variable -> slot of the root record
    window_ms: int
    preds: tuple[Predicate, ...]   # checked on the complete match at the OUTPUT
    never: bool                    # a constant conjunct is false: no match at all
    returns: tuple[tuple[str, str | None], ...]
    dropped: tuple[str, ...]       # conjuncts that can never apply (explain says why)
    strategy: str = ast.ANY_MATCH  # selection strategy (spec 5.2)
    lists: tuple[str, ...] = ()    # the variables bound to lists (Kleene items)
    after_match: str | None = None  # after-match policy (spec 6)
    after_match_at: tuple[int, int] = (0, 0)  # its line and column (plain data: no ast)
    partition: tuple[str, ...] = ()  # its top-level [attr]s: the policy's partition
    # joins (the DAG) or one chain (a RUN vertex under skip-till-any-match), why, and
    # the work per window the cost model estimated for each (empty: not estimated)
    construction: str = "joins"
    construction_why: str = ""
    construction_work: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class LeafFilter:
    """What one EVENT vertex accepts: required attributes and filter predicates."""

    required_attrs: tuple[str, ...]
    preds: tuple[Predicate, ...]


@dataclass
class Plan:
    graph: OrthogonalList
    types: tuple[str, ...]                     # event type names; EVENT vertices index it
    event_type: np.ndarray                     # int32[V]: type index, -1 for operators
    window: np.ndarray                         # int64[V]: ms, UNBOUNDED under negation
    estimate: np.ndarray                       # float64[V]: est. partial matches per window
    slots: tuple[tuple[str, ...], ...]         # per vertex: slot labels of its records
    preds: tuple[tuple[Predicate, ...], ...]   # per vertex: conjuncts checked there
    key_attrs: tuple[tuple[str, ...], ...]     # per vertex: [attr] partition key
    lists: tuple[tuple[int, ...], ...]         # per vertex: slots that hold Kleene lists
    guard: tuple[GuardSpec | None, ...]        # per NOT vertex
    run: tuple[RunItems | None, ...]           # per RUN vertex
    users: tuple[tuple[str, ...], ...]         # per vertex: queries that use it
    queries: tuple[QuerySpec, ...]
    # per vertex: its records computed on demand by its parent (plan/joins.py), and why
    on_demand: tuple[bool, ...] = ()
    materialization: tuple[str, ...] = ()
    # the declared schemas (EVENT Type(...)) of the plan's types: their events are checked
    schemas: tuple[ast.EventSchema, ...] = ()
    # lookups (``table(v.attr).column``) read as attributes filled at ingest, and the
    # declared tables they read (plan/lookups.py)
    lookups: tuple[LookupColumn, ...] = ()
    tables: tuple[ast.LookupTable, ...] = ()
    # per vertex: what it computes, whatever its number (kind, event type name,
    # conditions, key, its children's keys, the epoch of a live-added query's NOT and
    # RUN vertices): a vertex of another plan with the same key holds the same records
    # (dqcep.runtime.live carries state across a change of the query set by it)
    keys: tuple = ()

    # ------------------------------------------------------------ views
    @property
    def n_vertices(self) -> int:
        return self.graph.n_vertices

    def kind(self, v: int) -> Kind:
        return Kind(int(self.graph.kind[v]))

    def label(self, v: int) -> str:
        k = self.kind(v)
        if k == Kind.EVENT:
            return f"EVENT {self.types[self.event_type[v]]}"
        if k == Kind.KLEENE:
            return f"KLEENE {self.types[self.event_type[v]]}+"
        if k == Kind.RUN:
            run = self.run[v]
            items = ", ".join(self.types[t] + ("+" if kl else "")
                              for t, kl in zip(run.types, run.kleene))
            return f"RUN SEQ({items}) USING {run.strategy}"
        if k == Kind.OUTPUT:
            return f"OUTPUT {', '.join(self.users[v])}"
        return k.name

    def vertex(self, v: int) -> VertexView:
        g = self.graph
        k = self.kind(v)
        left_port = Port.CHILD if k in (Kind.NOT, Kind.OUTPUT, Kind.KLEENE) else Port.LEFT
        lchild, rchild = g.child(v, left_port), g.child(v, Port.RIGHT)
        return VertexView(
            node=v, data=self.label(v),
            lchild=lchild, lchild_data=self.slots[lchild] if lchild != NIL else (),
            rchild=rchild, rchild_data=self.slots[rchild] if rchild != NIL else (),
            parents=g.parents(v), guards=g.guards(v))

    def shared_vertices(self) -> list[int]:
        """Operator/event vertices with more than one parent input."""
        return [v for v in range(self.n_vertices)
                if self.kind(v) not in (Kind.OUTPUT,) and
                sum(1 for _ in self.graph.out_arcs(v)) > 1]

    def pushdown_filters(self) -> dict[str, tuple[LeafFilter, ...]]:
        """Per event type, the alternatives that keep an event (Spark pushes these down).

        An event of type T is needed iff some alternative accepts it: it carries
        the required attributes and passes every predicate (slot 0 is the event).
        Types that no query uses are absent.
        """
        out: dict[str, list[LeafFilter]] = {}
        for v in range(self.n_vertices):
            if self.kind(v) == Kind.RUN:  # an event of a slot's type may fit it
                for t in self.run[v].types:
                    f = LeafFilter(self.key_attrs[v], ())
                    if f not in out.setdefault(self.types[t], []):
                        out[self.types[t]].append(f)
            if self.kind(v) == Kind.EVENT:
                etype = self.types[self.event_type[v]]
                f = LeafFilter(self.key_attrs[v], self.preds[v])
                if f not in out.setdefault(etype, []):
                    out[etype].append(f)
        return {t: tuple(fs) for t, fs in sorted(out.items())}

    @property
    def every_event(self) -> bool:
        """Does a contiguity strategy need every event, of any type (no pushdown)?"""
        return any(r is not None and r.contiguity for r in self.run)

    @property
    def total_cost(self) -> float:
        internal = [v for v in range(self.n_vertices)
                    if self.kind(v) in (Kind.SEQ, Kind.AND, Kind.OR)]
        return float(self.estimate[internal].sum()) if internal else 0.0
