"""A naive, test-only executor of a Plan (batch, whole stream in memory).

It computes every vertex's records in topological order exactly as the plan
describes them (operator, window, partition key, predicates, NOT guards) and
emits the OUTPUT records as matches. It is not an engine: it exists so the
differential tests can check that decomposition, predicate placement, guard
placement and sharing preserve the reference matcher's matches before any
native runtime executes the same plan.
"""
from __future__ import annotations

from dataclasses import dataclass

from dqcep.core.events import Event, Match
from dqcep.plan import GuardSpec, Kind, Plan, Port
from dqcep.plan.bytecode import evaluate_on_events
from dqcep.plan.records import UNBOUNDED


@dataclass(frozen=True)
class Rec:
    slots: tuple[Event | None, ...]

    @property
    def events(self):
        return [e for e in self.slots if e is not None]

    @property
    def start(self):
        return min(e.ts for e in self.events)

    @property
    def end(self):
        return max(e.ts for e in self.events)


def _preds_hold(preds, slots) -> bool:
    return all(evaluate_on_events(p, slots) for p in preds
               if all(slots[s] is not None for s in p.slots))


def _key(plan: Plan, v: int, rec: Rec):
    attrs = plan.key_attrs[v]
    values = set()
    for e in rec.events:
        try:
            values.add(tuple((type(x) is bool, x) for x in (e.value(a) for a in attrs)))
        except KeyError:
            return None
    return values.pop() if len(values) == 1 else None


def _violates(g: GuardSpec, host: Rec, children: list[Rec]) -> bool:
    if not any(host.slots[s] is not None for s in g.active_slots):
        return False
    start, end, w = host.start, host.end, g.window_ms

    def ts_of(slots):
        return [host.slots[s].ts for s in slots if host.slots[s] is not None]

    lo, lo_open, hi, hi_open = {
        "GAP": lambda: (max(ts_of(g.left_slots)), True, min(ts_of(g.right_slots)), True),
        "LEADING": lambda: (end - w, False, min(ts_of(g.right_slots)), True),
        "TRAILING": lambda: (max(ts_of(g.left_slots)), True, start + w, False),
        "AND": lambda: (end - w, False, start + w, False),
    }[g.mode]()
    own = {e.id for e in host.events}
    for c in children:
        if any(e.id in own for e in c.events):
            continue
        if not all((lo < e.ts if lo_open else lo <= e.ts) and
                   (e.ts < hi if hi_open else e.ts <= hi) for e in c.events):
            continue
        if _preds_hold(g.preds, host.slots + c.slots):
            return True
    return False


def execute(plan: Plan, events: list[Event]) -> list[Match]:
    g = plan.graph
    out: dict[int, list[Rec]] = {}
    for v in map(int, g.topo):
        k = plan.kind(v)
        if k == Kind.EVENT:
            etype = plan.types[plan.event_type[v]]
            recs = [Rec((e,)) for e in events if e.type == etype]
            recs = [r for r in recs if (not plan.key_attrs[v] or _key(plan, v, r) is not None)
                    and _preds_hold(plan.preds[v], r.slots)]
        elif k == Kind.NOT:
            recs = out[g.child(v, Port.CHILD)]
        elif k == Kind.OUTPUT:
            continue
        else:
            left, right = out[g.child(v, Port.LEFT)], out[g.child(v, Port.RIGHT)]
            nl, nr = len(plan.slots[g.child(v, Port.LEFT)]), len(plan.slots[g.child(v, Port.RIGHT)])
            if k == Kind.OR:
                cands = [Rec(r.slots + (None,) * nr) for r in left] + \
                        [Rec((None,) * nl + r.slots) for r in right]
            else:
                cands = []
                for a in left:
                    for b in right:
                        if k == Kind.SEQ and not a.end < b.start:
                            continue
                        if k == Kind.AND and {e.id for e in a.events} & {e.id for e in b.events}:
                            continue
                        cands.append(Rec(a.slots + b.slots))
            recs = []
            for r in cands:
                if plan.window[v] != UNBOUNDED and r.end - r.start > plan.window[v]:
                    continue
                if plan.key_attrs[v] and _key(plan, v, r) is None:
                    continue
                if not _preds_hold(plan.preds[v], r.slots):
                    continue
                if any(_violates(plan.guard[gv], r, out[gv]) for gv in g.guards(v)):
                    continue
                recs.append(r)
        out[v] = recs

    matches = []
    for q in plan.queries:
        if q.never:
            continue
        slot_of = dict(q.slot_of)
        for r in out[q.root]:
            if r.end - r.start > q.window_ms or not _preds_hold(q.preds, r.slots):
                continue
            guards = [plan.guard[gv] for gv in g.guards(q.output)]
            if any(_violates(gs, r, out[gv]) for gs, gv in zip(guards, g.guards(q.output))):
                continue
            held = any(gs.holds_back and any(r.slots[s] is not None for s in gs.active_slots)
                       for gs in guards)
            bound = tuple((var, r.slots[slot_of[var]].id) for var in q.variables
                          if r.slots[slot_of[var]] is not None)
            matches.append(Match(q.name, r.start + q.window_ms if held else r.end, bound))
    return matches

