"""``dqcep explain``: the decomposed, shared plan of a query file."""
from __future__ import annotations

import sys

from dqcep.cli.common import (load_queries, load_rates, materialize_of, planner_options,
                              warn_plan)


def add_parser(sub) -> None:
    """``dqcep explain``."""
    explain = sub.add_parser(
        "explain", help="show the decomposed, shared query plan",
        description="Plan the queries of QUERIES into one DAG of simplest sub-queries and "
        "print it: vertices in topological order with their slots, windows, partition keys, "
        "cost estimates, predicates and NOT guards; shared vertices are marked; then each "
        "query's output and the filters that can be pushed down to preprocessing.")
    explain.add_argument("queries", metavar="QUERIES.cep", help="query file")
    explain.add_argument("--dot", action="store_true", help="print Graphviz DOT instead")
    planner_options(explain)
    explain.set_defaults(func=command)


def command(args) -> int:
    from dqcep.plan import build_plan, explain_dot, explain_text

    queries = load_queries(args.queries)
    rates = load_rates(args.rates)
    plan = build_plan(queries.queries, rates, materialize=materialize_of(args),
                      schemas=queries.schemas, tables=queries.tables)
    warn_plan(queries, rates)
    sys.stdout.write(explain_dot(plan) if args.dot else explain_text(plan))
    return 0
