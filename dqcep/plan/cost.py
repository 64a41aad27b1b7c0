"""Cost model for the binary decomposition of n-ary operators.

Estimate, for a sub-pattern X, ``N(X)``: the expected number of its partial
matches alive in one window W.

- leaf ``T v``: ``N = rate(T) * W * sel(filters of v)``
- ``SEQ`` over k items: ``N = prod(N(item)) / k! * sel(conjuncts) * KEY^(k-1)``
  (k! because only one order of k independent events is accepted)
- ``AND`` over k items: ``N = prod(N(item)) * sel(conjuncts) * KEY^(k-1)``
- ``OR``: ``N = sum(N(item))``

where ``sel(conjuncts)`` multiplies the selectivity of every conjunct whose
variables all lie inside X but not inside a single item, and KEY is the
selectivity of the ``[attr]`` equivalence (when the query has one) per join.

The cost of a binary tree is the sum of N over its internal vertices, i.e. the
partial matches the engine has to build and keep (the quantity the DQCEP paper
minimises). ``N`` of an interval does not depend on how it is bracketed, so the
best tree comes from dynamic programming: over intervals for SEQ (order is
fixed), over subsets for AND (up to ``MAX_AND_DP`` items). Ties, and AND with
more items, fall back to left-deep in source order. OR is folded left-deep: its
cost is additive, so the shape does not matter.

Default rates are 1 event/s for every type (so with no statistics and no
predicates every tree costs the same and the plan is left-deep); pass measured
rates to ``plan(..., rates=...)`` / ``dqcep explain --rates FILE``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from dqcep.lang import ast

# Selectivity defaults (System R style): the share of candidates a conjunct keeps.
SEL_EQUAL = 0.1
SEL_NOT_EQUAL = 0.9
SEL_RANGE = 1 / 3
SEL_OTHER = 0.5
SEL_KEY = 0.1
SEL_NOT = 0.5   # the share of records a NOT lets through (no negated event in the gap)
DEFAULT_RATE = 1.0  # events per second
MAX_AND_DP = 8


def selectivity(e: ast.Expr) -> float:
    if isinstance(e, ast.Binary):
        if e.op == "=":
            return SEL_EQUAL
        if e.op == "!=":
            return SEL_NOT_EQUAL
        if e.op in ast.ORDERING:
            return SEL_RANGE
        if e.op == "AND":
            return selectivity(e.left) * selectivity(e.right)
        if e.op == "OR":
            a, b = selectivity(e.left), selectivity(e.right)
            return a + b - a * b
    if isinstance(e, ast.Unary) and e.op == "NOT":
        return 1 - selectivity(e.operand)
    if isinstance(e, ast.Equivalence):
        return SEL_KEY
    return SEL_OTHER


@dataclass
class CostModel:
    rates: dict[str, float] = field(default_factory=dict)  # event type -> events/s

    def rate(self, etype: str) -> float:
        return float(self.rates.get(etype, DEFAULT_RATE))

    def leaf(self, etype: str, window_ms: int, filters: list[ast.Expr]) -> float:
        n = self.rate(etype) * window_ms / 1000.0
        for f in filters:
            n *= selectivity(f)
        return n

    @staticmethod
    def lists(elements: float) -> float:
        """Lists a Kleene item makes from ``elements`` events per window under
        skip-till-any-match: every non-empty subset in ts order, 2^n - 1 (capped)."""
        return 2.0 ** min(elements, 60.0) - 1.0

    @staticmethod
    def combine(op: str, parts: list[float], conjuncts: list[ast.Expr], keyed: bool) -> float:
        if op == ast.OR:
            return sum(parts)
        n = math.prod(parts)
        if op == ast.SEQ:  # 1/k! of the orders are in sequence (k! overflows a float past 170)
            n = n / math.factorial(len(parts)) if len(parts) <= 170 else 0.0
        for c in conjuncts:
            n *= selectivity(c)
        if keyed:
            n *= SEL_KEY ** (len(parts) - 1)
        return n


def better(cost: float, best: float) -> bool:
    """Strictly better beyond float noise (so ties keep the left-deep candidate)."""
    return cost < best - 1e-9 * max(1.0, abs(best))


# ------------------------------------------------------------- joins or a chain
#
# A flat skip-till-any-match SEQ runs either as the DAG of joins (every partial match
# of the window built as records, a Kleene item's lists built once at its KLEENE
# vertex) or as one chain (dqcep._kernels.chains: nothing built until the last event,
# then bindings from the last slot back and lists between bound neighbours). Both make
# the same matches; the work differs in what is looked at and built on the way. The
# weights say what one step costs against looking at one candidate: building a record
# or a list node, and evaluating a condition (the bytecode interpreter). They were set
# by bench/bench_plans.py's shapes (time per step, measured on both operators).
W_PROBE, W_RECORD, W_COND = 0.5, 1.0, 8.0
MAX_EXPONENT = 60.0
# What every query pays per event before any candidate is looked at. A chain takes in
# each event of its items' types (its key's partition found, its stacks pruned, the
# event stacked: W_INTAKE) and looks at the type of every event of the stream
# (W_SCAN): each chain is handed the whole batch. The joins take in each event of a
# leaf once for every query that shares the leaf (W_INTAKE over the leaf's users).
# Set by bench_engine's W4 (50 queries sharing their T0 and T1 leaves: 22 ns per event
# per query as chains, 15 as joins, where the work above gave the chain 0.6x of the
# joins' work) and checked on the single queries of bench_plans.py (same choices).
W_INTAKE, W_SCAN = 3.0, 0.3


def intake_work(taken: float, scanned: float = 0.0) -> float:
    """The work per window of taking ``taken`` events in and looking at the type of
    ``scanned`` more (a chain: every event of the stream)."""
    return W_INTAKE * taken + W_SCAN * scanned


def lists_made(n: float, sigma: float = 1.0) -> float:
    """Lists (in ts order) of ``n`` events per window whose every adjacent pair passes
    the iteration conditions with probability ``sigma``: sum over lengths k of
    C(n, k) sigma^(k-1) = ((1 + sigma)^n - 1) / sigma (2^n - 1 without conditions)."""
    if n <= 0:
        return 0.0
    n = min(n, MAX_EXPONENT)
    return (2.0 ** n - 1.0) if sigma >= 1.0 else ((1.0 + sigma) ** n - 1.0) / sigma


@dataclass(frozen=True)
class ChainSlot:
    """What the chain's estimate reads of one positive item."""

    events: float        # events per window that may fill it (its filters applied)
    kleene: bool
    bind: float = 1.0    # selectivity of the conditions checked when it is bound
    bind_conds: bool = False
    step: float = 1.0    # a Kleene item's: its iteration conditions', per element pair
    step_conds: bool = False


