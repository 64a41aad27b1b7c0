"""After-match policies (spec section 6) in the native engine.

A query with ``AFTER MATCH SKIP PAST LAST EVENT | SKIP TO NEXT EVENT`` keeps
its matches apart until they are decided: a match is decided once no match can
still come before it in detection order in its partition, i.e. once

- the watermark is past its last event's ts (every later match ends at an event
  of ts >= the watermark: the late rule), and
- no held match of its partition (a trailing or AND negation waits on it) ends at
  or before its last event (a held match takes its place by its positive events;
  one its negation rules out never blocks anything once it is let go).

The end of the input decides every match. Decided matches are walked in detection
order per partition of the query's top-level ``[attr]`` values, each accepted or
not against the last accepted one (``accepts``), and only accepted ones are
output, unchanged. What a policy holds (the waiting matches, and per partition
the first and last event of the last accepted match) is a ``PolicyState``: plain
data, in the engine's snapshot.

The rule is written here once for the native engine and the SASE baseline; the
reference matcher (``dqcep.baseline.reference.after_match``) keeps its own literal copy of
the section, so that the engines are checked against an independent reading.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dqcep._kernels.leaves import leaf_keys
from dqcep._kernels.ring import KeyedQueue
from dqcep.core.events import Match
from dqcep.lang.ast import SKIP_PAST_LAST
from dqcep.runtime.compile import KIND_BOOL, KIND_STR
from dqcep.runtime.eventtime import RELEASE_SLICE, MatchBatch, MatchLists
from dqcep.runtime.program import QueryProgram

Position = tuple[int, int]  # (ts, id): a place in stream order


def accepts(policy: str, last_accepted: tuple[Position, Position] | None,
            first: Position) -> bool:
    """Is a match starting at ``first`` accepted after the last accepted match of its
    partition, whose (first, last) is ``last_accepted`` (None: no match accepted yet)?"""
    if last_accepted is None:
        return True
    return first > (last_accepted[1] if policy == SKIP_PAST_LAST else last_accepted[0])


@dataclass
class Candidate:
    """A match found and not yet decided."""

    key: tuple          # its place in detection order: (last, first, positions, events)
    partition: tuple    # the values of the query's [attr]s: ((kind, value), ...)
    code: int           # the partition key its records carry in the engine (a hash)
    detected: int       # its detected_at
    ids: tuple          # its event ids, a column per variable (-1 unbound, LIST_ID a list)
    lists: tuple        # per list column of the query, the list's ids in ts order

    def to_obj(self) -> list:
        return [self.key, self.partition, self.code, self.detected, self.ids, self.lists]

    @classmethod
    def from_obj(cls, obj: list) -> "Candidate":
        return cls(*(_tuples(x) for x in obj))


def _tuples(x):
    """msgpack gives lists back: tuples again, all the way down (keys compare)."""
    return tuple(_tuples(y) for y in x) if isinstance(x, list) else x


@dataclass
class PolicyState:
    """One query's after-match state: see the module docstring."""

    policy: str
    waiting: list[Candidate] = field(default_factory=list)
    # partition -> (first, last) of its last accepted match
    accepted: dict[tuple, tuple[Position, Position]] = field(default_factory=dict)
    codes: dict[tuple, int] = field(default_factory=dict)  # partition -> its key code
    # key code -> the partitions of that code (derived from ``codes``: not saved)
    by_code: dict[int, set] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for part, code in self.codes.items():
            self.by_code.setdefault(code, set()).add(part)

    def add(self, matches: list[Match], places: list[list[Position]], partitions: list[tuple],
            codes: np.ndarray, ids: np.ndarray, lists: MatchLists | None) -> None:
        """Matches found (``matches``: as Match objects; ``places``: each one's
        ascending positive events; ``partitions`` and ``codes``: its partition's
        values and key code; ``ids`` and ``lists``: its MatchBatch columns) join the
        waiting ones."""
        k = len(lists.columns) if lists is not None else 0
        for r, (m, pos, part, code) in enumerate(zip(matches, places, partitions,
                                                      codes.tolist())):
            self.waiting.append(Candidate(
                (pos[-1], pos[0], tuple(pos), tuple(sorted(m.events))), part, code,
                m.detected_at, tuple(ids[r].tolist()), tuple(lists.of(r, c) for c in range(k))))

    def decide(self, wm: int | None, held: dict[tuple, Position],
               held_any: Position | None = None) -> list[Candidate]:
        """The waiting matches decided now and accepted, in detection order per
        partition. ``wm``: the watermark (None: the end of the input, every match
        is decided); ``held``: per partition, the earliest last event of a held
        match (those at or after it wait for it); ``held_any``: the same for every
        partition (an engine that knows no more than that)."""
        if not self.waiting:
            return []
        self.waiting.sort(key=lambda c: c.key)
        out, still, blocked = [], [], set()
        for c in self.waiting:
            last = c.key[0]
            if c.partition in blocked or (wm is not None and (
                    last[0] >= wm or (c.partition in held and held[c.partition] <= last)
                    or (held_any is not None and held_any <= last))):
                blocked.add(c.partition)  # what comes after it in its partition waits
                still.append(c)
                continue
            first = c.key[1]
            if accepts(self.policy, self.accepted.get(c.partition), first):
                self.accepted[c.partition] = (first, last)
                if c.partition not in self.codes:
                    self.codes[c.partition] = c.code
                    self.by_code.setdefault(c.code, set()).add(c.partition)
                out.append(c)
        self.waiting = still
        return out

    def bounds(self, codes=None) -> dict[int, int]:
        """Per partition key code, a ts before which no partial match can start and
        still be accepted. Every match still to come is decided after the accepted
        ones, against an accepted match at least as late, so under SKIP PAST LAST
        EVENT it must start after the last accepted match's last event, under SKIP
        TO NEXT EVENT after its first event. Partitions whose values hash to one code
        share the smallest bound. (A partition with no accepted match whose values
        hash to the code of one with, a chance of 2^-64 a pair, would lose partial
        matches it could still accept.) ``codes``: those codes alone (the partitions
        of the matches just accepted: the bounds that moved; the others' partial
        matches were dropped when theirs did), not every partition's each time."""
        parts = self.accepted if codes is None else \
            [p for code in codes for p in self.by_code.get(code, ())]
        out: dict[int, int] = {}
        for part in parts:
            first, last = self.accepted[part]
            ts = (last if self.policy == SKIP_PAST_LAST else first)[0]
            code = self.codes[part]
            out[code] = min(ts, out.get(code, ts))
        return out

    def nbytes(self) -> int:
        """A rough size: 100 bytes per waiting match and per partition."""
        return 100 * (len(self.waiting) + len(self.accepted))

    def to_obj(self) -> list:
        return [self.policy, [c.to_obj() for c in self.waiting],
                [[list(p), list(a), self.codes[p]] for p, a in self.accepted.items()]]

    @classmethod
    def from_obj(cls, obj: list) -> "PolicyState":
        policy, waiting, accepted = obj
        return cls(policy, [Candidate.from_obj(c) for c in waiting],
                   {_tuples(p): _tuples(a) for p, a, _ in accepted},
                   {_tuples(p): code for p, _, code in accepted})


