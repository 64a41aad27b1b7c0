"""The SASE-style baseline engine: ``dqcep run --engine sase``.

SASE (Wu, Diao, Rizzi, SIGMOD 2006) evaluates ``SEQ`` patterns with an NFA
whose states each keep an active instance stack; sequences are built by
walking each new last-state instance's pointers back through the stacks
(``dqcep/_kernels/sase.pyx`` has the algorithm). This module compiles a query
into that NFA and runs it behind the same input path as the native engine
(``EventTimeEngine``: K-slack reordering, late events, watermark), so the two
differ only in how they match.

The SASE subset of the language: a single event pattern or ``SEQ`` of event
patterns, ``NOT Type var`` between, before or after them, any ``WHERE``
(``[attr]`` partitions the stacks), ``WITHIN``, skip-till-any-match. ``AND``,
``OR`` and ``NOT (pattern)`` are rejected with the query's position.

Where each conjunct is evaluated:

- one positive variable (no ``[attr]``): at scan, before the event is pushed;
- one negated variable (no ``[attr]``): at scan, before the event enters the
  negation's buffer;
- several positive variables: during construction, as soon as the lowest of
  their slots is bound (the walk binds the last variable first);
- containing ``[attr]``: on the complete sequence (a bare ``[attr]`` also
  partitions the stacks, by a hash of the values, so it is checked again);
- a negated variable with positive ones: when that negation is checked;
  naming two negated variables: never (spec 4: the other one is not bound);
- no variable: once; if it is false the query has no match.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dqcep._kernels.sase import NEG_MODES, SaseNFA
from dqcep.errors import UserError
from dqcep.lang import ast
from dqcep.plan.bytecode import Predicate, compile_predicate, evaluate_on_events
from dqcep.runtime.compile import attributes_read, predicate_set
from dqcep.runtime.eventtime import EventTimeEngine, MatchBatch


@dataclass(frozen=True)
class SaseQuery:
    """One query compiled for the SASE NFA (slots: positives 0..n-1, negations n..)."""

    name: str
    window_ms: int
    states: tuple[str, ...]            # event type per positive state
    variables: tuple[str, ...]         # positive variables, in SEQ order
    negations: tuple[tuple[str, str, int], ...]  # (type, mode, state the gap follows)
    key_attrs: tuple[str, ...]         # bare [attr]s: partition the stacks
    scan: tuple[Predicate, ...]
    groups: tuple[tuple[Predicate, ...], ...]  # depth 0..n-1, final, negation 0..m-1
    never: bool                        # a constant conjunct is false


def _unsupported(q: ast.Query, node, what: str, source: str) -> UserError:
    pos = node if isinstance(node, ast.Pos) else getattr(node, "pos", q.pos)
    return UserError(f"{source}:{pos.line}:{pos.col}: query {q.name!r}: the SASE baseline "
                     f"runs SEQ patterns of events with NOT of single event types; {what} "
                     f"is not supported (use --engine native)")


def compile_sase(q: ast.Query, source: str = "<query>") -> SaseQuery:
    """Compile one query, or raise UserError if it is outside the SASE subset."""
    pattern = q.pattern
    if q.strategy != ast.ANY_MATCH:
        raise _unsupported(q, q.strategy_pos, f"USING {q.strategy}", source)
    if isinstance(pattern, ast.EventPattern):
        items: tuple = (pattern,)
    elif pattern.op != ast.SEQ:
        raise _unsupported(q, pattern, pattern.op, source)
    else:
        items = pattern.items
    positives: list[ast.EventPattern] = []
    negations: list[tuple[ast.EventPattern, int]] = []  # (event, positives before it)
    for item in items:
        if isinstance(item, ast.EventPattern):
            positives.append(item)
        elif isinstance(item, ast.Negation) and isinstance(item.pattern, ast.EventPattern):
            negations.append((item.pattern, len(positives)))
        elif isinstance(item, ast.Negation):
            raise _unsupported(q, item, "NOT (pattern)", source)
        elif isinstance(item, ast.Kleene):
            raise _unsupported(q, item, "Kleene closure (Type+ v[])", source)
        else:
            raise _unsupported(q, item, f"{item.op} inside SEQ", source)
    n = len(positives)
    if n == 0:
        raise _unsupported(q, pattern, "a SEQ without positive items", source)
    neg_specs = []
    for ev, before in negations:
        if before == 0:
            neg_specs.append((ev.type, "LEADING", -1))
        elif before == n:
            neg_specs.append((ev.type, "TRAILING", n - 1))
        else:
            neg_specs.append((ev.type, "GAP", before - 1))
    slot_of = {e.var: i for i, e in enumerate(positives)}
    slot_of.update({ev.var: n + j for j, (ev, _) in enumerate(negations)})

    scan: list[Predicate] = []
    groups: list[list[Predicate]] = [[] for _ in range(n + 1 + len(negations))]
    keys: list[str] = []
    never = False
    for c in ast.conjuncts(q.where):
        p = compile_predicate(c, slot_of, equiv_slots=n)
        negated = [s for s in p.slots if s >= n]
        equiv = ast.has_equivalence(c)
        if not p.slots and not equiv:
            never |= not evaluate_on_events(p, [])
        elif len(negated) > 1:
            continue  # the other negated variable is never bound (spec 4)
        elif negated:
            if len(p.slots) == 1 and not equiv:
                scan.append(p)
            else:  # negation j = negated[0] - n is group n + 1 + j
                groups[1 + negated[0]].append(p)
        elif equiv:
            groups[n].append(p)
            if isinstance(c, ast.Equivalence) and c.attr not in ("ts", "id") \
                    and c.attr not in keys:
                keys.append(c.attr)
        elif len(p.slots) == 1:
            scan.append(p)
        else:
            groups[min(p.slots)].append(p)
    return SaseQuery(q.name, q.within.ms, tuple(e.type for e in positives),
                     tuple(e.var for e in positives), tuple(neg_specs), tuple(keys),
                     tuple(scan), tuple(tuple(g) for g in groups), never)


class SaseEngine(EventTimeEngine):
    """The SASE baseline over event batches: ``process`` / ``advance_watermark`` /
    ``flush`` as the native ``Engine`` (no snapshots).

    >>> from dqcep.lang import parse
    >>> from dqcep.events import Event
    >>> e = SaseEngine(parse("PATTERN SEQ(A a, B b) WITHIN 10").queries)
    >>> m = e.process([Event(1, "A", 0), Event(2, "B", 5)]); m += e.flush()
    >>> [x.events for x in m.to_matches()]
    [(('a', 1), ('b', 2))]
    """

    def __init__(self, queries: Sequence[ast.Query], lateness: int = 0,
                 source: str = "<query>"):
        self.specs = [compile_sase(q, source) for q in queries]
        types: list[str] = []
        for s in self.specs:
            for t in s.states + tuple(t for t, _, _ in s.negations):
                if t not in types:
                    types.append(t)
        preds = [p for s in self.specs for p in s.scan + tuple(p for g in s.groups for p in g)]
        attrs = attributes_read(preds, [k for s in self.specs for k in s.key_attrs])
        super().__init__(types, attrs, tuple((s.name, s.variables) for s in self.specs),
                         lateness)
        self.nfas: list[SaseNFA | None] = [None if s.never else self._nfa(s)
                                           for s in self.specs]
        self.max_window = max((s.window_ms for s in self.specs), default=0)
        self.store_retention = 2 * self.max_window + 2  # what the CLI's RETURN lookup keeps
        self.matches_out = [0] * len(self.specs)
        self._constants_coded()

    def _nfa(self, s: SaseQuery) -> SaseNFA:
        ranges = np.cumsum([0] + [len(g) for g in s.groups])
        return SaseNFA(
            s.window_ms, [self.type_code[t] for t in s.states],
            [self.type_code[t] for t, _, _ in s.negations],
            [NEG_MODES[mode] for _, mode, _ in s.negations],
            [after for _, _, after in s.negations],
            [self.attr_index[a] for a in s.key_attrs],
            predicate_set(s.scan, self.attr_index, self.dictionary),
            predicate_set([p for g in s.groups for p in g], self.attr_index, self.dictionary),
            ranges)

    # -------------------------------------------------------------- matching
    def _match(self, seqs, ts, types) -> MatchBatch:
        out = MatchBatch(self.match_queries)
        for nfa in self.nfas:
            if nfa is not None:
                nfa.scan(self.store, seqs, types)
        self._take(out)
        self._measure_state()
        return out

    def _after_watermark(self) -> MatchBatch:
        out = MatchBatch(self.match_queries)
        wm = self.wm
        held = []
        for s, nfa in zip(self.specs, self.nfas):
            if nfa is None:
                continue
            nfa.release(self.store, wm)
            oldest = wm - s.window_ms  # no future match (last ts >= wm) starts before
            start = nfa.held_min_start(self.store)
            if start is not None:
                held.append(start)      # its trailing NOT reads negated events after start
            nfa.prune(oldest, min(oldest, start if start is not None else oldest) - 1)
        self._take(out)
        self.store.evict_before(min([wm - self.max_window] + held) - 1)
        return out

    def _flush_held(self) -> MatchBatch:
        out = MatchBatch(self.match_queries)
        for nfa in self.nfas:
            if nfa is not None:
                nfa.release(self.store, None, True)
        self._take(out)
        return out

    def _take(self, out: MatchBatch) -> None:
        for i, nfa in enumerate(self.nfas):
            if nfa is None:
                continue
            detected, ids = nfa.take()
            if len(detected):
                out.parts.append((i, detected, ids, None))
                self.matches_out[i] += len(detected)

    # --------------------------------------------------------- introspection
    def state_bytes(self) -> int:
        """Bytes held by the event store, the instance stacks, negation buffers and
        held sequences."""
        return self.store.nbytes + sum(n.nbytes for n in self.nfas if n is not None)

    def vertex_stats(self) -> list[dict]:
        """One row per query NFA, in the native engine's --stats columns: inputs =
        instances pushed, outputs = matches, queue-hw = peak live instances,
        evictions = instances pruned by the window."""
        return [{"vertex": i, "operator": f"SASE {s.name}",
                 "inputs": n.pushed if n else 0, "outputs": self.matches_out[i],
                 "queue_high_water": n.live_peak if n else 0,
                 "evictions": n.pruned if n else 0}
                for i, (s, n) in enumerate(zip(self.specs, self.nfas))]
