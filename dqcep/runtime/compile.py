"""Plan -> kernel specs: predicates re-addressed to the engine's store, windows, retention.

Predicates stay the plan's bytecode (dqcep/plan/bytecode.py); compiling only
re-addresses it: LOAD/EQUIV attribute names become EventStore column indexes
(``ts``/``id`` become the pseudo-columns -1/-2) and constants become (kind,
value) cells, strings through the engine's dictionary. We chose bytecode over
vectorized numpy expressions because predicates are evaluated on candidate
pairs inside the join loop, where a numpy call per pair is out of the question.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from dqcep.core.errors import UserError
from dqcep.lang import ast
from dqcep.plan import Kind, Plan, Port
from dqcep.plan.bytecode import FIRST, LAST, PAIRS, PREVIOUS, Op, Predicate
from dqcep.plan.decompose import chain_order
from dqcep.plan.records import UNBOUNDED, RunItems
from dqcep._kernels.predicates import BytecodeError, PredicateSet
from dqcep._kernels.chains import ChainSpec
from dqcep._kernels.runs import NEXT_MATCH, PARTITION, STRICT, RunSpec
from dqcep._kernels.store import KINDS

# Cell kinds and LOAD's pseudo-columns, as the kernels define them (store.pxd).
KIND_MISSING, KIND_NUM, KIND_STR, KIND_BOOL = (KINDS[k] for k in ("MISSING", "NUM", "STR",
                                                                  "BOOL"))
ATTR_TS, ATTR_ID, MAX_STACK = KINDS["ATTR_TS"], KINDS["ATTR_ID"], KINDS["MAX_STACK"]


class StringDictionary:
    """Engine-wide codes for string values (attribute values and string constants).

    Codes of values no live state refers to any more are freed and given to new
    values (``sweep``), so the dictionary grows with the strings the engine holds,
    not with every string it has seen. ``values[code]`` is None for a free code.
    The ``pinned`` codes (the queries' string constants, coded when they are
    compiled: the first ``pinned`` ones, or those given) are never freed.
    """

    def __init__(self, values: Sequence[str | None] = (), pinned: int | Sequence[int] = 0):
        self.values: list[str | None] = list(values)
        self.codes: dict[str, int] = {v: i for i, v in enumerate(self.values) if v is not None}
        self.free: list[int] = [i for i, v in enumerate(self.values) if v is None][::-1]
        self.sweeps = 0  # sweeps that freed codes (a cache of codes is stale after one)
        self.pin(pinned)

    def pin(self, pinned: int | Sequence[int]) -> None:
        self.pinned = np.arange(pinned, dtype=np.int64) if isinstance(pinned, int) else \
            np.asarray(sorted(pinned), np.int64)

    def __len__(self) -> int:
        """Values with a code."""
        return len(self.codes)

    def code(self, value: str) -> int:
        c = self.codes.get(value)
        if c is None:
            if self.free:
                c = self.free.pop()
                self.values[c] = value
            else:
                c = len(self.values)
                self.values.append(value)
            self.codes[value] = c
        return c

    def codes_for(self, values: Sequence[str]) -> np.ndarray:
        return np.array([self.code(v) for v in values], dtype=np.float64)

    def sweep(self, live: np.ndarray) -> int:
        """Free every unpinned code not in ``live``; returns how many were freed."""
        keep = np.zeros(len(self.values), bool)
        keep[self.pinned] = True
        live = live[(live >= 0) & (live < len(self.values))]
        keep[live] = True
        freed = 0
        for c in np.flatnonzero(~keep).tolist():
            value = self.values[c]
            if value is not None:
                del self.codes[value]
                self.values[c] = None
                self.free.append(c)
                freed += 1
        self.sweeps += freed > 0
        return freed


class ConstantCodes(StringDictionary):
    """The dictionary a program's string constants are compiled with, which records
    the codes they get (``used``): those a state pins."""

    def __init__(self, values: Sequence[str | None] = ()):
        super().__init__(values)
        self.used: set[int] = set()

    def code(self, value: str) -> int:
        c = super().code(value)
        self.used.add(c)
        return c


def attributes_read(preds: Sequence[Predicate], keys: Sequence[str] = ()) -> list[str]:
    """The attribute columns an engine stores: every attribute the predicates read
    (LOAD, EQUIV, aggregates) and the partition keys, in first-use order; ts and id are
    not columns."""
    names: list[str] = []

    def add(name):
        if name not in ("ts", "id") and name not in names:
            names.append(name)

    for p in preds:
        for op, a, b in p.code:
            if op == Op.LOAD or op >= Op.AGG_SUM:
                add(p.attrs[b])
            elif op == Op.EQUIV:
                add(p.attrs[a])
    for k in keys:
        add(k)
    return names


def plan_attributes(plan: Plan) -> list[str]:
    """Every attribute a predicate or a partition key of the plan reads, then those its
    event schemas declare (the engine checks their values), then the keys of its
    lookups (the lookups themselves are attributes the predicates read)."""
    preds = [p for ps in plan.preds for p in ps]
    preds += [p for g in plan.guard if g is not None for p in g.preds]
    preds += [p for q in plan.queries for p in q.preds]
    attrs = attributes_read(preds, [k for keys in plan.key_attrs for k in keys])
    attrs += sorted({a.name for s in plan.schemas for a in s.attrs} - set(attrs))
    return attrs + sorted({c.key for c in plan.lookups} - set(attrs) - {"ts", "id"})


def column(name: str, attr_index: dict[str, int]) -> int:
    """The store column a predicate reads for an attribute: ts and id are the event's."""
    return ATTR_TS if name == "ts" else ATTR_ID if name == "id" else attr_index[name]


