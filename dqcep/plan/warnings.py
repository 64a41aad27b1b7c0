"""Warnings a plan gives before it runs: what the queries as written may cost.

A Kleene item under skip-till-any-match makes every ts-ordered subset of its events
in a window a list (spec 5.1): 2^n - 1 lists of n events. The spec defines that
result, so the engine cannot shrink it; it stops a query whose state outgrows its
budget (``dqcep.runtime.STATE_BUDGET``). The planner sees it coming from the events
a window holds at the cost model's rates (``--rates``; 1 event/s per type when not
given) and says so, naming the strategies that bound the lists.
"""
from __future__ import annotations

from typing import Sequence

from dqcep.lang import ast
from dqcep.plan.cost import CostModel
from dqcep.plan.explain import format_window

# a Kleene item with more events than this per window makes over 2^20 lists: past the
# default state budget of a query's buffer
KLEENE_EVENTS = 20


def kleene_warnings(queries: Sequence[ast.Query], rates: dict[str, float] | None = None
                    ) -> list[tuple[str, ast.Pos]]:
    """(message, position of the Kleene item) for each Kleene item under
    skip-till-any-match whose window holds more than KLEENE_EVENTS of its events at
    the cost model's rates."""
    cost, out = CostModel(dict(rates or {})), []
    for q in queries:
        if q.strategy != ast.ANY_MATCH:
            continue
        for node, negated in ast.walk_patterns(q.pattern):
            if not isinstance(node, ast.Kleene) or negated:
                continue
            rate = cost.rate(node.type)
            events = rate * q.within.ms / 1000
            if events <= KLEENE_EVENTS:
                continue
            lists = f"2^{events:,.0f}" if events < 1e6 else "2^(millions)"
            out.append((
                f"warning: query {q.name}: {node.type}+ {node.var}[] under "
                f"skip-till-any-match makes every subset of its events a list; at "
                f"{rate:g} {node.type}/s (--rates) a window of {format_window(q.within.ms)} "
                f"holds ~{events:,.0f}, up to {lists} lists per key, past the state budget "
                "(the query would be stopped). USING skip-till-next-match, "
                "strict-contiguity or partition-contiguity bounds them, as does a shorter "
                "window", node.pos))
    return out
