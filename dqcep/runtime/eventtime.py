"""What every engine over event time shares: input, reordering, late events.

An engine gets events in arrival order (a list of ``Event``, an ``EventBatch``
or ``EventColumns``), turns them into its column layout, decides per event
whether it is late (K-slack: more than ``lateness`` ms behind the largest ts
that arrived before it), holds the others in a reorder buffer and hands them to
the subclass in ts order once no earlier event can still come. Subclasses (the
native ``Engine``, the SASE baseline) implement the matching:

- ``_match(seqs, ts, types)``: events in ts order, already in ``self.store``
  (their sequence numbers, ts and type codes) -> matches;
- ``_after_watermark()``: the watermark moved (``self.wm``): release held
  matches, evict state;
- ``_flush_held()``: end of stream: release every held match;
- ``state_bytes()``: the bytes its state holds now (``peak_state_bytes`` keeps the largest).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np

from dqcep.runtime.lookups import LookupFiller

from dqcep._kernels.msgpack_decode import ColumnDecoder
from dqcep._kernels.store import EventStore
from dqcep._kernels.timelines import Timelines
from dqcep.core.admission import LATE_REASONS, AdmissionRule
from dqcep.core.batch import MISSING_INT, EventBatch
from dqcep.core.events import DECLARED_VALUES, Event, Match, declared_kind_problem
from dqcep.runtime.compile import (KIND_BOOL, KIND_MISSING, KIND_NUM, KIND_STR,
                                   StringDictionary)

# the store's value kinds as the declared-type rule names them
_KIND_CODE = {"num": KIND_NUM, "str": KIND_STR, "bool": KIND_BOOL}
_KIND_NAME = {KIND_NUM: "num", KIND_STR: "str", KIND_BOOL: "bool"}


# The string dictionary is swept once it holds this many values, and then again
# whenever it has doubled since the last sweep: amortized O(1) per new string.
SWEEP_MIN_STRINGS = 4096

def late_rule(before: np.ndarray, ts: np.ndarray, lateness: int) -> np.ndarray:
    """The late-event rule, the one place it is written: an event is late when its
    ``ts`` is more than ``lateness`` ms below ``before``, the largest ts that arrived
    before it (int64 arrays). ``before - ts`` is taken exactly, without int64
    overflow (it is < 2**64 where before > ts)."""
    gap = before.view(np.uint64) - ts.view(np.uint64)
    return (before > ts) & (gap > np.uint64(lateness))


def in_ts_order(cols: tuple) -> tuple:
    """Columns (ts first) in ts order, arrival order among equal ts: a run of the reorder
    buffer (the same columns when they are in order already)."""
    ts = cols[0]
    if len(ts) > 1 and (ts[1:] < ts[:-1]).any():
        order = np.argsort(ts, kind="stable")
        return tuple(c[order] for c in cols)
    return cols


# Timelines are looked over for ones to forget once they are twice as many as the last
# look left, and at least this many: amortized O(1) a new timeline.
TIMELINES_KEPT = 512

NO_TIME = int(np.iinfo(np.int64).min)  # no G yet, no watermark (for the kernel)
_ONE_TIMELINE = (np.empty(0, np.int8), np.empty(0, np.float64))  # no --timeline

# Released events are matched this many at a time, the watermark moved after each slice
RELEASE_SLICE = 4096

# Events waiting for stream order (ts, id): (seqs, ts, ids, types) columns.
NOTHING_WAITING = (np.empty(0, np.int64),) * 3 + (np.empty(0, np.int32),)


def wait_for_stream_order(waiting: tuple, store: EventStore, seqs: np.ndarray,
                          ts: np.ndarray, types: np.ndarray) -> tuple:
    """``waiting`` with stored events added (sequence numbers, ts, type codes).

    What reads stream order (the selection strategies of spec 5.2) may take an
    event only once no event of its ts can still come: the engine releases events
    in ts order, but one of equal ts and a smaller id may be in a later release."""
    return tuple(np.concatenate([a, b]) for a, b in zip(
        waiting, (seqs, ts, store.ids_of(seqs.reshape(-1, 1))[:, 0], types)))


def ready_in_stream_order(waiting: tuple, limit: int | None) -> tuple[tuple, tuple | None]:
    """(still waiting, (seqs, ts, types) sorted by (ts, id)) of the events with
    ts < ``limit`` (all when None); None when no event is ready."""
    seqs, ts, ids, types = waiting
    ready = ts < limit if limit is not None else np.ones(len(ts), bool)
    if not ready.any():
        return waiting, None
    order = np.lexsort((ids[ready], ts[ready]))
    return (tuple(a[~ready] for a in waiting),
            (seqs[ready][order], ts[ready][order],
             np.ascontiguousarray(types[ready][order])))


class EventColumns(NamedTuple):
    """Events in the engine's own input layout, in arrival order.

    ``ts`` and ``id`` int64; ``type`` int32 engine type codes (-1: a type no
    query uses); ``val`` float64 and ``kind`` int8, both [n, attributes]: one
    cell per attribute some predicate or key reads (``engine.attrs``), its kind
    KIND_MISSING/NUM/STR/BOOL and its value (strings as codes of the engine's
    dictionary). ``process`` turns every other input into this;
    ``engine.column_decoder()`` decodes msgpack payloads straight into it.
    """

    ts: np.ndarray
    id: np.ndarray
    type: np.ndarray
    val: np.ndarray
    kind: np.ndarray

    def take(self, index) -> "EventColumns":
        return EventColumns(*(c[index] for c in self))

    @staticmethod
    def empty(n_attrs: int) -> "EventColumns":
        return EventColumns(np.zeros(0, np.int64), np.zeros(0, np.int64),
                            np.zeros(0, np.int32), np.zeros((0, n_attrs), np.float64),
                            np.zeros((0, n_attrs), np.int8))

    @staticmethod
    def concat(pieces: Sequence["EventColumns"]) -> "EventColumns":
        """The pieces' rows one after the other (in the same engine's layout)."""
        if len(pieces) == 1:
            return pieces[0]
        return EventColumns(*(np.concatenate(c) for c in zip(*pieces)))


LIST_ID = -3  # in a match's ids: the variable is bound to a Kleene list (MatchLists)


@dataclass(frozen=True)
class MatchLists:
    """The Kleene lists of a part's matches: for row r and list variable c (the
    variables ``columns[c]``), the ids ``values[offsets[r * k + c]:offsets[r * k + c + 1]]``
    in ts order, k = len(columns)."""

    columns: tuple[int, ...]
    offsets: np.ndarray   # int64[n * k + 1]
    values: np.ndarray    # int64

    def of(self, row: int, c: int) -> tuple[int, ...]:
        k = len(self.columns)
        return tuple(self.values[self.offsets[row * k + c]:self.offsets[row * k + c + 1]]
                     .tolist())

    def first(self, c: int) -> np.ndarray:
        """Per row, the first id of list variable c (every list has one)."""
        return self.values[self.offsets[c:-1:len(self.columns)]]

    def take(self, rows: np.ndarray) -> "MatchLists":
        """The lists of the rows ``rows`` (a boolean mask or indexes), in that order."""
        k = len(self.columns)
        index = np.arange((len(self.offsets) - 1) // k)[rows]
        cells = (index[:, None] * k + np.arange(k)).ravel()
        lengths = self.offsets[cells + 1] - self.offsets[cells]
        offsets = np.zeros(len(cells) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        starts = np.repeat(self.offsets[cells], lengths)
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
        return MatchLists(self.columns, offsets, self.values[starts + within])


@dataclass
class MatchBatch:
    """Matches, column by column, per query."""

    queries: tuple[tuple[str, tuple[str, ...]], ...]    # (name, variables) per query
    parts: list[tuple[int, np.ndarray, np.ndarray, MatchLists | None]] = field(
        default_factory=list)
    # (query index, detected_at int64[n], event ids int64[n, n_vars] with -1 = unbound and
    # LIST_ID = a Kleene list, the lists or None)

    def __len__(self) -> int:
        return sum(len(d) for _, d, _, _ in self.parts)

    def __iadd__(self, other: "MatchBatch") -> "MatchBatch":
        self.parts.extend(other.parts)
        return self

    def to_matches(self) -> list[Match]:
        out = []
        for q, detected, ids, lists in self.parts:
            name, variables = self.queries[q]
            where = {col: c for c, col in enumerate(lists.columns)} if lists else {}
            for r, (d, row) in enumerate(zip(detected.tolist(), ids.tolist())):
                out.append(Match(name, d, tuple(
                    (v, lists.of(r, where[j]) if i == LIST_ID else i)
                    for j, (v, i) in enumerate(zip(variables, row)) if i >= 0 or i == LIST_ID)))
        return out



@dataclass
class TimeState:
    """What an engine over event time holds, apart from its matching state: the
    events (stored once), their strings' codes, the reorder buffer, the watermark
    and the counters. ``dqcep.runtime.state.EngineState`` adds the native engine's
    queues and serializes the whole."""

    lateness: int
    dictionary: StringDictionary
    store: EventStore                 # every event, once, by sequence number
    type_counts: np.ndarray           # events in, per type code
    attr_seen: np.ndarray             # per attribute column: a cell was ever present
    wm: int | None = None             # every future event has ts >= wm
    max_seen: int | None = None       # G: the largest ts of the events and ticks taken
    buffer: list = field(default_factory=list)  # reorder buffer: (ts, ids, types, val, kind)
    events_in: int = 0
    late: int = 0
    late_ids: list = field(default_factory=list)
    late_why: list = field(default_factory=list)  # per late id: its LATE_REASONS code
    late_by: list = field(default_factory=lambda: [0] * len(LATE_REASONS))  # per reason
    skew: int | None = None           # D (None: D = lateness)
    timeline: str | None = None       # K (None: one timeline)
    timelines: Timelines = field(default_factory=Timelines)  # T(k) per timeline (one
    # without K)
    ticks: int = 0                    # ticks taken
    timelines_kept: int = TIMELINES_KEPT  # timelines after the last forget (forget at 2x)
    peak_state_bytes: int = 0         # largest state_bytes() after a batch
    sweep_at: int = SWEEP_MIN_STRINGS  # dictionary size that triggers the next sweep
    decoder: ColumnDecoder | None = None  # caches codes of this dictionary; not state

    @classmethod
    def fresh(cls, n_types: int, n_attrs: int, admission: "AdmissionRule | int",
              constants: Sequence[str] = (), pinned: Sequence[int] | None = None
              ) -> "TimeState":
        """An empty state admitting by ``admission`` (or a lateness in ms);
        ``constants``: the dictionary's first values (compiled string constants),
        ``pinned`` the codes of those never freed (default all)."""
        admission = AdmissionRule.of(admission)
        return cls(admission.lateness, StringDictionary(
            constants, len(constants) if pinned is None else pinned), EventStore(n_attrs),
                   np.zeros(n_types, np.int64), np.zeros(n_attrs, bool),
                   skew=admission.skew, timeline=admission.timeline)

    @property
    def admission_rule(self) -> AdmissionRule:
        return AdmissionRule(self.lateness, self.skew, self.timeline)

    @property
    def tolerance(self) -> int:
        """D: the skew tolerance (``AdmissionRule.tolerance``)."""
        return self.admission_rule.tolerance


def _state_field(name: str) -> property:
    return property(lambda self: getattr(self.state, name),
                    lambda self, value: setattr(self.state, name, value),
                    doc=f"``self.state.{name}``")


class EventTimeEngine:
    """Input and event-time order for an engine; see the module docstring.

    ``types``: the event types the queries use (their index is the engine's
    type code); ``attrs``: the attribute columns some predicate or key reads;
    ``match_queries``: (name, variables) per query, the layout of ``MatchBatch``.
    """

    def __init__(self, types: Sequence[str], attrs: Sequence[str],
                 match_queries: tuple[tuple[str, tuple[str, ...]], ...],
                 lateness: "AdmissionRule | int" = 0,
                 state: "TimeState | None" = None, schemas: Sequence = (),
                 lookups: Sequence = (), tables: Sequence = (), lookup_source=None):
        self.types = list(types)
        self.type_code = {t: i for i, t in enumerate(self.types)}
        self.attrs = list(attrs)
        self.match_queries = match_queries
        self.state = state if state is not None else \
            TimeState.fresh(len(self.types), len(self.attrs), lateness)
        # the input's columns: the stored ones, and the timeline attribute after them
        # when no query reads it (admission reads it; it is dropped before the buffer)
        self.stored_attrs = len(self.attrs)
        timeline = self.state.timeline
        if timeline is not None and timeline not in self.attrs:
            self.attrs.append(timeline)
        self.attr_index = {a: i for i, a in enumerate(self.attrs)}
        self.timeline_col = None if timeline is None else self.attr_index[timeline]
        self.every_event = False  # store events of types no query names too
        # the ts from which the engine still holds every event a match to come may name
        # (its store's last eviction; None: it has evicted nothing since it was built):
        # what a reader beside it (RETURN values, Spark's id lookup) may forget
        self.kept_since: int | None = None
        self.schemas = tuple(s for s in schemas if s.type in self.type_code)
        # declared attribute types (EVENT Type(attr TYPE, ...)) of this engine's types:
        # (type code, store column, declared type, type, attribute)
        self.schema_checks = [(self.type_code[s.type], self.attr_index[a.name], a.type,
                               s.type, a.name)
                              for s in schemas if s.type in self.type_code for a in s.attrs]
        self.rejected_events: list[tuple[int, str]] = []  # (id, why), until taken
        # lookups (table(v.attr).column) read as attributes filled at ingest
        self.lookup_filler = None
        if lookups:
            if lookup_source is None:
                raise ValueError("the queries read the tables "
                                 f"{', '.join(sorted({c.table for c in lookups}))}: give "
                                 "the engine a lookup_source (dqcep.core.tables.LookupSource)")
            self.lookup_filler = LookupFiller(lookups, tables, self.attr_index, lookup_source)

    # Everything an engine holds lives in ``self.state``; these read and write it.
    lateness = _state_field("lateness")
    dictionary = _state_field("dictionary")
    store = _state_field("store")
    wm = _state_field("wm")
    max_seen = _state_field("max_seen")
    events_in = _state_field("events_in")
    late = _state_field("late")
    late_ids = _state_field("late_ids")
    peak_state_bytes = _state_field("peak_state_bytes")

    # ------------------------------------------------------ for subclasses
    def _match(self, seqs: np.ndarray, ts: np.ndarray, types: np.ndarray) -> MatchBatch:
        raise NotImplementedError

    def _after_watermark(self) -> MatchBatch:
        raise NotImplementedError

    def _flush_held(self) -> MatchBatch:
        raise NotImplementedError

    def _release_slice(self) -> int:
        """How many released events are matched before the watermark moves."""
        return RELEASE_SLICE

    def state_bytes(self) -> int:
        raise NotImplementedError

    def _measure_state(self) -> None:
        self.peak_state_bytes = max(self.peak_state_bytes, self.state_bytes())

    def seen(self) -> tuple[set[str], set[str]]:
        """(event types, attributes) of the queries that some input event held."""
        return ({t for t, n in zip(self.types, self.state.type_counts) if n},
                {a for a, hit in zip(self.attrs, self.state.attr_seen) if hit})

    def _constants_coded(self) -> None:
        """Called once the queries' predicates are compiled: the string constants,
        the only values coded so far, keep their codes for good."""
        self.dictionary.pin(len(self.dictionary.values))

    def _sweep_strings(self) -> None:
        """Free the codes of string values no stored or buffered event holds (the
        compiled constants are pinned), so that memory and snapshots grow with the
        strings in the engine's state, not with every distinct string seen. The
        decoder forgets its cached codes, some of which are free now."""
        live = [self.store.string_codes()]
        live += [b[3][b[4] == KIND_STR].astype(np.int64) for b in self.state.buffer]
        live.append(self.state.timelines.string_codes())
        if self.dictionary.sweep(np.concatenate(live)) and self.state.decoder is not None:
            self.state.decoder.forget_strings()
        self.state.sweep_at = max(SWEEP_MIN_STRINGS, 2 * len(self.dictionary))

    # --------------------------------------------------------------- input
    def _columns_from_batch(self, batch: EventBatch):
        schema = batch.schema
        tmap = np.array([self.type_code.get(t, -1) for t in schema.types] + [-1], np.int32)
        types = tmap[batch.type]
        n = len(batch)
        val = np.zeros((n, len(self.attrs)), dtype=np.float64)
        kind = np.zeros((n, len(self.attrs)), dtype=np.int8)
        kinds = dict(schema.attrs)
        for a, name in enumerate(self.attrs):
            if name not in kinds:
                continue
            col, k = batch.columns[name], kinds[name]
            if k == "float":
                present = ~np.isnan(col)
                val[:, a] = np.where(present, col, 0.0)
                kind[:, a] = np.where(present, KIND_NUM, KIND_MISSING)
            elif k == "int":
                present = col != MISSING_INT
                val[:, a] = np.where(present, col, 0).astype(np.float64)
                kind[:, a] = np.where(present, KIND_NUM, KIND_MISSING)
            elif k == "str":
                codes = self.dictionary.codes_for(schema.dictionary(name))
                present = col >= 0
                val[:, a] = np.where(present, codes[np.maximum(col, 0)] if len(codes) else 0, 0)
                kind[:, a] = np.where(present, KIND_STR, KIND_MISSING)
            else:
                present = col >= 0
                val[:, a] = np.where(present, col, 0)
                kind[:, a] = np.where(present, KIND_BOOL, KIND_MISSING)
        if batch.malformed is None:  # (the batch's own columns: _release keeps none of them)
            return (np.ascontiguousarray(batch.ts, np.int64),
                    np.ascontiguousarray(batch.id, np.int64), types, val, kind)
        good = batch.malformed == 0
        return (batch.ts[good], batch.id[good], types[good], val[good], kind[good])

    def columns(self, events: Sequence[Event]) -> EventColumns:
        """Events read in Python (a map, JSON, the validator) in this engine's input
        layout: what ``column_decoder()`` makes of msgpack payloads, so that every
        batch takes one road as columns (``dqcep.runtime.pipeline``)."""
        n = len(events)
        ts = np.fromiter((e.ts for e in events), np.int64, n)
        ids = np.fromiter((e.id for e in events), np.int64, n)
        types = np.fromiter((self.type_code.get(e.type, -1) for e in events), np.int32, n)
        val = np.zeros((n, len(self.attrs)), dtype=np.float64)
        kind = np.zeros((n, len(self.attrs)), dtype=np.int8)
        code = self.dictionary.code
        for i, e in enumerate(events):
            for a, name in enumerate(self.attrs):
                v = e.attrs.get(name)
                if v is None:
                    continue
                if isinstance(v, bool):
                    kind[i, a], val[i, a] = KIND_BOOL, float(v)
                elif isinstance(v, (int, float)):
                    kind[i, a], val[i, a] = KIND_NUM, float(v)
                else:
                    kind[i, a], val[i, a] = KIND_STR, code(v)
        return EventColumns(ts, ids, types, val, kind)

    def column_decoder(self) -> ColumnDecoder:
        """The engine's decoder of msgpack payloads into its EventColumns.

        One per engine (it caches the codes of the engine's string dictionary);
        ``restore`` replaces the dictionary and with it the decoder.
        """
        if self.state.decoder is None:
            self.state.decoder = ColumnDecoder(self.types, self.attrs, self.dictionary)
        return self.state.decoder


    def process(self, batch: EventBatch | EventColumns | Sequence[Event]) -> MatchBatch:
        """Feed events in arrival order; returns the matches now complete."""
        if isinstance(batch, EventBatch):
            cols = self._columns_from_batch(batch)
        elif isinstance(batch, EventColumns):
            cols = tuple(batch)
        else:
            cols = tuple(self.columns(batch))
        out = MatchBatch(self.match_queries)
        if self.schema_checks and len(cols[0]):
            cols = self._drop_misdeclared(cols)
        if self.lookup_filler is not None and len(cols[0]):
            cols = self.lookup_filler.fill(cols, self.dictionary)
        n = len(cols[0])
        self.events_in += n
        if n:
            why = self._late(cols)
            cols = self.stored_columns(cols)
            known = cols[2][cols[2] >= 0]
            self.state.type_counts += np.bincount(known, minlength=len(self.types))
            self.state.attr_seen |= (cols[4] != KIND_MISSING).any(axis=0)
            timelines = self.state.timelines
            if len(timelines) > 2 * self.state.timelines_kept:
                # a timeline with T(k) - L <= G - D says nothing the skew test does not
                timelines.forget_at_most(self.max_seen - self.state.tolerance + self.lateness)
                self.state.timelines_kept = max(TIMELINES_KEPT, len(timelines))
            late = why != 0
            if late.any():
                self._count_late(cols[1][late], why[late])
                cols = tuple(c[~late] for c in cols)
            if len(cols[0]):
                run = in_ts_order(cols)
                self.state.buffer.append(run)
                out += self._release(self.max_seen - self.state.tolerance)
                buffer = self.state.buffer
                if buffer and run is cols and np.may_share_memory(buffer[-1][0], cols[0]):
                    buffer[-1] = tuple(c.copy() for c in buffer[-1])  # not the caller's
        if len(self.dictionary) > self.state.sweep_at:
            self._sweep_strings()
        return out

    def _drop_misdeclared(self, cols):
        """The events whose declared attributes hold values of another type
        (``dqcep.core.events.DECLARED_VALUES``) leave the batch for ``take_rejected``."""
        bad, found = self.misdeclared(cols)
        self.rejected_events += [(i, why) for _, i, why in found]
        return tuple(c[~bad] for c in cols) if bad.any() else cols

    def misdeclared(self, cols) -> tuple[np.ndarray, list[tuple[int, int, str]]]:
        """Which events of these columns break a declared type: a mask, and (row, id,
        why) for each, in row order (the one rule; the Spark jobs' routers call it)."""
        ts, ids, types, val, kind = cols
        bad = np.zeros(len(ts), bool)
        if not self.schema_checks:
            return bad, []
        found: list[tuple[int, int, str]] = []  # (row, id, why)
        for code, col, declared, event_type, attr in self.schema_checks:
            rows = np.flatnonzero((types == code) & (kind[:, col] != KIND_MISSING) & ~bad)
            if not len(rows):
                continue
            want, whole = DECLARED_VALUES[declared]
            k, v = kind[rows, col], val[rows, col]
            fractional = (k == KIND_NUM) & (v != np.floor(v))
            wrong = (k != _KIND_CODE[want]) | (fractional if whole else False)
            for r, kr, fr in zip(rows[wrong].tolist(), k[wrong].tolist(),
                                 fractional[wrong].tolist()):
                found.append((r, int(ids[r]), declared_kind_problem(
                    event_type, attr, declared, _KIND_NAME[kr], fr)))
            bad[rows[wrong]] = True
        return bad, sorted(found)

    def take_rejected(self) -> list[tuple[int, str]]:
        """The events dropped since the last call because a declared attribute held a
        value of another type: (event id, why), in arrival order."""
        out, self.rejected_events = self.rejected_events, []
        return out

    def _late(self, cols) -> np.ndarray:
        """Why each event of a batch, in arrival order, is late: 0 (admitted) or a
        code of ``LATE_REASONS`` (spec section 7): on its timeline ``k``, late iff
        ts < T(k) - L (T(k): the largest ts before it on k; ``lateness``) or ts < G - D
        (G: the largest ts before it on any timeline, or of a tick; ``skew``).

        Decided per event, not per batch, so the same stream gives the same late
        events and the same matches however it is cut into batches (the service, the
        file runner and a replay of the journal all agree). G (``max_seen``) takes the
        admitted events; an explicit watermark (``advance_watermark``) is a bound too."""
        why, g = self.admit_columns(cols, self.max_seen, self.wm)
        self.max_seen = g
        return why

    def stored_columns(self, cols):
        """The columns as the store keeps them: without the timeline attribute when no
        query reads it (it is read for admission alone)."""
        if self.stored_attrs == len(self.attrs):
            return cols
        out = (*cols[:3], cols[3][:, :self.stored_attrs], cols[4][:, :self.stored_attrs])
        return EventColumns(*out) if isinstance(cols, EventColumns) else out

    def admit_columns(self, cols, g: int | None, floor: int | None = None
                      ) -> tuple[np.ndarray, int | None]:
        """The admission rule over columns in arrival order from G = ``g`` (None: no
        time yet), the engine's timelines taking the admitted events in: (why each is
        late, 0 admitted; G after them). ``floor``: an explicit watermark. The engine's
        own G is the caller's (``_late``; a Spark router keeps its own)."""
        c = self.timeline_col
        keys = (np.ascontiguousarray(cols[4][:, c]), np.ascontiguousarray(cols[3][:, c])) \
            if c is not None else _ONE_TIMELINE
        why, g = self.state.timelines.admit(
            *keys, np.ascontiguousarray(cols[0]), NO_TIME if g is None else g,
            self.lateness, self.state.tolerance, NO_TIME if floor is None else floor)
        return why, None if g == NO_TIME else g

    def timeline_values(self) -> list:
        """T(k) per timeline as [value kind, value (a string as itself), T]: what another
        engine, with other string codes, takes in (``add_timelines``)."""
        kinds, vals, tmax = self.state.timelines.arrays()
        strings = self.dictionary.values
        return [[k, strings[int(v)] if k == KIND_STR else v, t]
                for k, v, t in zip(kinds.tolist(), vals.tolist(), tmax.tolist())]

    def add_timelines(self, values: list) -> None:
        """``timeline_values()`` of another engine into this one's timelines."""
        if not values:
            return
        kinds, vals, tmax = zip(*values)
        codes = [float(self.dictionary.code(v)) if k == KIND_STR else float(v)
                 for k, v in zip(kinds, vals)]
        self.state.timelines.add(np.asarray(kinds, np.int8), np.asarray(codes, np.float64),
                                 np.asarray(tmax, np.int64))

    def _count_late(self, ids: np.ndarray, why: np.ndarray) -> None:
        self.late += len(ids)
        self.late_ids.extend(ids.tolist())
        self.state.late_why.extend(why.tolist())
        for code in np.unique(why).tolist():
            self.state.late_by[code - 1] += int((why == code).sum())

    def advance_watermark(self, ts: int) -> MatchBatch:
        """No event with ts < ``ts`` will come any more (e.g. an idle source)."""
        out = self._release(ts - 1)
        if self.wm is None or ts > self.wm:
            self.wm = ts
            out += self._after_watermark()
        return out

    def tick(self, at: int) -> MatchBatch:
        """A tick of the stream at time ``at`` ms (spec section 7): G = max(G, at); what
        that makes final comes out."""
        self.state.ticks += 1
        if self.max_seen is not None and at <= self.max_seen:
            return MatchBatch(self.match_queries)
        self.max_seen = at
        return self._release(at - self.state.tolerance)

    def flush(self) -> MatchBatch:
        """End of stream: everything buffered is processed, every held match released."""
        out = MatchBatch(self.match_queries)
        if self.state.buffer:
            out += self._release(None)
        out += self._flush_held()
        return out


    def take_late(self) -> list[int]:
        """The late events' ids since the last call (their reasons: ``take_late_why``)."""
        ids, self.late_ids = self.late_ids, []
        return ids

    def take_late_why(self) -> list[str]:
        """Why each event ``take_late`` gave was late, in the same order."""
        why, self.state.late_why = self.state.late_why, []
        return [LATE_REASONS[c - 1] for c in why]

    def late_counts(self) -> dict[str, int]:
        """Late events so far, per reason."""
        return dict(zip(LATE_REASONS, self.state.late_by))

    # ------------------------------------------------------------ processing

    def _release(self, upto: int | None) -> MatchBatch:
        """Process buffered events with ts <= upto (all when None), in ts order; the
        engine's time is then ``upto``: no event below it can come any more (the late
        rule), so what that makes final comes out now, not with a later event
        (spec section 7, output by finality).

        The reorder buffer is a list of runs, one per batch, each in ts order (arrival
        order among equal ts, ``in_ts_order``): a release takes the prefix of each run
        up to ``upto`` and merges only those; the rest of each run stays where it is.
        With a long --skew most of the buffer waits through many batches: it is
        neither copied nor sorted again for each."""
        buffer = self.state.buffer
        if not buffer:
            return self._time_moves(upto)
        cuts = [len(run[0]) if upto is None else int(np.searchsorted(run[0], upto, "right"))
                for run in buffer]
        if not any(cuts):
            return self._time_moves(upto)
        taken = [tuple(c[:k] for c in run) for run, k in zip(buffer, cuts) if k]
        self.state.buffer = [tuple(c[k:] for c in run) for run, k in zip(buffer, cuts)
                             if k < len(run[0])]
        if len(taken) == 1:
            cols = taken[0]
        else:  # runs in arrival order: a stable sort keeps it among equal ts
            cols = tuple(np.concatenate([t[i] for t in taken]) for i in range(5))
            if (cols[0][1:] < cols[0][:-1]).any():
                order = np.argsort(cols[0], kind="stable")
                cols = tuple(c[order] for c in cols)
        cut = len(cols[0])
        # in slices of RELEASE_SLICE events, the watermark moved after each: what one
        # slice adds to the state is evicted as a slice would be, however many events
        # a batch brings (the budget bounds the window's state, not the batch's)
        out = MatchBatch(self.match_queries)
        step = self._release_slice()
        for a in range(0, cut, step):
            ts, ids, types, val, kind = (c[a:min(a + step, cut)] for c in cols)
            # events of types no query uses only move event time (unless a contiguity
            # strategy needs to see every event)
            used = None if self.every_event else types >= 0
            if used is not None and not used.all():
                ts_u, ids, val, kind, types = (c[used] for c in (ts, ids, val, kind, types))
            else:
                ts_u = ts
            if len(ts_u):
                types = np.ascontiguousarray(types, np.int32)
                first = self.store.append(ts_u, ids, np.ascontiguousarray(val),
                                          np.ascontiguousarray(kind), types)
                seqs = np.arange(first, first + len(ts_u), dtype=np.int64)
                out += self._match(seqs, ts_u, types)
            # after the last slice the engine's time is upto (>= every ts released)
            last = int(ts[-1]) if a + step < cut or upto is None else upto
            if self.wm is None or last > self.wm:
                self.wm = last
            out += self._after_watermark()
        return out

    def _time_moves(self, upto: int | None) -> MatchBatch:
        """Nothing to release up to ``upto``: the engine's time moves to it all the same."""
        if upto is None or (self.wm is not None and upto <= self.wm):
            return MatchBatch(self.match_queries)
        self.wm = upto
        return self._after_watermark()

