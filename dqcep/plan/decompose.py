"""Step 1 and 2 of planning (``dqcep.plan.planner``): one query decomposed into a
binary tree of simplest sub-queries (``QueryPlanner``: ``Node``s, NOT ``Guard``s), its
predicates placed on that tree; whether and how it may run as one chain."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence


from dqcep._kernels.chains import CHAIN_SLOTS
from dqcep.lang import ast
from dqcep.plan.cost import (MAX_AND_DP, SEL_EQUAL, SEL_KEY, SEL_NOT, W_COND, W_PROBE,
                             W_RECORD, ChainSlot, CostModel, better, lists_made,
                             selectivity)
from dqcep.plan.orthogonal import Kind


@dataclass(eq=False)
class Node:
    kind: Kind
    vars: tuple[str, ...]            # output slots, in order
    etype: str | None = None
    left: "Node | None" = None
    right: "Node | None" = None
    preds: list[ast.Expr] = field(default_factory=list)
    guards: list["Guard"] = field(default_factory=list)
    estimate: float = 0.0
    items: tuple[tuple[str, bool], ...] = ()  # RUN: per slot its type, Kleene or not


@dataclass(eq=False)
class Guard:
    negation: ast.Negation
    mode: str
    left_vars: tuple[str, ...]
    right_vars: tuple[str, ...]
    active_vars: tuple[str, ...]
    tree: Node
    preds: list[ast.Expr] = field(default_factory=list)


class QueryPlanner:
    """Decomposition and predicate placement for one query."""

    def __init__(self, q: ast.Query, cost: CostModel, chain: bool = False):
        self.q = q
        self.chain = chain  # run as one chain (a RUN vertex under skip-till-any-match)
        self.cost = cost
        self.w = q.within.ms
        self.negated = {e.var for e, neg in ast.event_patterns(q.pattern) if neg}
        self.kleene = ast.kleene_vars(q.pattern)
        self.kleene_nodes: dict[str, Node] = {}
        parts = ast.conjuncts(q.where)
        self.constant = [c for c in parts if not ast.expr_vars(c) and not ast.has_equivalence(c)]
        rest = [c for c in parts if c not in self.constant]
        self.key_attrs = tuple(sorted({c.attr for c in rest if isinstance(c, ast.Equivalence)}))
        rest = [c for c in rest if not isinstance(c, ast.Equivalence)]
        self.positive = [c for c in rest if not ast.expr_vars(c) & self.negated]
        self.negation_conjuncts = [c for c in rest if ast.expr_vars(c) & self.negated]
        self.dropped: list[str] = []
        self.final: list[ast.Expr] = []
        self.output_guards: list[Guard] = []

    # decomposition --------------------------------------------------------
    def tree(self, node: ast.Pattern, conjuncts: list[ast.Expr], keyed: bool) -> Node:
        """Binary tree of a positive pattern; ``conjuncts`` only steer the cost model."""
        if isinstance(node, ast.EventPattern):
            filters = [c for c in conjuncts if ast.expr_vars(c) == {node.var}]
            return Node(Kind.EVENT, (node.var,), etype=node.type,
                         estimate=self.cost.leaf(node.type, self.w, filters))
        if isinstance(node, ast.Kleene):
            filters = [c for c in conjuncts if ast.expr_vars(c) == {node.var}
                       and element_filter(c, node.var)]
            leaf = Node(Kind.EVENT, (node.var,), etype=node.type,
                         estimate=self.cost.leaf(node.type, self.w, filters))
            kleene = Node(Kind.KLEENE, (node.var,), etype=node.type, left=leaf,
                           estimate=self.cost.lists(leaf.estimate))
            self.kleene_nodes[node.var] = kleene
            return kleene
        items = [self.tree(i, conjuncts, keyed) for i in node.items
                 if not isinstance(i, ast.Negation)]
        return self._combine(node.op, items, conjuncts, keyed)

    def _combine(self, op: str, items: list[Node], conjuncts, keyed) -> Node:
        kind = Kind[op]
        if op == ast.OR or len(items) == 1:
            # balanced: an OR of n items is log2(n) vertices deep, not n (the order of
            # the alternatives is kept, which is all an OR's output depends on)
            while len(items) > 1:
                pairs = [Node(kind, a.vars + b.vars, left=a, right=b,
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
            return Node(kind, lt.vars + rt.vars, left=lt, right=rt, estimate=estimate(g))

        return build(tuple(range(n)))

    # placement ------------------------------------------------------------
    @staticmethod
    def lca(root: Node, vars_: set[str]) -> Node:
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
    def co_bindable(node: Node, vars_: set[str]) -> bool:
        """Can all of ``vars_`` be bound in one match (no OR splits them)?"""
        if node.left is None or node.kind == Kind.KLEENE:
            return True
        sides = [vars_ & set(child.vars) for child in (node.left, node.right)]
        if node.kind == Kind.OR and all(sides):
            return False
        return all(QueryPlanner.co_bindable(child, side)
                   for child, side in zip((node.left, node.right), sides) if side)

    def _place(self, root: Node, conjuncts: list[ast.Expr]) -> None:
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

    def plan(self) -> tuple[Node, list[Guard]]:
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

    def _run(self) -> tuple[Node, list[Guard]]:
        """A query under a selection strategy (or run as a chain under
        skip-till-any-match): one RUN vertex over its flat SEQ, every
        positive condition on it, a top-level [attr] as its key (which the runtime
        checks exactly, element by element), the negations at the OUTPUT."""
        q = self.q
        items = q.pattern.items if isinstance(q.pattern, ast.Operator) else (q.pattern,)
        slots = [i for i in items if not isinstance(i, ast.Negation)]
        first = slots[0]
        root = Node(Kind.RUN, tuple(i.var for i in slots),
                     items=tuple((i.type, isinstance(i, ast.Kleene)) for i in slots),
                     estimate=self.cost.leaf(first.type, self.w, []))
        # a nested [attr] ([room] OR a.x = 1) is checked too as events are placed: it
        # covers the events bound so far (spec 5.2)
        root.preds = [c for c in self.positive if not isinstance(c, ast.Equivalence)]
        self._negations(q.pattern, root)
        return root, self.output_guards

    def _negations(self, node: ast.Item, root: Node) -> None:
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

    def _guard(self, neg: ast.Negation, mode, left, right, active, root: Node) -> None:
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
        guard = Guard(neg, mode, left, right, active, tree)
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


def dag_work(node: Node, keyed: bool) -> tuple[float, float]:
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
    CHAIN_SLOTS positive items, more than one or a Kleene item?"""
    if q.strategy != ast.ANY_MATCH:
        return False
    items = q.pattern.items if isinstance(q.pattern, ast.Operator) else (q.pattern,)
    if isinstance(q.pattern, ast.Operator) and q.pattern.op != ast.SEQ:
        return False
    positive = [i for i in items if not isinstance(i, ast.Negation)]
    if not all(isinstance(i, (ast.EventPattern, ast.Kleene)) for i in positive):
        return False
    return 1 <= len(positive) <= CHAIN_SLOTS and (
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
