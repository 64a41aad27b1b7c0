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
