"""Queries -> one shared, decomposed operator DAG (the plan).

Planning a file of queries takes two steps per query, then one for the file:

1. *Decompose* the pattern into a binary tree: each n-ary SEQ/AND/OR becomes a
   tree of simplest sub-queries (one operator, two operands), bracketed by the
   cost model (``dqcep.plan.cost``). Each NOT becomes a guard: a unary NOT
   vertex over the negated pattern, attached to the vertex that decides it.
2. *Place predicates* on that tree (see ``_place``): single-variable conjuncts
   become leaf filters, multi-variable conjuncts sit at the lowest vertex that
   binds all their variables, a top-level ``[attr]`` becomes the partition key
   of every vertex, conjuncts that need the whole match and the negations whose
   interval depends on the whole match go to the query's OUTPUT vertex.
3. *Intern* every tree into one orthogonal list by hash-consing: a vertex is
   identified by its operator, its children, its compiled predicates, key and
   guards. Predicates address events by slot, not by variable name, so the
   same sub-query in two queries is one vertex with several parents. A shared
   vertex prunes with the largest window among its users; each parent and the
   OUTPUT re-check their own.

A Kleene item ``Type+ v[]`` (spec 5.1) is a KLEENE vertex of its own, a unary
iteration operator over the EVENT vertex of its type: its records are lists (one
slot holding a list). Its conditions are placed by what they read: a condition
on each element alone (``v.value > 20``) filters the EVENT vertex; one on an
element and the one before or the first (``v[i].value > v[i-1].value``) is checked
at the KLEENE vertex as each element is appended; one on the whole list
(aggregates, ``v[last]``) at the KLEENE vertex on every list it makes; one with
other variables where they are all bound, for every element.

A query with a selection strategy other than skip-till-any-match (spec 5.2) is
one RUN vertex: the strategy decides a match by the events that come after its
prefix in stream order, which a join of sub-queries cannot see, so its flat SEQ
runs as an automaton over the stream (``RunItems``: the slots' types and which
are Kleene items). Every positive condition is compiled on the RUN record (one
slot per positive item, Kleene slots holding lists); the runtime checks each
where its last variable is placed, the whole-list ones on the complete match.
Its negations are decided at the OUTPUT. A RUN vertex is shared by queries with
the same items, strategy, conditions and key.

The result (``Plan``) is plain data: numpy arrays, tuples and small frozen
records. It pickles small and carries no parser objects or closures.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from dqcep.lang import ast
from dqcep.plan.bytecode import Predicate, compile_predicate, evaluate
from dqcep.plan.cost import (MAX_AND_DP, SEL_EQUAL, SEL_KEY, SEL_NOT, W_COND, W_PROBE,
                             W_RECORD, ChainSlot, CostModel, better, chain_work, intake_work,
                             lists_made, selectivity)
from dqcep.plan.joins import ALWAYS, AUTO, CHAIN, choose_materialization
from dqcep.plan.lookups import LookupColumn, resolve_all
from dqcep.plan.orthogonal import NIL, Kind, OrthogonalList, Port, VertexView

UNBOUNDED = -1  # window of a vertex used only under a negation


# ------------------------------------------------------------- plan records


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


# ---------------------------------------------------- per-query binary tree


@dataclass(eq=False)
class _Node:
    kind: Kind
    vars: tuple[str, ...]            # output slots, in order
    etype: str | None = None
    left: "_Node | None" = None
    right: "_Node | None" = None
    preds: list[ast.Expr] = field(default_factory=list)
    guards: list["_Guard"] = field(default_factory=list)
    estimate: float = 0.0
    items: tuple[tuple[str, bool], ...] = ()  # RUN: per slot its type, Kleene or not


@dataclass(eq=False)
class _Guard:
    negation: ast.Negation
    mode: str
    left_vars: tuple[str, ...]
    right_vars: tuple[str, ...]
    active_vars: tuple[str, ...]
    tree: _Node
    preds: list[ast.Expr] = field(default_factory=list)


class _QueryPlanner:
    """Decomposition and predicate placement for one query."""

    def __init__(self, q: ast.Query, cost: CostModel, chain: bool = False):
        self.q = q
        self.chain = chain  # run as one chain (a RUN vertex under skip-till-any-match)
        self.cost = cost
        self.w = q.within.ms
        self.negated = {e.var for e, neg in ast.event_patterns(q.pattern) if neg}
        self.kleene = ast.kleene_vars(q.pattern)
        self.kleene_nodes: dict[str, _Node] = {}
        parts = ast.conjuncts(q.where)
        self.constant = [c for c in parts if not ast.expr_vars(c) and not ast.has_equivalence(c)]
        rest = [c for c in parts if c not in self.constant]
        self.key_attrs = tuple(sorted({c.attr for c in rest if isinstance(c, ast.Equivalence)}))
        rest = [c for c in rest if not isinstance(c, ast.Equivalence)]
        self.positive = [c for c in rest if not ast.expr_vars(c) & self.negated]
        self.negation_conjuncts = [c for c in rest if ast.expr_vars(c) & self.negated]
        self.dropped: list[str] = []
        self.final: list[ast.Expr] = []
        self.output_guards: list[_Guard] = []

    # decomposition --------------------------------------------------------
    def tree(self, node: ast.Pattern, conjuncts: list[ast.Expr], keyed: bool) -> _Node:
        """Binary tree of a positive pattern; ``conjuncts`` only steer the cost model."""
        if isinstance(node, ast.EventPattern):
            filters = [c for c in conjuncts if ast.expr_vars(c) == {node.var}]
            return _Node(Kind.EVENT, (node.var,), etype=node.type,
                         estimate=self.cost.leaf(node.type, self.w, filters))
        if isinstance(node, ast.Kleene):
            filters = [c for c in conjuncts if ast.expr_vars(c) == {node.var}
                       and element_filter(c, node.var)]
            leaf = _Node(Kind.EVENT, (node.var,), etype=node.type,
                         estimate=self.cost.leaf(node.type, self.w, filters))
            kleene = _Node(Kind.KLEENE, (node.var,), etype=node.type, left=leaf,
                           estimate=self.cost.lists(leaf.estimate))
            self.kleene_nodes[node.var] = kleene
            return kleene
        items = [self.tree(i, conjuncts, keyed) for i in node.items
                 if not isinstance(i, ast.Negation)]
        return self._combine(node.op, items, conjuncts, keyed)

    def _combine(self, op: str, items: list[_Node], conjuncts, keyed) -> _Node:
        kind = Kind[op]
        if op == ast.OR or len(items) == 1:
            # balanced: an OR of n items is log2(n) vertices deep, not n (the order of
            # the alternatives is kept, which is all an OR's output depends on)
            while len(items) > 1:
                pairs = [_Node(kind, a.vars + b.vars, left=a, right=b,
                               estimate=a.estimate + b.estimate)
                         for a, b in zip(items[0::2], items[1::2])]
                items = pairs + items[len(pairs) * 2:]
            return items[0]
        n = len(items)
        item_vars = [frozenset(it.vars) for it in items]

        def estimate(members: tuple[int, ...]) -> float:
            inside = frozenset().union(*(item_vars[i] for i in members))
            cs = [c for c in conjuncts if ast.expr_vars(c) <= inside
                  and not any(ast.expr_vars(c) <= item_vars[i] for i in members)]
            return self.cost.combine(op, [items[i].estimate for i in members], cs, keyed)

        if op == ast.SEQ:
            splits = lambda s: [(s[:k], s[k:]) for k in range(len(s) - 1, 0, -1)]  # noqa: E731
            groups = [tuple(range(i, j)) for length in range(1, n + 1)
                      for i in range(0, n - length + 1) for j in [i + length]]
        elif n <= MAX_AND_DP:
            def splits(s):
                # Ties go to the first candidate: the left-deep split in source order,
                # then other splits with a single operand on the right, then the rest.
                first = (s[:-1], s[-1:])
                rest = [(left, tuple(i for i in s if i not in left))
                        for r in range(len(s) - 1, 0, -1)
                        for left in itertools.combinations(s, r)]
                return [first] + [x for x in rest if x != first]
            groups = [c for r in range(1, n + 1) for c in itertools.combinations(range(n), r)]
        else:
            splits = lambda s: [(s[:-1], s[-1:])]  # noqa: E731
            # singletons first: a group's parts must be costed before the group
            groups = [(i,) for i in range(n)] + [tuple(range(j)) for j in range(2, n + 1)]

        best: dict[tuple[int, ...], tuple[float, tuple | None]] = {}
        for g in groups:  # groups come smallest first
            if len(g) == 1:
                best[g] = (0.0, None)
                continue
            own = estimate(g)
            choice = None
            for left, right in splits(g):
                if left not in best or right not in best:
                    continue
                c = own + best[left][0] + best[right][0]
                if choice is None or better(c, choice[0]):
                    choice = (c, (left, right))
            best[g] = choice

        def build(g):
            if len(g) == 1:
                return items[g[0]]
            left, right = best[g][1]
            lt, rt = build(left), build(right)
            return _Node(kind, lt.vars + rt.vars, left=lt, right=rt, estimate=estimate(g))

        return build(tuple(range(n)))

    # placement ------------------------------------------------------------
    @staticmethod
    def lca(root: _Node, vars_: set[str]) -> _Node:
        node = root
        while node.kind != Kind.KLEENE:  # a list's variable is bound at its KLEENE vertex
            for child in (node.left, node.right):
                if child is not None and vars_ <= set(child.vars):
                    node = child
                    break
            else:
                return node
        return node

    @staticmethod
    def co_bindable(node: _Node, vars_: set[str]) -> bool:
        """Can all of ``vars_`` be bound in one match (no OR splits them)?"""
        if node.left is None or node.kind == Kind.KLEENE:
            return True
        sides = [vars_ & set(child.vars) for child in (node.left, node.right)]
        if node.kind == Kind.OR and all(sides):
            return False
        return all(_QueryPlanner.co_bindable(child, side)
                   for child, side in zip((node.left, node.right), sides) if side)

    def _place(self, root: _Node, conjuncts: list[ast.Expr]) -> None:
        for c in conjuncts:
            vars_ = set(ast.expr_vars(c))
            (only,) = vars_ if len(vars_) == 1 else (None,)
            if only in self.kleene_nodes:
                # each element alone: filter the events; an iteration or whole-list
                # condition: at the KLEENE vertex itself
                node = self.kleene_nodes[only]
                (node.left if element_filter(c, only) else node).preds.append(c)
                continue
            host = self.lca(root, vars_)
            if host.kind == Kind.OR:
                self.dropped.append(f"{_text(c)}: its variables lie in different OR branches, "
                                    "so they are never bound together")
            else:
                host.preds.append(c)

    def chain_slots(self) -> list[ChainSlot]:
        """What the chain's estimate reads of each positive item (a chain-eligible
        query): its events per window, and its conditions placed as
        ``runtime.compile.chain_placement`` places them."""
        q = self.q
        items = q.pattern.items if isinstance(q.pattern, ast.Operator) else (q.pattern,)
        slots = [i for i in items if not isinstance(i, ast.Negation)]
        kleene = [isinstance(i, ast.Kleene) for i in slots]
        rank = {slots[s].var: r for r, s in enumerate(chain_order(kleene))}
        filters: list[list[ast.Expr]] = [[] for _ in slots]
        bind: list[list[ast.Expr]] = [[] for _ in slots]
        step: list[list[ast.Expr]] = [[] for _ in slots]
        index = {item.var: s for s, item in enumerate(slots)}
        for c in self.positive:
            vars_ = ast.expr_vars(c)
            if not vars_ or not vars_ <= set(index) or ast.has_equivalence(c) or _whole_list(c):
                continue
            at = max(vars_, key=rank.__getitem__)
            s = index[at]
            if kleene[s] and _reads_position(c, at, ast.INDEX_PREVIOUS, ast.INDEX_FIRST):
                step[s].append(c)
            elif vars_ == {at}:
                filters[s].append(c)
            else:
                bind[s].append(c)
        return [ChainSlot(self.cost.leaf(item.type, self.w, filters[s]), kleene[s],
                          _selectivity(bind[s]), bool(bind[s]), _selectivity(step[s]),
                          bool(step[s]))
                for s, item in enumerate(slots)]

    def plan(self) -> tuple[_Node, list[_Guard]]:
        q = self.q
        if q.strategy != ast.ANY_MATCH or self.chain:
            return self._run()
        root = self.tree(q.pattern, self.positive, bool(self.key_attrs))
        for c in self.positive:
            if ast.has_equivalence(c):
                self.final.append(c)
        self._place(root, [c for c in self.positive if not ast.has_equivalence(c)])
        self._negations(q.pattern, root)
        return root, self.output_guards

    def _run(self) -> tuple[_Node, list[_Guard]]:
        """A query under a selection strategy (or run as a chain under
        skip-till-any-match): one RUN vertex over its flat SEQ, every
        positive condition on it, a top-level [attr] as its key (which the runtime
        checks exactly, element by element), the negations at the OUTPUT."""
        q = self.q
        items = q.pattern.items if isinstance(q.pattern, ast.Operator) else (q.pattern,)
        slots = [i for i in items if not isinstance(i, ast.Negation)]
        first = slots[0]
        root = _Node(Kind.RUN, tuple(i.var for i in slots),
                     items=tuple((i.type, isinstance(i, ast.Kleene)) for i in slots),
                     estimate=self.cost.leaf(first.type, self.w, []))
        # a nested [attr] ([room] OR a.x = 1) is checked too as events are placed: it
        # covers the events bound so far (spec 5.2)
        root.preds = [c for c in self.positive if not isinstance(c, ast.Equivalence)]
        self._negations(q.pattern, root)
        return root, self.output_guards

    def _negations(self, node: ast.Item, root: _Node) -> None:
        if not isinstance(node, ast.Operator):
            return
        positives = [i for i in node.items if not isinstance(i, ast.Negation)]
        pos_vars = [tuple(ast.positive_vars(i)) for i in positives]
        seen_positive = 0
        for item in node.items:
            if not isinstance(item, ast.Negation):
                seen_positive += 1
                self._negations(item, root)
                continue
            if node.op == ast.AND:
                mode, left, right = "AND", (), ()
                active = tuple(v for vs in pos_vars for v in vs)
            elif seen_positive == 0:
                mode, left, right = "LEADING", (), pos_vars[0]
                active = right
            elif seen_positive == len(positives):
                mode, left, right = "TRAILING", pos_vars[-1], ()
                active = left
            else:
                mode = "GAP"
                left, right = pos_vars[seen_positive - 1], pos_vars[seen_positive]
                active = left + right
            self._guard(item, mode, left, right, active, root)

    def _guard(self, neg: ast.Negation, mode, left, right, active, root: _Node) -> None:
        neg_vars = set(ast.positive_vars(neg.pattern))
        mine = [c for c in self.negation_conjuncts if ast.expr_vars(c) & neg_vars]
        inner, outer = [], []
        for c in mine:
            others = ast.expr_vars(c) - neg_vars
            if others & self.negated:
                self.dropped.append(f"{_text(c)}: names variables of two different negations")
            elif not others and not ast.has_equivalence(c):
                inner.append(c)
            else:
                outer.append(c)
        tree = self.tree(neg.pattern, inner, False)
        self._place(tree, inner)
        guard = _Guard(neg, mode, left, right, active, tree)
        anchor = set(active)
        for c in outer:
            others = set(ast.expr_vars(c)) - neg_vars
            # The guard applies when one of its active variables is bound (its
            # item was taken); the conjunct matters if its variables can be bound
            # together with one of them. Where they are not, it is ignored at run time.
            if not any(self.co_bindable(root, others | {a}) for a in active):
                self.dropped.append(f"{_text(c)}: never bound together with the NOT's gap")
                continue
            guard.preds.append(c)
            anchor |= others
        # The negated event is never one of the match's own events: a variable of a
        # type the NOT forbids, bound elsewhere in the same match, may hold the very
        # event the gap would see. Decide the guard where such variables are bound.
        neg_types = {e.type for e, _ in ast.event_patterns(neg.pattern)}
        for ev, negated in ast.event_patterns(self.q.pattern):
            if not negated and ev.type in neg_types and ev.var not in anchor and \
                    any(self.co_bindable(root, {ev.var, a}) for a in active):
                anchor.add(ev.var)
        at_output = mode != "GAP" or root.kind == Kind.RUN or \
            any(ast.has_equivalence(c) for c in guard.preds)
        if at_output:
            self.output_guards.append(guard)
        else:
            self.lca(root, anchor).guards.append(guard)


MAX_CHAIN_SLOTS = 32  # dqcep._kernels.chains
# how a query under skip-till-any-match may run: DAG joins, or one chain (a RUN vertex)
CONSTRUCTIONS = ("joins", "chain")


def chain_order(kleene: Sequence[bool]) -> list[int]:
    """The order a chain binds its slots in (``kleene``: per slot, a Kleene item?):
    the plain slots from the last to the first, then the Kleene slots from the first
    to the last (dqcep._kernels.chains). A condition is placed at the slot that
    completes its slots in this order."""
    k = len(kleene)
    return [s for s in range(k - 1, -1, -1) if not kleene[s]] + \
        [s for s in range(k) if kleene[s]]


def _reads_position(c: ast.Expr, var: str, *indexes: str) -> bool:
    return any(isinstance(e, ast.AttrRef) and e.var == var and e.index in indexes
               for e in ast.walk_expr(c))


def _whole_list(c: ast.Expr) -> bool:
    return any(isinstance(e, ast.Aggregate) or (isinstance(e, ast.AttrRef) and
                                               e.index == ast.INDEX_LAST)
               for e in ast.walk_expr(c))


def _selectivity(cs: list[ast.Expr]) -> float:
    out = 1.0
    for c in cs:
        out *= selectivity(c)
    return out


def dag_work(node: _Node, keyed: bool) -> tuple[float, float]:
    """(records per window, estimated work per window) of a query's tree of joins,
    with the weights of ``plan.cost`` (a join looks at left x right candidates, an
    equality index at a share of them; a KLEENE vertex makes its lists once and tries
    each new element on each; a condition costs W_COND per evaluation)."""
    if node.kind == Kind.EVENT:
        return node.estimate, 0.0
    if node.kind == Kind.KLEENE:
        n, work = dag_work(node.left, keyed)
        steps = [c for c in node.preds if _reads_position(
            c, node.vars[0], ast.INDEX_PREVIOUS, ast.INDEX_FIRST)]
        made = lists_made(n, _selectivity(steps))
        cond = W_COND if node.preds else 0.0
        return made, work + made * (W_RECORD + n / 2 * (W_PROBE + cond))
    if node.kind == Kind.RUN:
        return node.estimate, 0.0
    (nl, wl), (nr, wr) = dag_work(node.left, keyed), dag_work(node.right, keyed)
    if node.kind == Kind.OR:
        return nl + nr, wl + wr + (nl + nr) * W_RECORD
    probes = nl * nr * (0.5 if node.kind == Kind.SEQ else 1.0) * (SEL_KEY if keyed else 1.0)
    preds = list(node.preds)
    index = next((c for c in preds if isinstance(c, ast.Binary) and c.op == "=" and
                  isinstance(c.left, ast.AttrRef) and isinstance(c.right, ast.AttrRef)
                  and c.left.var != c.right.var and not keyed), None)
    if index is not None:  # looked up by the equality index
        probes *= SEL_EQUAL
        preds.remove(index)
    made = probes * _selectivity(preds)
    work = probes * (W_PROBE + (W_COND if preds else 0.0)) + made * W_RECORD
    for _ in node.guards:  # a NOT decided here: checked on each record, drops a share
        work += made * W_COND
        made *= SEL_NOT
    return made, wl + wr + work


def chain_eligible(q: ast.Query) -> bool:
    """Can the query run as one chain: a skip-till-any-match SEQ whose items are
    events, Kleene items and negations (a RUN vertex's shape, spec 5.2), with at most
    MAX_CHAIN_SLOTS positive items, more than one or a Kleene item?"""
    if q.strategy != ast.ANY_MATCH:
        return False
    items = q.pattern.items if isinstance(q.pattern, ast.Operator) else (q.pattern,)
    if isinstance(q.pattern, ast.Operator) and q.pattern.op != ast.SEQ:
        return False
    positive = [i for i in items if not isinstance(i, ast.Negation)]
    if not all(isinstance(i, (ast.EventPattern, ast.Kleene)) for i in positive):
        return False
    return 1 <= len(positive) <= MAX_CHAIN_SLOTS and (
        len(positive) > 1 or isinstance(positive[0], ast.Kleene))


def element_filter(c: ast.Expr, var: str) -> bool:
    """Is a conjunct over the Kleene variable ``var`` alone a condition on each element
    by itself (``v.attr`` / ``v[i].attr`` only), so that it can filter the events?"""
    return not any(isinstance(x, ast.Aggregate) or (isinstance(x, ast.AttrRef)
                   and x.var == var and x.index not in (None, ast.INDEX_EACH))
                   for x in ast.walk_expr(c))


def _text(e: ast.Expr) -> str:
    from dqcep.lang.printer import format_expr
    return format_expr(e)


# -------------------------------------------------------------- interning


class _Interner:
    """Hash-conses per-query trees into one orthogonal list."""

    def __init__(self, types: Sequence[str] = ()):
        self.graph = OrthogonalList()
        self.ids: dict[tuple, int] = {}
        self.sigs: list[tuple] = []
        self.types: list[str] = list(types)
        self.epoch = 0  # the current query's epoch (a live-added query's; 0: none)
        # an after-match policy's query owns its KLEENE, SEQ and AND vertices: its
        # policy drops their partial matches (runtime.Program._prunable), which a vertex
        # another query reads must keep (shared, the policy pruned nothing: 25x slower,
        # 19x the state): ((query name,): a policy's; (): shared as any)
        self.owner: tuple = ()
        self.event_type: list[int] = []
        self.window: list[int] = []
        self.estimate: list[float] = []
        self.slots: list[tuple[str, ...]] = []
        self.preds: list[tuple[Predicate, ...]] = []
        self.key_attrs: list[tuple[str, ...]] = []
        self.lists: list[tuple[int, ...]] = []
        self.guard: list[GuardSpec | None] = []
        self.run: list[RunItems | None] = []
        self.users: list[list[str]] = []
        self.kleene: frozenset[str] = frozenset()  # the current query's list variables
        self.strategy: str = ast.ANY_MATCH             # the current query's strategy

    def _lists(self, vars_: Sequence[str]) -> tuple[int, ...]:
        return tuple(i for i, var in enumerate(vars_) if var in self.kleene)

    def _compile(self, c: ast.Expr, slot_of: dict[str, int], equiv_slots: int,
                 lists: bool = True) -> Predicate:
        """A conjunct on records laid out by ``slot_of``; with ``lists`` the current
        query's Kleene variables hold lists there (not at an EVENT vertex, whose one
        slot is an event, an element of a list or not)."""
        return compile_predicate(c, slot_of, equiv_slots, self.kleene if lists else frozenset(),
                                 len(slot_of))

    def _new(self, kind: Kind, sig: tuple, *, slots=(), preds=(), key=(), etype=-1,
             guard=None, estimate=0.0, window: int, user: str,
             lists: tuple[int, ...] = (), run: RunItems | None = None) -> tuple[int, bool]:
        if sig in self.ids:
            v = self.ids[sig]
            if self.window[v] != UNBOUNDED:
                self.window[v] = UNBOUNDED if window == UNBOUNDED else max(self.window[v], window)
            if user not in self.users[v]:
                self.users[v].append(user)
            return v, False
        v = self.graph.add_vertex(kind)
        self.ids[sig] = v
        self.sigs.append(sig)
        self.event_type.append(etype)
        self.window.append(window)
        self.estimate.append(estimate)
        self.slots.append(tuple(slots))
        self.preds.append(tuple(preds))
        self.key_attrs.append(tuple(key))
        self.lists.append(tuple(lists))
        self.guard.append(guard)
        self.run.append(run)
        self.users.append([user])
        return v, True

    def _type(self, name: str) -> int:
        if name not in self.types:
            self.types.append(name)
        return self.types.index(name)

    def node(self, t: _Node, key: tuple[str, ...], window: int, user: str, w_query: int) -> int:
        slot_of = {var: i for i, var in enumerate(t.vars)}
        preds = tuple(sorted((self._compile(c, slot_of, len(t.vars), t.kind != Kind.EVENT)
                              for c in t.preds), key=lambda p: p.signature))
        guards = [self.not_vertex(g, t.vars, user, w_query) for g in t.guards]
        lists = () if t.kind == Kind.EVENT else self._lists(t.vars)
        common = dict(slots=t.vars, preds=preds, key=key, estimate=t.estimate,
                      window=window, user=user, lists=lists)
        if t.kind in (Kind.EVENT, Kind.KLEENE):
            etype = self._type(t.etype)
        if t.kind == Kind.RUN:
            run = RunItems(self.strategy, tuple(self._type(name) for name, _ in t.items),
                           tuple(kleene for _, kleene in t.items))
            # a live-added query's runs are its own: they see no event from before it
            sig = (Kind.RUN, run, tuple(p.signature for p in preds), key, self.epoch)
            v, _ = self._new(Kind.RUN, sig, run=run, **common)
            return v
        if t.kind == Kind.EVENT:
            sig = (Kind.EVENT, etype, tuple(p.signature for p in preds), key)
            v, _ = self._new(Kind.EVENT, sig, etype=etype, **common)
            return v
        if t.kind == Kind.KLEENE:
            child = self.node(t.left, key, window, user, w_query)
            sig = (Kind.KLEENE, child, tuple(p.signature for p in preds), key) + self.owner
            v, created = self._new(Kind.KLEENE, sig, etype=etype, **common)
            if created:
                self.graph.add_arc(child, v, Port.CHILD)
            return v
        left = self.node(t.left, key, window, user, w_query)
        right = self.node(t.right, key, window, user, w_query)
        sig = (t.kind, left, right, tuple(p.signature for p in preds), key, tuple(sorted(guards)))
        if t.kind in (Kind.SEQ, Kind.AND):
            sig += self.owner
        v, created = self._new(t.kind, sig, **common)
        if created:
            self.graph.add_arc(left, v, Port.LEFT)
            self.graph.add_arc(right, v, Port.RIGHT)
            for gv in guards:
                self.graph.add_arc(gv, v, Port.GUARD)
        return v

    def not_vertex(self, g: _Guard, host_vars: tuple[str, ...], user: str, w_query: int) -> int:
        child = self.node(g.tree, (), UNBOUNDED, user, w_query)
        slot_of = {var: i for i, var in enumerate(host_vars)}
        slot_of.update({var: len(host_vars) + i for i, var in enumerate(g.tree.vars)})
        preds = tuple(sorted((self._compile(c, slot_of, len(host_vars)) for c in g.preds),
                             key=lambda p: p.signature))
        spec = GuardSpec(
            mode=g.mode, n_host=len(host_vars),
            left_slots=tuple(slot_of[x] for x in g.left_vars if x in slot_of),
            right_slots=tuple(slot_of[x] for x in g.right_vars if x in slot_of),
            active_slots=tuple(slot_of[x] for x in g.active_vars if x in slot_of),
            preds=preds, window_ms=w_query, holds_back=g.mode in ("TRAILING", "AND"),
            host_lists=self._lists(host_vars))
        # a live-added query's negations are its own: no event from before it negates
        sig = (Kind.NOT, child, spec.signature, self.epoch)
        v, created = self._new(Kind.NOT, sig, slots=g.tree.vars, guard=spec,
                               estimate=g.tree.estimate, window=UNBOUNDED, user=user)
        if created:
            self.graph.add_arc(child, v, Port.CHILD)
        return v

    def output(self, name: str, root: int, root_vars, preds, guards: list[int],
               window: int) -> int:
        v, _ = self._new(Kind.OUTPUT, (Kind.OUTPUT, name), slots=root_vars, preds=preds,
                         window=window, user=name, lists=self._lists(root_vars))
        self.graph.add_arc(root, v, Port.CHILD)
        for gv in guards:
            self.graph.add_arc(gv, v, Port.GUARD)
        return v


def build_plan(queries: Sequence[ast.Query], rates: dict[str, float] | None = None,
               materialize: str = ALWAYS, schemas: Sequence[ast.EventSchema] = (),
               tables: Sequence[ast.LookupTable] = (), types: Sequence[str] = (),
               epochs: dict[str, int] | None = None,
               constructions: dict[str, str] | None = None) -> Plan:
    """Plan every query of a file into one shared DAG; ``materialize`` (always, auto,
    on-demand) decides which SEQ vertices keep their records (plan/joins.py). The
    default keeps them all (on demand pays only where the parent's right input is
    rare per key, which the cost model cannot see). ``schemas``: the file's event
    schemas; those of the plan's types go with it (events that break them are bad).
    ``tables``: the file's lookup tables; a lookup is planned as the attribute it fills.
    ``types``: event types the plan's type list starts with (a running engine's, whose
    stored events keep their type codes); ``epochs``: per query added to a running
    engine, a number of its own (the journal offset it was added at): its NOT and RUN
    vertices are then its own, shared with no other query. ``constructions``: per
    query name, ``joins`` or ``chain`` decided elsewhere (a running engine's measured
    choice, ``dqcep.runtime.adapt``); it overrides ``materialize`` for that query."""
    declared = {t.name: t for t in tables}
    queries, lookups = resolve_all(queries, declared)
    cost = CostModel(dict(rates or {}))
    interner = _Interner(types)
    specs = []
    sharing, intake = _sharing(queries, cost, types) if materialize == AUTO else ({}, {})
    stream = _stream_rate(queries, cost)
    for q in queries:
        qp, root_tree, output_guards, construction, why, work = _choose(
            q, cost, materialize, sharing.get(q.name), (constructions or {}).get(q.name),
            intake.get(q.name), stream)
        interner.kleene, interner.strategy = qp.kleene, q.strategy
        interner.epoch = (epochs or {}).get(q.name, 0)
        interner.owner = () if q.after_match is None else (q.name,)
        w = q.within.ms
        root = interner.node(root_tree, qp.key_attrs, w, q.name, w)
        root_vars = root_tree.vars
        slot_of = {var: i for i, var in enumerate(root_vars)}
        final = tuple(interner._compile(c, slot_of, len(root_vars)) for c in qp.final)
        guards = [interner.not_vertex(g, root_vars, q.name, w) for g in output_guards]
        out = interner.output(q.name, root, root_vars, final, guards, w)
        never = not all(evaluate(compile_predicate(c, {}), lambda s, a: None)
                        for c in qp.constant)
        specs.append(QuerySpec(
            name=q.name, output=out, root=root, variables=tuple(ast.positive_vars(q.pattern)),
            slot_of=tuple(slot_of.items()), window_ms=w, preds=final, never=never,
            returns=tuple((r.var, r.attr) for r in q.returns), dropped=tuple(qp.dropped),
            strategy=q.strategy, lists=tuple(sorted(qp.kleene)),
            after_match=q.after_match,
            after_match_at=(q.after_match_pos.line, q.after_match_pos.col),
            partition=qp.key_attrs, construction=construction, construction_why=why,
            construction_work=work))
    g = interner.graph
    g.freeze()
    plan = Plan(
        graph=g, types=tuple(interner.types),
        event_type=_frozen(np.asarray(interner.event_type, dtype=np.int32)),
        window=_frozen(np.asarray(interner.window, dtype=np.int64)),
        estimate=_frozen(np.asarray(interner.estimate, dtype=np.float64)),
        slots=tuple(interner.slots), preds=tuple(interner.preds),
        key_attrs=tuple(interner.key_attrs), lists=tuple(interner.lists),
        guard=tuple(interner.guard), run=tuple(interner.run),
        users=tuple(tuple(u) for u in interner.users), queries=tuple(specs),
        keys=_canonical_keys(interner.sigs, interner.types))
    on_demand, why = choose_materialization(plan, materialize)
    used = {c.table for c in lookups}
    return dataclasses.replace(plan, on_demand=on_demand, materialization=why,
                               schemas=tuple(s for s in schemas if s.type in plan.types),
                               lookups=lookups,
                               tables=tuple(t for t in tables if t.name in used))


def _stream_rate(queries: Sequence[ast.Query], cost: CostModel) -> float:
    """Events per second of the whole stream: every chain looks at each of them."""
    if cost.rates:
        return float(sum(cost.rates.values()))
    return sum(cost.rate(t) for t in {i.type for q in queries
                                      for i, _ in ast.event_patterns(q.pattern)})


def _sharing(queries: Sequence[ast.Query], cost: CostModel,
             types) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Per query whose joins would share an operator vertex (SEQ, AND, OR, KLEENE) with
    other queries: those queries. A chain is a vertex of its own query, so under auto
    such a query stays joins: the shared vertex stays one vertex. Second, per query,
    the events per second its joins' leaves take in, each leaf's split among the
    queries that share it (what its joins' intake costs it; a chain's is its own)."""
    interner = _Interner(types)
    for q in queries:
        qp = _QueryPlanner(q, cost)
        root, _ = qp.plan()
        interner.kleene, interner.strategy = qp.kleene, q.strategy
        interner.node(root, qp.key_attrs, q.within.ms, q.name, q.within.ms)
    operators = (Kind.SEQ, Kind.AND, Kind.OR, Kind.KLEENE)
    out: dict[str, list[str]] = {}
    intake: dict[str, float] = {}
    for v, users in enumerate(interner.users):
        if len(users) > 1 and interner.sigs[v][0] in operators:
            for u in users:
                out.setdefault(u, [])
                out[u] += [x for x in users if x != u and x not in out[u]]
        if interner.sigs[v][0] == Kind.EVENT:
            share = cost.rate(interner.types[interner.sigs[v][1]]) / len(users)
            for u in users:
                intake[u] = intake.get(u, 0.0) + share
    return out, intake


