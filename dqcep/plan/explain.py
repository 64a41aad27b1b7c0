"""Human-readable and Graphviz renderings of a plan (``dqcep explain``)."""
from __future__ import annotations

from dqcep.plan.orthogonal import Kind, Port
from dqcep.plan.decompose import chain_order
from dqcep.plan.records import UNBOUNDED, Plan

_UNITS = (("h", 3_600_000), ("min", 60_000), ("s", 1000))


def format_window(ms: int) -> str:
    if ms == UNBOUNDED:
        return "unbounded"
    for unit, size in _UNITS:
        if ms and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def _guard_text(plan: Plan, v: int) -> str:
    g = plan.guard[v]
    child = plan.graph.child(v, Port.CHILD)
    host_slots = plan.slots[plan.graph.parents(v)[0]]

    def names(slots):
        return "(" + ", ".join(host_slots[s] for s in slots) + ")"

    host = {"GAP": f"end{names(g.left_slots)} < ts < start{names(g.right_slots)}",
            "LEADING": f"end(match) - W <= ts < start{names(g.right_slots)}",
            "TRAILING": f"end{names(g.left_slots)} < ts <= start(match) + W",
            "AND": "end(match) - W <= ts <= start(match) + W"}[g.mode]
    text = f"NOT v{child} {g.mode}: no match with {host}"
    if g.preds:
        text += " satisfying " + " AND ".join(p.text for p in g.preds)
    if g.holds_back:
        text += "; holds the match until start + W"
    return text


def _slot_labels(plan: Plan, v: int) -> list[str]:
    """A vertex's slots; a slot that holds a Kleene list is written ``v[]``."""
    return [f"{name}[]" if i in plan.lists[v] else name
            for i, name in enumerate(plan.slots[v])]


def _pred_role(plan: Plan, v: int, p) -> str:
    """How a condition is checked where it is placed (spec 5.1 for lists, 5.2 for runs)."""
    kind = plan.kind(v)
    if kind == Kind.RUN and plan.run[v].strategy == "skip-till-any-match":
        return _chain_role(plan, v, p)
    if kind == Kind.RUN:
        if p.whole_list:
            return "on each match (whole lists)"
        slot = max(p.slots)
        var = plan.slots[v][slot]
        return f"as each {var}[] element comes" if slot in plan.lists[v] else \
            f"as {var} is placed"
    if kind == Kind.EVENT:
        return "filter"
    if kind == Kind.KLEENE:
        if p.whole_list:
            return "each list"
        if not p.lists:
            return "the first element"
        return "each element after the first" if any(m for _, m in p.lists) else \
            "each appended element"
    return "where (every element)" if p.lists else "where"


def _chain_role(plan: Plan, v: int, p) -> str:
    """How a chain checks a condition (``runtime.compile.chain_placement``: plain slots
    bound from the last back, then the lists from the first on)."""
    if p.whole_list or p.has_equivalence:
        return "on each match"
    kleene = plan.run[v].kleene
    k = len(kleene)
    order = chain_order(kleene)
    positions = {s for _, s in p.extras}
    read = {s for s in p.slots if s < k} | positions
    at = max(read, key=order.index)
    var = plan.slots[v][at]
    if read == {at} and not positions:
        return f"filter of {var}[] elements" if kleene[at] else f"filter of {var}"
    if kleene[at] and at in positions:
        return f"as each {var}[] element is appended"
    if kleene[at]:
        return f"on each {var}[] candidate, against what is bound"
    return f"as {var} is bound"


