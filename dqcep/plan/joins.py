"""How each join vertex runs: its equality index and whether its records are kept.

- ``equality_joins``: a SEQ/AND vertex without an [attr] key whose predicates
  include ``l.x = r.y`` joins on hash(l.x) = hash(r.y).
- ``choose_materialization``: a SEQ vertex's records are **materialized** (kept
  as records in its parent's queue, the way DQCEP runs every sub-query) or
  **computed on demand** by its parent: the parent keeps no queue of them and,
  when a record of its right input comes, builds the vertex's records that end
  before it from the vertex's own inputs (the way SASE builds a sequence from
  its stacks when the last event comes). The vertex then keeps its right input
  too, so it holds its inputs (events, or records of smaller sub-queries)
  instead of every pair of them. Both forms return the same matches.
"""
from __future__ import annotations

from dqcep.plan.bytecode import Op
from dqcep.plan.cost import SEL_KEY, W_PROBE, W_RECORD
from dqcep.plan.orthogonal import Kind, Port
from dqcep.plan.records import Plan  # the planner's records, apart from the planner

# choose_materialization's modes; CHAIN: every query that is a flat SEQ is one RUN
# vertex built when its last event comes (dqcep._kernels.chains), its joins' none
AUTO, ALWAYS, ON_DEMAND, CHAIN = "auto", "always", "on-demand", "chain"
MATERIALIZE_MODES = (AUTO, ALWAYS, ON_DEMAND, CHAIN)
RECORD_WORDS = 4  # start, end, key and the per-key chain link, besides the slots


def equality_joins(plan: "Plan") -> dict[int, tuple[int, str, int, str]]:
    """Join keys from equality conjuncts: vertex -> (left slot, attr, right slot, attr).

    A SEQ/AND vertex without an [attr] key whose predicates include ``l.x = r.y``
    (one slot from each operand, neither under an OR, so the conjunct is always
    required) joins on hash(l.x) = hash(r.y). The conjunct stays a predicate, so
    a hash collision cannot make a match.
    """
    g, out = plan.graph, {}
    maybe_unbound: dict[int, list[bool]] = {}
    for v in map(int, g.topo):
        k = plan.kind(v)
        left, right = g.child(v, Port.LEFT), g.child(v, Port.RIGHT)
        if k in (Kind.EVENT, Kind.KLEENE):
            maybe_unbound[v] = [False]
        elif k == Kind.OR:
            maybe_unbound[v] = [True] * len(plan.slots[v])
        elif k in (Kind.SEQ, Kind.AND):
            maybe_unbound[v] = maybe_unbound[left] + maybe_unbound[right]
        if k not in (Kind.SEQ, Kind.AND) or plan.key_attrs[v] or plan.lists[v]:
            continue  # (an equality over a list holds for every element: no index)
        nl = len(plan.slots[left])
        for p in plan.preds[v]:
            code = p.code
            if len(code) != 3 or code[0][0] != Op.LOAD or code[1][0] != Op.LOAD \
                    or code[2][0] != Op.EQ:
                continue
            (s1, a1), (s2, a2) = (code[0][1], p.attrs[code[0][2]]), \
                (code[1][1], p.attrs[code[1][2]])
            if s1 >= nl:
                (s1, a1), (s2, a2) = (s2, a2), (s1, a1)
            if not s1 < nl <= s2 or a1 in ("ts", "id") or a2 in ("ts", "id"):
                continue
            if maybe_unbound[v][s1] or maybe_unbound[v][s2]:
                continue
            out[v] = (s1, a1, s2 - nl, a2)
            break
    return out


def _why_kept(plan: "Plan", v: int, eq: dict) -> str | None:
    """Why vertex v's records must be kept (None: they may be computed on demand)."""
    g = plan.graph
    if plan.kind(v) != Kind.SEQ:
        return "not a SEQ"
    arcs = list(g.out_arcs(v))
    if len(arcs) != 1:
        return "shared by several parents"
    parent = int(g.head[arcs[0]])
    if plan.kind(parent) != Kind.SEQ or g.port[arcs[0]] != Port.LEFT:
        return "not the left input of a SEQ"
    if any(g.port[a] == Port.GUARD for a in g.in_arcs(v)):
        return "a NOT is checked on its records"
    if plan.lists[v] or plan.lists[parent]:
        return "it or its parent holds Kleene lists"
    if plan.key_attrs[v] != plan.key_attrs[parent]:
        return "its parent joins on another key"
    if v in eq or parent in eq:
        return "it or its parent joins on an equality index"
    return None


def choose_materialization(plan: "Plan", mode: str = ALWAYS) -> tuple[tuple[bool, ...],
                                                                     tuple[str, ...]]:
    """Per vertex: computed on demand? and why (for ``dqcep explain``).

    ``always``: every vertex materialized; ``on-demand``: every vertex that can be;
    ``auto``: those whose kept records (the estimated partial matches per window,
    of its slots) would take more bytes than its right input's records, which it
    keeps instead (a SEQ of events whose pairs outnumber its right events: on
    demand; one whose conditions make it much smaller than its inputs: kept).
    """
    if mode not in MATERIALIZE_MODES:
        raise ValueError(f"materialize must be one of {', '.join(MATERIALIZE_MODES)}")
    g, eq = plan.graph, equality_joins(plan)
    on_demand, why = [], []
    for v in range(plan.n_vertices):
        kind = plan.kind(v)
        if kind not in (Kind.SEQ, Kind.AND):
            on_demand.append(False)
            why.append("")
            continue
        reason = "materialized (every join's records are kept)" if mode in (ALWAYS, CHAIN) \
            else _why_kept(plan, v, eq)
        if reason is None:
            # built once and kept, or built again for every record of the parent's
            # right input (dqcep.plan.cost's weights: a candidate looked at, a record)
            arc = next(iter(g.out_arcs(v)))
            trigger = g.child(int(g.head[arc]), Port.RIGHT)
            left, right = g.child(v, Port.LEFT), g.child(v, Port.RIGHT)
            probes = plan.estimate[left] * plan.estimate[right] * 0.5 * \
                (SEL_KEY if plan.key_attrs[v] else 1.0)
            kept = probes * W_PROBE + plan.estimate[v] * W_RECORD
            built = plan.estimate[trigger] * probes * W_PROBE
            estimate = f"est. work per window: kept {kept:,.4g}, on demand {built:,.4g}"
            if mode == ON_DEMAND:
                on_demand.append(True)
                why.append(f"on demand (forced; {estimate})")
            elif built < kept:
                on_demand.append(True)
                why.append(f"on demand ({estimate})")
            else:
                on_demand.append(False)
                why.append(f"materialized ({estimate})")
            continue
        on_demand.append(False)
        why.append(reason if mode == ALWAYS else f"materialized ({reason})")
    return tuple(on_demand), tuple(why)