def kleene_layout(p: Predicate) -> Predicate:
    """A condition of a KLEENE vertex on the record its kernel builds: [element,
    element before, first element] (``dqcep._kernels.lists.kleene_step``); a
    whole-list condition sees the last element in slot 0."""
    fixed = {PREVIOUS: 1, FIRST: 2, LAST: 0}
    code = tuple((op, fixed[p.extras[a - p.width][0]], b)
                 if op == Op.LOAD and p.extras and a >= p.width else (op, a, b)
                 for op, a, b in p.code)
    return dataclasses.replace(p, code=code, lists=(), extras=(), width=0)


def kleene_sets(preds: Sequence[Predicate], attr_index: dict[str, int],
                dictionary: "StringDictionary") -> tuple[PredicateSet, ...]:
    """A KLEENE vertex's conditions as ``dqcep._kernels.lists.kleene_step`` takes them:
    (pairs, first, whole, whole_each, whole_pairs), each on the kernel's record."""
    groups: dict[str, list[Predicate]] = {k: [] for k in
                                          ("pairs", "first", "whole", "whole_each", "whole_pairs")}
    for p in preds:
        modes = {m for _, m in p.lists}
        if p.whole_list:
            name = "whole_pairs" if PAIRS in modes else "whole_each" if modes else "whole"
        else:
            name = "pairs" if p.lists else "first"
        groups[name].append(kleene_layout(p))
    return tuple(predicate_set(g, attr_index, dictionary) for g in groups.values())


def aggregated_columns(preds: Sequence[Predicate], attr_index: dict[str, int]) -> list[int]:
    """The store columns some aggregate instruction reads (a ListStore keeps them)."""
    cols = []
    for p in preds:
        for op, _, b in p.code:
            if op >= Op.AGG_SUM:
                col = column(p.attrs[b], attr_index)
                if col not in cols:
                    cols.append(col)
    return cols


