"""Step 3 of planning (``dqcep.plan.planner``): per-query trees hash-consed into one
orthogonal list (``Interner``): the same sub-query in two queries is one vertex."""
from __future__ import annotations

from typing import Sequence


from dqcep.lang import ast
from dqcep.plan.bytecode import Predicate, compile_predicate
from dqcep.plan.orthogonal import Kind, OrthogonalList, Port
from dqcep.plan.records import UNBOUNDED, GuardSpec, RunItems
from dqcep.plan.decompose import Guard, Node


class Interner:
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

    def node(self, t: Node, key: tuple[str, ...], window: int, user: str, w_query: int) -> int:
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

    def not_vertex(self, g: Guard, host_vars: tuple[str, ...], user: str, w_query: int) -> int:
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