def explain_text(plan: Plan) -> str:
    g = plan.graph
    shared = set(plan.shared_vertices())
    n_ops = sum(1 for v in range(plan.n_vertices) if plan.kind(v) != Kind.OUTPUT)
    lines = [f"plan: {len(plan.queries)} queries, {n_ops} operator/event vertices "
             f"({len(shared)} shared) + {len(plan.queries)} outputs, {g.n_arcs} arcs; "
             f"estimated cost {plan.total_cost:.4g} partial matches per window",
             "", "vertices (children before parents):"]
    for v in map(int, g.topo):
        k = plan.kind(v)
        if k == Kind.OUTPUT:
            continue
        view = plan.vertex(v)
        head = f"  v{v:<3} {plan.label(v):<22}"
        if k in (Kind.SEQ, Kind.AND, Kind.OR):
            head += f" (v{view.lchild} | v{view.rchild})"
        elif k in (Kind.NOT, Kind.KLEENE):
            head += f" (v{view.lchild})"
        head += f"  slots [{', '.join(_slot_labels(plan, v))}]"
        if k != Kind.NOT:
            head += f"  window {format_window(int(plan.window[v]))}"
        if plan.key_attrs[v]:
            head += f"  key [{', '.join(plan.key_attrs[v])}]"
        head += f"  est {plan.estimate[v]:.4g}"
        parents = ", ".join(f"v{p}" for p in view.parents)
        head += f"  -> {parents}" if parents else ""
        if v in shared:
            head += f"  [SHARED by {', '.join(plan.users[v])}]"
        lines.append(head)
        if k == Kind.NOT:
            lines.append(f"        guard: {_guard_text(plan, v)}")
        if plan.materialization[v]:
            lines.append(f"        records: {plan.materialization[v]}")
        for p in plan.preds[v]:
            lines.append(f"        {_pred_role(plan, v, p)}: {p.text}")
        for gv in view.guards:
            lines.append(f"        checks NOT v{gv}")
    lines += ["", "queries:"]
    for q in plan.queries:
        head = f"  {q.name}: OUTPUT v{q.output} <- v{q.root}, window {format_window(q.window_ms)}"
        if q.strategy != "skip-till-any-match":
            head += f", USING {q.strategy}"
        if q.lists:
            head += f", lists: {', '.join(q.lists)}"
        if q.after_match is not None:
            head += f", AFTER MATCH {q.after_match}"
        if q.never:
            head += "  (a constant condition is false: never matches)"
        lines.append(head)
        if q.construction_why:
            lines.append(f"        runs as: {q.construction_why}")
        for p in q.preds:
            lines.append(f"        where (complete match): {p.text}")
        for gv in g.guards(q.output):
            lines.append(f"        checks NOT v{gv}")
        for d in q.dropped:
            lines.append(f"        ignored: {d}")
    lines += ["", "pushdown filters (an event is kept if one alternative accepts it):"]
    if plan.every_event:
        lines.append("  every event, of any type: under a contiguity strategy each one counts")
    for etype, alts in plan.pushdown_filters().items():
        texts = []
        for f in alts:
            parts = [f"has {a}" for a in f.required_attrs] + [p.text for p in f.preds]
            texts.append(" AND ".join(parts) if parts else "all")
        lines.append(f"  {etype}: " + "  |  ".join(texts))
    return "\n".join(lines) + "\n"


def _dot_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def explain_dot(plan: Plan) -> str:
    g = plan.graph
    shared = set(plan.shared_vertices())
    out = ["digraph dqcep_plan {", "  rankdir=BT;", '  node [fontname="Helvetica"];']
    for v in range(plan.n_vertices):
        k = plan.kind(v)
        label = plan.label(v)
        if k == Kind.NOT:
            label = f"NOT {plan.guard[v].mode}"
        details = [f"{_pred_role(plan, v, p)}: {p.text}" if k in (Kind.KLEENE, Kind.RUN)
                   else p.text
                   for p in plan.preds[v]]
        details += [f"USING {q.strategy}" for q in plan.queries
                    if q.output == v and q.strategy != "skip-till-any-match"]
        if plan.key_attrs[v]:
            details.append("key [" + ", ".join(plan.key_attrs[v]) + "]")
        if plan.on_demand[v]:
            details.append("records on demand")
        text = f"v{v}: {label}" + "".join(f"\\n{_dot_escape(d)}" for d in details)
        shape = {Kind.EVENT: "box", Kind.OUTPUT: "doubleoctagon", Kind.NOT: "diamond",
                 Kind.KLEENE: "hexagon", Kind.RUN: "octagon"}.get(k, "ellipse")
        style = ', peripheries=2, color="firebrick"' if v in shared else ""
        out.append(f'  v{v} [label="{text}", shape={shape}{style}];')
    for a in range(g.n_arcs):
        port = Port(int(g.port[a])).name
        style = ', style=dashed' if port == "GUARD" else ""
        out.append(f'  v{g.tail[a]} -> v{g.head[a]} [label="{port}"{style}];')
    out.append("}")
    return "\n".join(out) + "\n"
