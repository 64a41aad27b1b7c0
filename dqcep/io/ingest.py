"""Journal records -> events: the one rule every consumer of the journal follows.

The service, its workers and ``dqcep spark stream`` read a record the same way:
through the map (``--map``, ``dqcep.io.mapping``) when there is one, else as an
event payload (``dqcep.io.payloads``: the format given, or detected); then every
event whose time is ahead of the record's arrival by more than ``max_future`` ms
is rejected ("clocks that lie": it would move the watermark and make every other
device's events late). Everything a record holds that is no event comes back as
a ``Rejected`` with the reason, for the dead-letter sink.
"""
from __future__ import annotations

import numpy as np

from dqcep.core.events import MAX_FUTURE_MS, Event
from dqcep.io.journal import Record
from dqcep.io.mapping import TopicMap
from dqcep.io.payloads import Rejected, decode_payload


def ahead_reason(ts: int, arrival_ms: int, max_future: int) -> str:
    return (f"event ts {ts} is ahead of its arrival ({arrival_ms}) by {ts - arrival_ms:,} ms,"
            f" more than --max-future {max_future:,} ms")


def ahead_rows(ts: np.ndarray, arrival_ms: np.ndarray, max_future: int) -> np.ndarray:
    """Which events are too far ahead of their arrival (unknown arrival: -1, never)."""
    if not max_future:
        return np.zeros(len(ts), bool)
    return (arrival_ms >= 0) & (ts - arrival_ms > max_future)


class PayloadReader:
    """``read(record)`` -> (events, rejected). ``fmt``: "msgpack", "json" or None
    (detect); ``topic_map``: a ``TopicMap`` (or None: event payloads);
    ``max_future``: ms an event may be ahead of its arrival (0: any)."""

    def __init__(self, fmt: str | None = None, topic_map: TopicMap | None = None,
                 max_future: int = MAX_FUTURE_MS):
        self.fmt, self.map, self.max_future = fmt, topic_map, max_future

    @property
    def event_payloads(self) -> bool:
        """Whether payloads are event maps, which the msgpack kernel may decode."""
        return self.map is None and self.fmt != "json"

    def read(self, record: Record) -> tuple[list[Event], list[Rejected]]:
        if self.map is not None:
            events, rejected = self.map.read(record)
        else:
            events, rejected = decode_payload(record.payload, self.fmt)
        if not self.max_future or record.arrival_us is None or not events:
            return events, rejected
        arrival = record.arrival_us // 1000
        limit = arrival + self.max_future
        if all(e.ts <= limit for e in events):
            return events, rejected
        # the good events' places in the payload: the ones no rejection names
        taken = {r.index for r in rejected if r.index is not None}
        single = not taken and len(events) == 1
        places = [i for i in range(len(events) + len(taken)) if i not in taken]
        kept = []
        for place, ev in zip(places, events):
            if ev.ts > limit:
                rejected.append(Rejected(ahead_reason(ev.ts, arrival, self.max_future),
                                         None if single else place))
            else:
                kept.append(ev)
        return kept, rejected