def accepted_part(query: int, accepted: list[Candidate], list_columns: tuple[int, ...]):
    """Accepted matches as a MatchBatch part, as they were found."""
    lists = None
    if list_columns:
        flat = [ids for c in accepted for ids in c.lists]
        offsets = np.zeros(len(flat) + 1, np.int64)
        np.cumsum([len(ids) for ids in flat], out=offsets[1:])
        lists = MatchLists(tuple(list_columns), offsets,
                           np.array([i for ids in flat for i in ids], np.int64))
    return (query, np.array([c.detected for c in accepted], np.int64),
            np.array([c.ids for c in accepted], np.int64), lists)


def partition_of(store, dictionary, seq: int, columns: tuple[int, ...]) -> tuple:
    """The values of a query's [attr]s (store ``columns``) on an event (every positive
    event of a match carries the same): numbers as binary64, strings as themselves
    (their codes may be freed and given to other strings)."""
    out = []
    for a in columns:
        kind, value = store.cell(seq, a)
        out.append((kind, dictionary.values[int(value)] if kind == KIND_STR
                    else bool(value) if kind == KIND_BOOL else float(value)))
    return tuple(out)


def positions(store, lists, picked: np.ndarray, list_cols: tuple[int, ...],
              ) -> tuple[list[list[Position]], np.ndarray]:
    """Per row of ``picked`` (event sequence numbers per variable, -1 unbound; the
    columns ``list_cols`` hold Kleene list handles), the ascending (ts, id) of its
    positive events, list elements included; and the sequence number of each row's
    first event."""
    n = len(picked)
    plain = np.ones(picked.shape[1], bool)
    plain[list(list_cols)] = False
    rows, cols = np.nonzero(picked[:, plain] >= 0)
    seqs = picked[:, plain][rows, cols]
    if list_cols:
        handles = np.ascontiguousarray(picked[:, list(list_cols)]).ravel()
        offsets, elements = lists.elements_of(handles)
        owner = np.repeat(np.arange(len(handles)) // len(list_cols), np.diff(offsets))
        rows, seqs = np.concatenate([rows, owner]), np.concatenate([seqs, elements])
    seqs = np.ascontiguousarray(seqs, np.int64)
    ts = store.ts_of(seqs)
    ids = store.ids_of(seqs.reshape(-1, 1))[:, 0]
    order = np.lexsort((ids, ts, rows))
    rows, seqs = rows[order], seqs[order]
    out: list[list[Position]] = [[] for _ in range(n)]
    for r, t, i in zip(rows.tolist(), ts[order].tolist(), ids[order].tolist()):
        out[r].append((t, i))
    firsts = np.full(n, -1, np.int64)
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if len(rows) else rows
    firsts[rows[starts]] = seqs[starts]
    return out, firsts


# The smallest release slice with a pruning policy query (``PolicyStage._release_slice``):
# below it a slice's fixed cost shows (fire alert, 1000 rooms: 256 -> 190 K events/s,
# 1000 -> 281 K, 4096 -> 85 K)
PRUNED_SLICE = 256


class PolicyStage:
    """The native engine's after-match policies: the matches of a query with a policy
    wait in its ``PolicyState`` and come out decided. A part of
    ``dqcep.runtime.engine.Engine``, apart for reading: its methods read the engine's
    program, state and store."""

    def _wait_for_policy(self, q: QueryProgram, detected: np.ndarray, picked: np.ndarray):
        """The matches of a query with an after-match policy join its waiting ones,
        each with its place in detection order and its partition."""
        part = self._part(q, detected, picked)
        places, firsts = positions(self.store, self.state.lists, picked, q.list_columns)
        _, codes = leaf_keys(self.store, firsts, np.array(q.partition_cols, np.int32))
        self.state.policies[q.index].add(
            MatchBatch(self.match_queries, [part]).to_matches(), places,
            [partition_of(self.store, self.dictionary, seq, q.partition_cols)
             for seq in firsts.tolist()], codes, part[2], part[3])

    def _held_lasts(self, q: QueryProgram) -> dict[tuple, tuple[int, int]]:
        """Per partition, the earliest last event of a match the query holds for a
        negation: what comes after it in detection order waits for its release."""
        held = self.state.pending[q.index]
        if not len(held):
            return {}
        picked = held.slots if q.identity_slots else held.slots[:, q.var_slots]
        places, firsts = positions(self.store, self.state.lists, picked, q.list_columns)
        out: dict[tuple, tuple[int, int]] = {}
        for pos, seq in zip(places, firsts.tolist()):
            part = partition_of(self.store, self.dictionary, seq, q.partition_cols)
            if part not in out or pos[-1] < out[part]:
                out[part] = pos[-1]
        return out

    def _decide(self, wm: int | None) -> MatchBatch:
        """Every policy's matches decided now (``PolicyState.decide``); the accepted
        ones out, unchanged."""
        out = MatchBatch(self.match_queries)
        for qi, policy in self.state.policies.items():
            if not policy.waiting:
                continue
            q = self.program.queries[qi]
            accepted = policy.decide(wm, self._held_lasts(q) if wm is not None else {})
            if not accepted:
                continue
            out.parts.append(accepted_part(qi, accepted, q.list_columns))
            self.state.stats[q.spec.output].outputs += len(accepted)
            self._prune(q, policy.bounds({c.code for c in accepted}))
        return out

    def _release_slice(self) -> int:
        """A query whose policy prunes (``_prune``) drops the partial matches an
        accepted alert rules out only when the watermark moves, after a slice: within
        one, each of a partition's events extends the lists the last alert doomed
        (a rising run: 2^k of them for k events of the partition). So with such a
        query a slice holds about one event per partition with an alert (between
        PRUNED_SLICE and RELEASE_SLICE): ``dqcep run``'s chunks of 65,536 events ran
        the fire alert at 0.55x the speed and 12x the state of batches of 1,000."""
        if not self.program.prunable:
            return RELEASE_SLICE
        partitions = max((len(p.accepted) for p in self.state.policies.values()), default=0)
        return min(RELEASE_SLICE, max(PRUNED_SLICE, partitions))

    def _prune(self, q: QueryProgram, bounds: dict[int, int]) -> None:
        """Drop the partial matches the policy can no longer accept (``PolicyState.
        bounds``: by the key code of their partition, those starting before its
        bound) from the query's own vertices (``Program.prunable``): the state of a
        Kleene item on a long rising run stays bounded."""
        state, keyed = self.state, bool(q.partition_cols)
        codes = np.array(sorted(bounds), np.int64)
        limits = np.array([bounds[c] for c in codes.tolist()], np.int64)
        for v in self.program.prunable[q.index]:
            for queues in (state.growing, state.left_q, state.right_q):
                queue = queues.get(v)
                if queue is None or not len(queue.records):
                    continue
                s, e, k, ids = queue.records.to_arrays()
                if keyed:
                    at = np.minimum(np.searchsorted(codes, k), len(codes) - 1)
                    drop = (codes[at] == k) & (s < limits[at])
                else:  # one partition: its bound for every record
                    drop = s < limits[0]
                if not drop.any():
                    continue
                keep = ~drop
                fresh = KeyedQueue(queue.n_ids)
                fresh.load(queue.evicted, s[keep], e[keep], k[keep],
                           np.ascontiguousarray(ids[keep, :queue.n_ids]))
                fresh.records.limit = self.budget
                queues[v] = fresh
                state.stats[v].evictions += int(drop.sum())