def predicate_set(preds: Sequence[Predicate], attr_index: dict[str, int],
                  dictionary: StringDictionary) -> PredicateSet:
    code, pred_start, slots, slot_start = [], [0], [], [0]
    cval: list[float] = []
    ckind: list[int] = []
    for p in preds:
        base = len(cval)
        for c in p.consts:
            if isinstance(c, bool):
                ckind.append(KIND_BOOL)
                cval.append(1.0 if c else 0.0)
            elif isinstance(c, str):
                ckind.append(KIND_STR)
                cval.append(float(dictionary.code(c)))
            else:
                ckind.append(KIND_NUM)
                cval.append(float(c))
        for op, a, b in p.code:
            if op == Op.CONST:
                code.append((op, base + a, 0))
            elif op == Op.LOAD:
                code.append((op, a, column(p.attrs[b], attr_index)))
            elif op == Op.EQUIV:
                code.append((op, column(p.attrs[a], attr_index), b))
            elif op == Op.AGG_COUNT:
                code.append((op, a, 0))
            elif op >= Op.AGG_SUM:  # the list in slot a, the store column of attrs[b]
                code.append((op, a, column(p.attrs[b], attr_index)))
            else:
                code.append((op, 0, 0))
        pred_start.append(len(code))
        slots.extend(p.slots)
        slot_start.append(len(slots))
    ranges = (np.cumsum([0] + [len(p.lists) for p in preds]),
              np.array([s for p in preds for s, _ in p.lists], np.int32),
              np.array([m for p in preds for _, m in p.lists], np.int32),
              np.cumsum([0] + [len(p.extras) for p in preds]),
              np.array([kind for p in preds for kind, _ in p.extras], np.int32),
              np.array([s for p in preds for _, s in p.extras], np.int32))
    try:  # the kernel checks the bytecode where it takes it
        return PredicateSet(np.array(code, dtype=np.int32).reshape(-1, 3), pred_start, slots,
                            slot_start, np.array(cval, dtype=np.float64),
                            np.array(ckind, dtype=np.int8), ranges)
    except BytecodeError as err:
        text = preds[err.predicate].text
        if err.too_deep:
            raise UserError(f"condition {text!r} is nested too deeply for the native "
                            f"engine (more than {MAX_STACK} operands pending)") from None
        raise UserError(f"condition {text!r} did not compile: {err}") from None


def effective_windows(plan: Plan) -> np.ndarray:
    """Per vertex, the largest span a record of it can usefully have (ms).

    A vertex's own window when it has one; a vertex used only under a negation
    (window UNBOUNDED in the plan) gets what its consumers can use: a NOT's
    interval is at most 2 W long, an operator parent bounds it by its own.
    """
    g = plan.graph
    eff = np.array(plan.window, dtype=np.int64).copy()
    need = np.zeros(plan.n_vertices, dtype=np.int64)
    for v in map(int, reversed(g.topo)):
        if eff[v] == UNBOUNDED:
            eff[v] = need[v]
        for a in g.in_arcs(v):
            child = int(g.tail[a])
            if plan.kind(v) == Kind.NOT:
                want = 2 * plan.guard[v].window_ms
            else:
                want = int(eff[v])
            need[child] = max(need[child], want)
    return eff


def guard_hosts(plan: Plan) -> dict[int, list[int]]:
    """NOT vertices checked at each vertex (binary operators and OUTPUTs)."""
    g = plan.graph
    return {v: [int(g.tail[a]) for a in g.in_arcs(v) if g.port[a] == Port.GUARD]
            for v in range(plan.n_vertices)}


STRATEGY_CODES = {ast.NEXT_MATCH: NEXT_MATCH, ast.STRICT: STRICT, ast.PARTITION: PARTITION}


