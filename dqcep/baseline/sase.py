"""The SASE-style baseline engine: ``dqcep run --engine sase``.

SASE (Wu, Diao, Rizzi, SIGMOD 2006) evaluates ``SEQ`` patterns with an NFA
whose states each keep an active instance stack; sequences are built by
walking each new last-state instance's pointers back through the stacks
(``SaseNFA`` in ``dqcep/_kernels/sase.pyx``). Kleene closure and the selection
strategies are SASE+'s (Agrawal et al., SIGMOD 2008): an NFA^b whose *runs*
take, begin, proceed or ignore each event, cloned where the strategy leaves a
choice (``SaseRunNFA``). This module compiles a query into one of the two and
runs it behind the same input path as the native engine (``EventTimeEngine``:
K-slack reordering, late events, watermark), so the engines differ only in how
they match.

The SASE subset of the language: a single event pattern or ``SEQ`` of event
patterns and Kleene items ``Type+ v[]``, ``NOT Type var`` between, before or
after them, any ``WHERE`` (``[attr]`` partitions the stacks or runs),
``WITHIN``, every selection strategy. ``AND``, ``OR`` and ``NOT (pattern)`` are
rejected with the query's position. A query without Kleene items under
skip-till-any-match runs on the stacks, every other one on runs; runs see the
events in stream order (ts, id), so they wait until no event of their ts can
still come.

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

from dqcep._kernels.sase import NEG_MODES, STRATEGIES, SaseNFA, SaseRunNFA
from dqcep.core.errors import UserError
from dqcep.lang import ast
from dqcep.plan.bytecode import Predicate, compile_predicate, evaluate_on_events
from dqcep.plan.lookups import resolve_all
from dqcep.runtime.compile import (aggregated_columns, attributes_read, predicate_set,
                                   run_placement)
from dqcep.runtime.policy import PolicyState, accepted_part, partition_of, positions
from dqcep.runtime.eventtime import (LIST_ID, NOTHING_WAITING, EventTimeEngine, MatchBatch,
                                     MatchLists, ready_in_stream_order, wait_for_stream_order)


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
    # SASE+ runs (Kleene items or a selection strategy); their groups are: placed at
    # state 0..n-1 (run_placement), whole match, negation 0..m-1
    strategy: str = ast.ANY_MATCH
    lists: tuple[bool, ...] = ()       # per positive state: a Kleene item
    runs: bool = False
    after_match: str | None = None     # after-match policy (spec section 6): SASE+ consumption

    @property
    def every_event(self) -> bool:
        """Does every event matter, of any type (a contiguity strategy)?"""
        return self.strategy in (ast.STRICT, ast.PARTITION)


def _unsupported(q: ast.Query, node, what: str, source: str) -> UserError:
    pos = node if isinstance(node, ast.Pos) else getattr(node, "pos", q.pos)
    return UserError(f"{source}:{pos.line}:{pos.col}: query {q.name!r}: the SASE baseline "
                     f"runs SEQ patterns of events and Kleene items with NOT of single "
                     f"event types; {what} is not supported (use --engine native)")


def compile_sase(q: ast.Query, source: str = "<query>") -> SaseQuery:
    """Compile one query, or raise UserError if it is outside the SASE subset."""
    pattern = q.pattern
    if isinstance(pattern, (ast.EventPattern, ast.Kleene)):
        items: tuple = (pattern,)
    elif pattern.op != ast.SEQ:
        raise _unsupported(q, pattern, pattern.op, source)
    else:
        items = pattern.items
    positives: list[ast.EventPattern | ast.Kleene] = []
    negations: list[tuple[ast.EventPattern, int]] = []  # (event, positives before it)
    for item in items:
        if isinstance(item, (ast.EventPattern, ast.Kleene)):
            positives.append(item)
        elif isinstance(item, ast.Negation) and isinstance(item.pattern, ast.EventPattern):
            negations.append((item.pattern, len(positives)))
        elif isinstance(item, ast.Negation):
            raise _unsupported(q, item, "NOT (pattern)", source)
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
    kleene = frozenset(e.var for e in positives if isinstance(e, ast.Kleene))
    runs = bool(kleene) or q.strategy != ast.ANY_MATCH
    slot_of = {e.var: i for i, e in enumerate(positives)}
    positive_slots = dict(slot_of)
    slot_of.update({ev.var: n + j for j, (ev, _) in enumerate(negations)})

    scan: list[Predicate] = []
    groups: list[list[Predicate]] = [[] for _ in range(n + 1 + len(negations))]
    placed: list[Predicate] = []     # runs: every positive condition, placed below
    keys: list[str] = []
    never = False
    for c in ast.conjuncts(q.where):
        p = compile_predicate(c, slot_of, n, kleene, n + len(negations))
        negated_slots = [s for s in p.slots if s >= n]
        equiv = ast.has_equivalence(c)
        bare_key = isinstance(c, ast.Equivalence) and c.attr not in ("ts", "id")
        if not p.slots and not equiv:
            never |= not evaluate_on_events(p, [])
        elif len(negated_slots) > 1:
            continue  # the other negated variable is never bound (spec 4)
        elif negated_slots:
            if len(p.slots) == 1 and not equiv:
                scan.append(p)
            else:  # negation j = negated_slots[0] - n is group n + 1 + j
                groups[1 + negated_slots[0]].append(p)
        elif runs and bare_key:
            if c.attr not in keys:  # the runs' partitions, checked exactly as events come
                keys.append(c.attr)
        elif runs:
            placed.append(compile_predicate(c, positive_slots, n, kleene, n))
        elif equiv:
            groups[n].append(p)
            if bare_key and c.attr not in keys:
                keys.append(c.attr)
        elif len(p.slots) == 1:
            scan.append(p)
        else:
            groups[min(p.slots)].append(p)
    if runs:
        ordered, first = run_placement(placed, n)
        groups[:n + 1] = [ordered[first[s]:first[s + 1]] for s in range(n)] + \
            [ordered[first[n]:]]
    return SaseQuery(q.name, q.within.ms, tuple(e.type for e in positives),
                     tuple(e.var for e in positives), tuple(neg_specs), tuple(keys),
                     tuple(scan), tuple(tuple(g) for g in groups), never, q.strategy,
                     tuple(isinstance(e, ast.Kleene) for e in positives), runs,
                     q.after_match)


class SaseEngine(EventTimeEngine):
    """The SASE baseline over event batches: ``process`` / ``advance_watermark`` /
    ``flush`` as the native ``Engine`` (no snapshots).

    >>> from dqcep.lang import parse
    >>> from dqcep.core.events import Event
    >>> e = SaseEngine(parse("PATTERN SEQ(A a, B b) WITHIN 10").queries)
    >>> m = e.process([Event(1, "A", 0), Event(2, "B", 5)]); m += e.flush()
    >>> [x.events for x in m.to_matches()]
    [(('a', 1), ('b', 2))]
    """

    def __init__(self, queries: Sequence[ast.Query], lateness: int = 0,
                 source: str = "<query>", schemas: Sequence[ast.EventSchema] = (),
                 tables: Sequence[ast.LookupTable] = (), lookup_source=None):
        queries, lookups = resolve_all(queries, {t.name: t for t in tables})
        self.specs = [compile_sase(q, source) for q in queries]
        types: list[str] = []
        for s in self.specs:
            for t in s.states + tuple(t for t, _, _ in s.negations):
                if t not in types:
                    types.append(t)
        preds = [p for s in self.specs for p in s.scan + tuple(p for g in s.groups for p in g)]
        attrs = attributes_read(preds, [k for s in self.specs for k in s.key_attrs])
        schemas = [s for s in schemas if s.type in types]  # as the native plan keeps them
        attrs += sorted({a.name for s in schemas for a in s.attrs} - set(attrs))
        attrs += sorted({c.key for c in lookups} - set(attrs) - {"ts", "id"})
        super().__init__(types, attrs, tuple((s.name, s.variables) for s in self.specs),
                         lateness, schemas=schemas, lookups=lookups, tables=tables,
                         lookup_source=lookup_source)
        self.every_event = any(s.every_event for s in self.specs)
        self.nfas: list[SaseNFA | SaseRunNFA | None] = [
            None if s.never else self._runs(s) if s.runs else self._nfa(s) for s in self.specs]
        self.max_window = max((s.window_ms for s in self.specs), default=0)
        self.matches_out = [0] * len(self.specs)
        # spec section 6 as SASE+ consumes events: the queries' policies (the rule of
        # dqcep.runtime.policy, as the native engine decides)
        self.policies = {i: PolicyState(s.after_match) for i, s in enumerate(self.specs)
                         if s.after_match is not None}
        self._partition_cols = [tuple(self.attr_index[a] for a in s.key_attrs)
                                for s in self.specs]
        # runs read stream order (ts, id): events wait here until none of their ts can come
        self._waiting = NOTHING_WAITING
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

    def _runs(self, s: SaseQuery) -> SaseRunNFA:
        conds = [p for g in s.groups for p in g]
        return SaseRunNFA(
            STRATEGIES[s.strategy], s.window_ms, [self.type_code[t] for t in s.states],
            list(s.lists), [self.type_code[t] for t, _, _ in s.negations],
            [NEG_MODES[mode] for _, mode, _ in s.negations],
            [after for _, _, after in s.negations],
            [self.attr_index[a] for a in s.key_attrs],
            predicate_set(s.scan, self.attr_index, self.dictionary),
            predicate_set(conds, self.attr_index, self.dictionary),
            np.cumsum([0] + [len(g) for g in s.groups]),
            aggregated_columns(conds, self.attr_index))

    # -------------------------------------------------------------- matching
    def _match(self, seqs, ts, types) -> MatchBatch:
        out = MatchBatch(self.match_queries)
        for nfa in self.nfas:
            if isinstance(nfa, SaseNFA):
                nfa.scan(self.store, seqs, types)
        if any(isinstance(nfa, SaseRunNFA) for nfa in self.nfas):
            self._waiting = wait_for_stream_order(self._waiting, self.store, seqs, ts, types)
        self._take(out)
        self._measure_state()
        return out

    def _step_runs(self, limit: int | None) -> None:
        """Runs take the waiting events with ts < ``limit`` (all when None), in (ts, id)."""
        self._waiting, ready = ready_in_stream_order(self._waiting, limit)
        if ready is None:
            return
        seqs, _, types = ready
        for nfa in self.nfas:
            if isinstance(nfa, SaseRunNFA):
                nfa.scan(self.store, seqs, types)
        self._measure_state()

    def _after_watermark(self) -> MatchBatch:
        out = MatchBatch(self.match_queries)
        wm = self.wm
        self._step_runs(wm)
        for nfa in self.nfas:
            if nfa is not None:
                nfa.release(self.store, wm)
        self._take(out)   # before pruning: run matches read their lists
        out += self._decide(wm)
        held = []
        for s, nfa in zip(self.specs, self.nfas):
            if nfa is None:
                continue
            oldest = wm - s.window_ms  # no future match (last ts >= wm) starts before
            start = nfa.held_min_start(self.store)
            if start is not None:
                held.append(start)      # its trailing NOT reads negated events after start
            neg_cutoff = min(oldest, start if start is not None else oldest) - 1
            if isinstance(nfa, SaseRunNFA):
                nfa.prune(oldest, neg_cutoff, neg_cutoff + 1)
            else:
                nfa.prune(oldest, neg_cutoff)
        self.kept_since = min([wm - self.max_window] + held) - 1
        self.store.evict_before(self.kept_since)
        return out

    def _flush_held(self) -> MatchBatch:
        out = MatchBatch(self.match_queries)
        self._step_runs(None)
        for nfa in self.nfas:
            if nfa is not None:
                nfa.release(self.store, None, True)
        self._take(out)
        out += self._decide(None)
        return out

    def _take(self, out: MatchBatch) -> None:
        """The matches the automata emitted: per state an event's sequence number or
        (a Kleene state) a list handle, turned into event ids."""
        for i, nfa in enumerate(self.nfas):
            if nfa is None:
                continue
            detected, rows = nfa.take()
            if not len(detected):
                continue
            lists = None
            columns = [c for c, kleene in enumerate(self.specs[i].lists) if kleene]
            if i in self.policies:  # their places in detection order, from the sequences
                places, firsts = positions(self.store, getattr(nfa, "lists", None), rows,
                                           tuple(columns))
            if columns:
                offsets, seqs = nfa.lists.elements_of(np.ascontiguousarray(
                    rows[:, columns].ravel()))
                lists = MatchLists(tuple(columns), offsets,
                                   self.store.ids_of(seqs.reshape(-1, 1))[:, 0])
                rows[:, columns] = -1
            ids = self.store.ids_of(rows)
            ids[:, columns] = LIST_ID
            if i in self.policies:  # they wait for their decision
                self.policies[i].add(
                    MatchBatch(self.match_queries, [(i, detected, ids, lists)]).to_matches(),
                    places, [partition_of(self.store, self.dictionary, seq,
                                          self._partition_cols[i]) for seq in firsts.tolist()],
                    np.zeros(len(firsts), np.int64), ids, lists)  # (no pruning: no codes)
                continue
            out.parts.append((i, detected, ids, lists))
            self.matches_out[i] += len(detected)

    def _decide(self, wm: int | None) -> MatchBatch:
        """The policies' matches decided now (``dqcep.runtime.policy``). The automata
        tell only the earliest start of a sequence held for a trailing NOT: a match
        ending at or after it waits, whatever its partition."""
        out = MatchBatch(self.match_queries)
        for i, policy in self.policies.items():
            if not policy.waiting:  # (a query that can never match has no automaton)
                continue
            held = self.nfas[i].held_min_start(self.store) if wm is not None else None
            accepted = policy.decide(wm, {}, None if held is None else (held, -2 ** 63))
            if accepted:
                columns = tuple(c for c, kleene in enumerate(self.specs[i].lists) if kleene)
                out.parts.append(accepted_part(i, accepted, columns))
                self.matches_out[i] += len(accepted)
        return out

    # --------------------------------------------------------- introspection
    def state_bytes(self) -> int:
        """Bytes held by the event store, the instance stacks or runs and their lists,
        negation buffers, held sequences and the events waiting for the runs."""
        return (self.store.nbytes + sum(n.nbytes for n in self.nfas if n is not None)
                + sum(a.nbytes for a in self._waiting))

    def vertex_stats(self) -> list[dict]:
        """One row per query NFA, in the native engine's --stats columns: inputs =
        instances pushed (runs begun or cloned), outputs = matches, queue-hw = peak
        live instances (runs), evictions = instances (runs) pruned by the window."""
        rows = []
        for i, (s, n) in enumerate(zip(self.specs, self.nfas)):
            pushed = 0 if n is None else n.started + n.forked if s.runs else n.pushed
            rows.append({"vertex": i, "operator": f"SASE{'+' if s.runs else ''} {s.name}",
                         "inputs": pushed, "outputs": self.matches_out[i],
                         "queue_high_water": n.live_peak if n else 0,
                         "evictions": n.pruned if n else 0})
        return rows