def chain_work(slots: list[ChainSlot], keyed: bool, negations: int = 0) -> float:
    """Estimated work per window of a chain: the candidates it looks at and the
    conditions it checks while binding the plain slots from the last one back, the
    list nodes it makes (and the extensions it tries) for each Kleene slot per
    binding, and the matches it writes; its ``negations`` are checked on each match
    at the OUTPUT (where joins check one between two items on the pairs, early)."""
    k, key = len(slots), (SEL_KEY if keyed else 1.0)
    bound, work, depth = slots[-1].events, 0.0, 1
    for i in range(k - 2, -1, -1):
        s = slots[i]
        if s.kleene:
            continue
        depth += 1  # of the events before the anchor, the ones that can precede it
        candidates = bound * s.events / depth * key
        work += candidates * (W_PROBE + (W_COND if s.bind_conds else 0.0))
        bound = candidates * s.bind
    for i, s in enumerate(slots):
        if not s.kleene:
            continue
        # its events between its bound neighbours: half the window's on average once
        # the count of lists (convex in it) is weighed by the wide pairs
        between = s.events / 2 * key
        work += bound * between * (W_PROBE + (W_COND if s.bind_conds else 0.0))
        m = between * s.bind
        nodes = bound * (lists_made(m, s.step) + (1.0 if i == k - 1 else 0.0))
        work += nodes * (W_RECORD + m / 2 * (W_PROBE + (W_COND if s.step_conds else 0.0)))
        bound = nodes
    return work + bound * (W_RECORD + negations * W_COND)