def run_placement(preds: Sequence[Predicate], k: int) -> tuple[list[Predicate], list[int]]:
    """Where a run over ``k`` slots checks each condition (spec 5.2 "fits"): one that
    reads no whole list when an event is placed in the last slot it names (the slots
    of a SEQ fill in order), one with a nested [attr] at every placement from then on
    (its [attr] covers the events bound so far); whole-list ones (aggregates, v[last])
    on the complete match. Returns the conditions in that order and ``slot_first``
    (k + 1 bounds: slot s's are ``slot_first[s]:slot_first[s+1]``, the whole-match
    ones from ``slot_first[k]`` on)."""
    by_slot: list[list[Predicate]] = [[] for _ in range(k)]
    whole = []
    for p in preds:
        if p.whole_list:
            whole.append(p)
            continue
        first = max(p.slots, default=0)
        for s in range(first, k if p.has_equivalence else first + 1):
            by_slot[s].append(p)
    ordered = [p for group in by_slot for p in group] + whole
    return ordered, np.cumsum([0] + [len(g) for g in by_slot]).tolist()


def chain_placement(preds: Sequence[Predicate], kleene: Sequence[bool]
                    ) -> tuple[list[Predicate], list[int]]:
    """Where a chain (``dqcep._kernels.chains``: a flat SEQ under skip-till-any-match
    built when its last event comes) checks each condition. It binds the plain slots
    from the last to the first, then the Kleene slots from the first to the last; a
    condition goes to the slot that completes its slots in that order: a filter if it
    reads that slot alone (element by element for a Kleene slot), else checked when
    the slot is bound (a Kleene slot: per element, against what is bound), or with
    the element before / the first (``v[i-1]``, ``v[1]``) as each element is appended.
    Whole-list conditions (aggregates, ``v[last]``) and nested [attr]s: on the
    complete match. Returns the conditions in group order and the 3 k + 2 bounds of
    the groups (per slot: filter, bind, iteration; then the whole-match ones)."""
    k = len(kleene)
    rank = {s: i for i, s in enumerate(chain_order(kleene))}
    groups: list[list[Predicate]] = [[] for _ in range(3 * k)]
    whole = []
    for p in preds:
        if p.whole_list or p.has_equivalence:
            whole.append(p)
            continue
        positions = {s for _, s in p.extras}     # lists whose v[i-1] / v[1] it reads
        read = {s for s in p.slots if s < k} | positions
        at = max(read, key=rank.__getitem__)
        if read == {at} and not positions:
            groups[3 * at].append(p)          # the event (element) alone
        elif kleene[at] and at in positions:
            groups[3 * at + 2].append(p)      # with the element before / the first
        else:
            groups[3 * at + 1].append(p)
    ordered = [p for g in groups for p in g] + whole
    return ordered, np.cumsum([0] + [len(g) for g in groups] + [len(whole)]).tolist()


def chain_spec(items: RunItems, preds: Sequence[Predicate], key_attrs: Sequence[str],
               window: int, attr_index: dict[str, int],
               dictionary: "StringDictionary") -> ChainSpec:
    """A RUN vertex under skip-till-any-match, for ``dqcep._kernels.chains.chain_step``,
    its conditions placed by ``chain_placement``."""
    ordered, group_first = chain_placement(preds, items.kleene)
    return ChainSpec(
        window, np.array(items.types, np.int32), np.array(items.kleene, np.uint8),
        predicate_set(ordered, attr_index, dictionary), np.array(group_first, np.int64),
        np.array([attr_index[a] for a in key_attrs], np.int32))


def run_spec(items: RunItems, preds: Sequence[Predicate], key_attrs: Sequence[str],
             window: int, attr_index: dict[str, int],
             dictionary: "StringDictionary") -> RunSpec | ChainSpec:
    """A RUN vertex for ``dqcep._kernels.runs.run_step``, its conditions placed by
    ``run_placement``; under skip-till-any-match a chain (``chain_spec``)."""
    if items.strategy == ast.ANY_MATCH:
        return chain_spec(items, preds, key_attrs, window, attr_index, dictionary)
    ordered, slot_first = run_placement(preds, len(items.types))
    return RunSpec(
        STRATEGY_CODES[items.strategy], window, np.array(items.types, np.int32),
        np.array(items.kleene, np.uint8), predicate_set(ordered, attr_index, dictionary),
        np.array(slot_first, np.int64),
        np.array([attr_index[a] for a in key_attrs], np.int32))
