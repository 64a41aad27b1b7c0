"""Planning: queries -> one shared DAG of simplest sub-queries (an orthogonal list).

    >>> from dqcep.lang import parse
    >>> from dqcep.plan import build_plan
    >>> plan = build_plan(parse("PATTERN SEQ(A a, B b, C c) WITHIN 1 s").queries)
    >>> [plan.label(int(v)) for v in plan.graph.topo]
    ['EVENT A', 'EVENT B', 'EVENT C', 'SEQ', 'SEQ', 'OUTPUT q1']
"""
from dqcep.plan.bytecode import Op, Predicate
from dqcep.plan.explain import explain_dot, explain_text
from dqcep.plan.orthogonal import Kind, OrthogonalList, Port, VertexView
from dqcep.plan.planner import build_plan, switchable
from dqcep.plan.records import GuardSpec, LeafFilter, Plan, QuerySpec

__all__ = ["build_plan", "switchable", "Plan", "QuerySpec", "GuardSpec", "LeafFilter", "Kind", "Port",
           "OrthogonalList", "VertexView", "Predicate", "Op", "explain_text", "explain_dot"]