def _choose(q: ast.Query, cost: CostModel, materialize: str, shares: list[str] | None = None,
            measured: str | None = None, leaf_rate: float | None = None,
            stream_rate: float | None = None):
    """How a query runs: as joins or as one chain (forced by ``chain`` / the other
    modes, chosen by the estimated work under ``auto`` unless its joins are shared with
    ``shares``, or ``measured`` by a running engine). ``leaf_rate``: events per second
    its joins' leaves take in, split among their sharers (default: its items' types'
    rates, as a chain's); ``stream_rate``: the whole stream's (default: its types').
    Returns its planner, tree, OUTPUT guards, the choice, why and the work per window
    estimated for each construction (empty where it was not estimated)."""
    eligible = chain_eligible(q)
    if measured is not None:
        if measured not in CONSTRUCTIONS:
            raise ValueError(f"a query runs as {' or '.join(CONSTRUCTIONS)}, not {measured!r}")
        if not eligible:
            raise ValueError(f"query {q.name} cannot run as a chain: it runs as it is planned")
        qp = _QueryPlanner(q, cost, chain=measured == "chain")
        root, guards = qp.plan()
        return qp, root, guards, measured, f"{measured} (measured faster while running)", ()
    if not eligible or materialize not in (AUTO, CHAIN):
        qp = _QueryPlanner(q, cost)
        root, guards = qp.plan()
        why = "" if not eligible else f"joins (--materialize {materialize})"
        return qp, root, guards, "joins" if q.strategy == ast.ANY_MATCH else "runs", why, ()
    chain = _QueryPlanner(q, cost, chain=True)
    slots = chain.chain_slots()
    negations = sum(1 for i in q.pattern.items if isinstance(i, ast.Negation)) \
        if isinstance(q.pattern, ast.Operator) else 0
    seconds = q.within.ms / 1000.0
    items = q.pattern.items if isinstance(q.pattern, ast.Operator) else (q.pattern,)
    own_rate = sum(cost.rate(i.type) for i in items if not isinstance(i, ast.Negation))
    stream_rate = own_rate if stream_rate is None else max(stream_rate, own_rate)
    chain_est = chain_work(slots, bool(chain.key_attrs), negations) + \
        intake_work(own_rate * seconds, stream_rate * seconds)
    joins = _QueryPlanner(q, cost)
    root, guards = joins.plan()
    _, joins_est = dag_work(root, bool(joins.key_attrs))
    joins_est += intake_work((own_rate if leaf_rate is None else leaf_rate) * seconds)
    figures = f"est. work per window: chain {chain_est:.4g}, joins {joins_est:.4g}"
    work = (("chain", chain_est), ("joins", joins_est))
    if materialize == CHAIN:
        root, guards = chain.plan()
        return chain, root, guards, "chain", f"chain (forced; {figures})", work
    if shares:
        return joins, root, guards, "joins", \
            f"joins (shared with {', '.join(shares)}; {figures})", work
    if chain_est < joins_est:
        root, guards = chain.plan()
        return chain, root, guards, "chain", f"chain ({figures})", work
    return joins, root, guards, "joins", f"joins ({figures})", work


