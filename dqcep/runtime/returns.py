"""RETURN values of matches, for embedding programs and ``dqcep run --returns``.

The engines store only the attributes their predicates and keys read, and a
match names its events by id; ``ReturnValues`` keeps the recent events (as far
back as the engine's store reaches, so memory stays bounded by the windows) and
fills ``Match.returns`` from them::

    returns = ReturnValues(queries, engine)
    returns.remember(events)                  # the events given to engine.process
    for m in engine.process(events).to_matches():
        m = returns.fill(m)                   # m.returns: ((label, value), ...)
"""
from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Sequence

import msgpack

from dqcep.core.events import Event, Match, list_aggregate
from dqcep.core.tables import LookupSource, lookup_key


class ReturnValues:
    """RETURN values for an engine's matches (native or SASE), from recent events.
    A lookup item (``table(v.attr).column``) is read when its event is remembered,
    from the snapshot the engine's batch sees (``lookup_source``, ``tables``)."""

    def __init__(self, queries, engine, tables=(), lookup_source: LookupSource | None = None):
        self.specs = {q.name: q.returns for q in queries}
        self.engine = engine
        self.events: dict[int, Event] = {}
        self.order: deque = deque()
        key_types = {t.name: t.key_type for t in tables}
        self.lookups = sorted({(r.table, r.attr, r.column, key_types[r.table])
                               for q in queries for r in q.returns if r.table is not None})
        self.source = lookup_source
        self.looked: dict[int, dict] = {}  # event id -> {(table, attr, column): value}

    def for_engine(self, queries, engine, tables=()) -> "ReturnValues":
        """The same events kept, for another query set and the engine that runs it
        (a live change: the queries' RETURN items and lookups are the new set's;
        ``tables``: the declared tables they read)."""
        out = ReturnValues(queries, engine, tables, self.source)
        out.events, out.order, out.looked = self.events, self.order, self.looked
        return out

    def remember(self, events: Sequence[Event]) -> None:
        """Keep these events (pass each batch before giving it to the engine)."""
        for e in events:
            self.events[e.id] = e
            self.order.append((e.ts, e.id))
        if self.lookups:
            snapshots = {t: self.source.snapshot(t) for t in {x[0] for x in self.lookups}}
            for e in events:
                self.looked[e.id] = {
                    (t, a, c): snapshots[t].value(lookup_key(
                        e.value(a) if a in ("ts", "id") else e.attrs.get(a), kt), c)
                    for t, a, c, kt in self.lookups}
        kept = self.engine.kept_since  # what the engine forgot, no match can name
        if kept is not None:
            while self.order and self.order[0][0] < kept:
                gone = self.order.popleft()[1]
                self.events.pop(gone, None)
                self.looked.pop(gone, None)

    def snapshot(self) -> bytes:
        """The events kept (and their lookup values), for a checkpoint: a service that
        restarts fills the RETURN values of matches completed after the restart from
        events taken in before it."""
        events = [[ts, self.events[i].id, self.events[i].type, dict(self.events[i].attrs)]
                  for ts, i in self.order if i in self.events]
        looked = [[i, [[t, a, c, v] for (t, a, c), v in cells.items()]]
                  for i, cells in self.looked.items()]
        return msgpack.packb([events, looked], use_bin_type=True)

    def restore(self, blob: bytes) -> None:
        events, looked = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        self.events = {i: Event(i, etype, ts, attrs) for ts, i, etype, attrs in events}
        self.order = deque((ts, i) for ts, i, _, _ in events)
        self.looked = {i: {(t, a, c): v for t, a, c, v in cells} for i, cells in looked}

    def fill(self, m: Match) -> Match:
        """The match with its query's RETURN values: a variable gives its event's id (a
        Kleene variable its list of ids), ``var.attr`` the attribute, an aggregate its
        value over the list; an unbound variable or a missing attribute None."""
        bound = dict(m.events)
        values = []
        for r in self.specs[m.query]:
            label = r.label
            value = bound.get(r.var, -1)
            if isinstance(value, tuple):  # a Kleene list
                if r.func is None:
                    values.append((label, value))
                    continue
                events = [self.events.get(i) for i in value]
                values.append((label, None if None in events
                               else list_aggregate(r.func, r.attr, events)))
                continue
            ev = self.events.get(value)
            if ev is None:
                values.append((label, None))
            elif r.attr is None:
                values.append((label, ev.id))
            elif r.table is not None:
                values.append((label, self.looked[ev.id][(r.table, r.attr, r.column)]))
            else:
                values.append((label, ev.value(r.attr) if r.attr in ("ts", "id")
                               else ev.attrs.get(r.attr)))
        return replace(m, returns=tuple(values))
