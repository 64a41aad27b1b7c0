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
from typing import Sequence

import numpy as np

from dqcep.lang import ast
from dqcep.plan.bytecode import compile_predicate, evaluate
from dqcep.plan.cost import CostModel, chain_work, intake_work
from dqcep.plan.joins import ALWAYS, AUTO, CHAIN, choose_materialization
from dqcep.plan.lookups import resolve_all
from dqcep.plan.orthogonal import Kind
from dqcep.plan.records import Plan, QuerySpec
from dqcep.plan.decompose import CONSTRUCTIONS, QueryPlanner, chain_eligible, dag_work
from dqcep.plan.intern import Interner


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
    interner = Interner(types)
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
    interner = Interner(types)
    for q in queries:
        qp = QueryPlanner(q, cost)
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
        qp = QueryPlanner(q, cost, chain=measured == "chain")
        root, guards = qp.plan()
        return qp, root, guards, measured, f"{measured} (measured faster while running)", ()
    if not eligible or materialize not in (AUTO, CHAIN):
        qp = QueryPlanner(q, cost)
        root, guards = qp.plan()
        why = "" if not eligible else f"joins (--materialize {materialize})"
        return qp, root, guards, "joins" if q.strategy == ast.ANY_MATCH else "runs", why, ()
    chain = QueryPlanner(q, cost, chain=True)
    slots = chain.chain_slots()
    negations = sum(1 for i in q.pattern.items if isinstance(i, ast.Negation)) \
        if isinstance(q.pattern, ast.Operator) else 0
    seconds = q.within.ms / 1000.0
    items = q.pattern.items if isinstance(q.pattern, ast.Operator) else (q.pattern,)
    own_rate = sum(cost.rate(i.type) for i in items if not isinstance(i, ast.Negation))
    stream_rate = own_rate if stream_rate is None else max(stream_rate, own_rate)
    chain_est = chain_work(slots, bool(chain.key_attrs), negations) + \
        intake_work(own_rate * seconds, stream_rate * seconds)
    joins = QueryPlanner(q, cost)
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