def switchable(queries: Sequence[ast.Query], tables: Sequence[ast.LookupTable] = (),
               types: Sequence[str] = ()) -> list[str]:
    """The queries a running engine may move between joins and a chain: those that
    can run as a chain whose joins share no operator vertex with another query (a
    chain is a vertex of its own query; a shared vertex stays one vertex), and have
    no after-match policy: its pruning drops partial matches from the joins' vertices
    (``Engine._prune``), not from a chain's, so a trial of the chain kept every list
    of a rising run (the fire alert of 10^6 events: 90 MB, 124 K events/s where the
    joins alone run at 211 K in 3.4 MB)."""
    resolved, _ = resolve_all(queries, {t.name: t for t in tables})
    shared, _ = _sharing(resolved, CostModel({}), types)
    return [q.name for q in resolved
            if chain_eligible(q) and q.name not in shared and q.after_match is None]


def _canonical_keys(sigs: list[tuple], types: list[str]) -> tuple:
    """Each vertex's signature with its children's numbers replaced by their keys and
    its event types' numbers by their names (children come first: the interner
    numbers a vertex after its children)."""
    keys: list = []

    def sub(x):
        return keys[x] if isinstance(x, int) and not isinstance(x, bool) else x
    for sig in sigs:
        kind = sig[0]
        if kind in (Kind.KLEENE, Kind.NOT):        # (kind, child, ...)
            key = (kind, sub(sig[1]), *sig[2:])
        elif kind in (Kind.SEQ, Kind.AND, Kind.OR):  # (kind, left, right, preds, key, guards)
            key = (kind, sub(sig[1]), sub(sig[2]), sig[3], sig[4],
                   tuple(sorted(map(sub, sig[5]), key=repr)), *sig[6:])  # + the owner
        elif kind == Kind.EVENT:                   # (kind, type number, preds, key)
            key = (kind, types[sig[1]], *sig[2:])
        elif kind == Kind.RUN:                     # (kind, RunItems, preds, key, epoch)
            key = (kind, sig[1].strategy, tuple(types[t] for t in sig[1].types),
                   sig[1].kleene, *sig[2:])
        else:                                      # OUTPUT: (kind, query name)
            key = sig
        keys.append(key)
    return tuple(keys)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a
