"""Events and matches: the records every engine reads and writes (spec sections 1 and 3)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

Value = int | float | str | bool

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1  # the largest integer attribute (msgpack's uint 64)
# Event times lie within +-TS_LIMIT ms (+-146 million years around 1970): with windows
# of at most 2**60 ms (dqcep.lang.parser.MAX_WINDOW_MS), every ts difference and every
# ts +- window the engines compute fits in 64 bits. msgpack_decode.pyx holds the same.
TS_LIMIT = 2**62 - 1
# Repeated event ids are dropped among the last RECENT_IDS distinct ids on every path
# that streams (dqcep.runtime.duplicates holds the rule; the constant lives here, where
# the CLI's help can read it without loading the runtime).
RECENT_IDS = 100_000
# An event whose ts is ahead of its arrival by more than this many ms is rejected on the
# streaming paths (--max-future; dqcep.io.ingest holds the rule).
MAX_FUTURE_MS = 300_000
# Partial matches one buffer of a query's state may hold (--max-partial-matches default;
# dqcep.runtime.engine holds the rule): a join queue, a Kleene vertex's growing lists, a
# negation's store, one batch's new records. A query whose state would grow past it is
# stopped; every other query goes on. 2^20 records are 32-80 MB a buffer (4-10 words
# each). It is declared here, where the command lines read it without the runtime.
STATE_BUDGET = 1 << 20


class EventError(ValueError):
    """An event that breaks spec section 1; the message is the reason."""


# ------------------------------------------------------------ declared types
# An event of a type a query file declares (``EVENT Type(attr TYPE, ...)``) is bad when
# a declared attribute holds a value of another type; an absent one is fine. This table
# is the rule, for events (``declared_type_problem``) and for columns of value kinds
# (``dqcep.runtime.eventtime``): the kind of value each type takes ("num": a number,
# "str", "bool") and whether the number must be whole.
DECLARED_VALUES = {"INT": ("num", True), "DOUBLE": ("num", False), "STRING": ("str", False),
                   "BOOL": ("bool", False)}
_KIND_WORDS = {"num": "a number", "str": "a string", "bool": "a boolean"}


def value_kind(value) -> str | None:
    """"num", "str" or "bool" (None: absent)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    return "num" if isinstance(value, (int, float)) else "str"


def declared_kind_problem(event_type: str, attr: str, declared: str, kind: str | None,
                          fractional: bool = False) -> str | None:
    """Why a value of ``kind`` ("num", "str", "bool"; None: absent) does not fit the
    declared type of ``attr`` (None: it fits); ``fractional``: a number not whole."""
    want, whole = DECLARED_VALUES[declared]
    if kind is None or (kind == want and not (whole and fractional)):
        return None
    got = "a number with a fraction" if kind == want else _KIND_WORDS[kind]
    return f"{event_type}.{attr} is declared {declared}, got {got}"


def declared_type_problem(event_type: str, attr: str, declared: str, value) -> str | None:
    """``declared_kind_problem`` for one value."""
    kind = value_kind(value)
    return declared_kind_problem(event_type, attr, declared, kind,
                                 kind == "num" and float(value) != int(value))


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    type: str
    ts: int
    attrs: Mapping[str, Value] = field(default_factory=dict)

    def value(self, attr: str) -> Value:
        """``var.attr`` for this event; ``ts`` and ``id`` are the event's own fields.

        Raises KeyError when the event does not carry the attribute.
        """
        if attr == "ts":
            return self.ts
        if attr == "id":
            return self.id
        return self.attrs[attr]

    def as_mapping(self) -> dict:
        """The event map: what a payload, a file record and a late line hold."""
        return {"id": self.id, "type": self.type, "ts": self.ts, **self.attrs}


def _short(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters: a reason never grows with the value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _not_unicode(text: str) -> bool:
    """True when ``text`` holds a lone surrogate (JSON's ``"\\ud800"``): no Unicode
    scalar value, so it cannot be written back out as UTF-8 (sinks, checkpoints)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def event_from_mapping(obj: Any) -> Event:
    """Validate a decoded event map (JSON or msgpack) and build an Event.

    Required: ``type`` (non-empty string), integer ``ts`` and integer ``id`` (both
    64-bit). Every other key is an attribute whose value must be a number, a string
    or a boolean; ``null`` means the attribute is absent.
    """
    if not isinstance(obj, Mapping):
        raise EventError(f"an event must be a map/object, got {type(obj).__name__}")
    etype = obj.get("type")
    if not isinstance(etype, str) or not etype:
        raise EventError("event has no 'type' (a non-empty string)" if etype is None else
                         f"event 'type' must be a non-empty string, got {_short(etype)}")
    if _not_unicode(etype):
        raise EventError(f"event 'type' {_short(etype)} is not valid Unicode (a lone surrogate)")
    for key in ("ts", "id"):
        v = obj.get(key)
        if not _is_int(v):
            raise EventError(f"event has no '{key}'" if v is None else
                             f"event '{key}' must be an integer, got {_short(v)}")
        if not INT64_MIN <= v <= INT64_MAX:
            raise EventError(f"event '{key}' {v} does not fit in 64 bits")
        if key == "ts" and not -TS_LIMIT <= v <= TS_LIMIT:
            raise EventError(f"event 'ts' {v} is outside +-(2**62 - 1) ms, the range of "
                             "event times")
    attrs = {}
    for k, v in obj.items():
        if k in ("type", "ts", "id") or v is None:
            continue
        if not isinstance(k, str):
            raise EventError(f"attribute names must be strings, got {_short(k)}")
        if _not_unicode(k):
            raise EventError(f"attribute name {_short(k)} is not valid Unicode (a lone surrogate)")
        if isinstance(v, float) and not math.isfinite(v):
            raise EventError(f"attribute {_short(k)} is not a finite number: {v!r}")
        if not isinstance(v, (int, float, str, bool)):
            raise EventError(f"attribute {_short(k)} must be a number, string or boolean, "
                             f"got {type(v).__name__}")
        if _is_int(v) and not INT64_MIN <= v <= UINT64_MAX:
            # the engines compare numbers as binary64 and msgpack (the journal, the
            # checkpoint) holds integers of 64 bits: a longer one crash-looped a service
            raise EventError(f"attribute {_short(k)} {_short(v)} does not fit in 64 bits "
                             "(an integer from -2**63 to 2**64 - 1; send a longer one as "
                             "a float or a string)")
        if isinstance(v, str) and _not_unicode(v):
            raise EventError(f"attribute {_short(k)} is not valid Unicode (a lone surrogate): "
                             f"{_short(v)}")
        attrs[k] = v
    return Event(obj["id"], etype, obj["ts"], attrs)


def batch_items(obj: Any) -> list | None:
    """The event maps of a batch ``{"events": [<event map>, ...]}`` (spec section 1),
    or None when ``obj`` is to be read as one event map. The one rule for every
    reader of payloads and records (files, MQTT, the journal); the msgpack kernel
    takes only batches that are ``{"events": [...]}`` alone, and leaves the rest to
    this. Raises EventError when ``events`` is not a list."""
    if isinstance(obj, Mapping) and "events" in obj and "type" not in obj:
        if not isinstance(obj["events"], list):
            raise EventError("'events' of a batch must be a list")
        return obj["events"]
    return None


def list_aggregate(func: str, attr: str | None, events: Sequence["Event"]) -> Value | None:
    """An aggregate over a Kleene list (spec 5.1), in ts order: ``count`` an integer;
    ``sum``, ``avg``, ``min``, ``max`` binary64 (summed left to right); None when an
    element lacks ``attr`` or holds no number there."""
    if func == "count":
        return len(events)
    values = []
    for ev in events:
        try:
            v = ev.value(attr)
        except KeyError:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        values.append(float(v))
    if func in ("sum", "avg"):
        total = 0.0
        for v in values:
            total += v
        return total if func == "sum" else total / len(values)
    return min(values) if func == "min" else max(values)


@dataclass(frozen=True, slots=True)
class Match:
    """One match of one query (spec section 3).

    ``events`` lists (variable, event id) for every bound positive variable, in the
    order the pattern declares them. ``returns`` holds the RETURN values, if any.
    """

    query: str
    detected_at: int
    events: tuple[tuple[str, int], ...]
    returns: tuple[tuple[str, Value | None], ...] = ()

    @property
    def key(self) -> tuple[str, frozenset]:
        """Identity of a match: the query and its variable -> event assignment."""
        return (self.query, frozenset(self.events))

    def to_json_obj(self, with_returns: bool = False) -> dict:
        obj: dict = {"query": self.query, "detected_at": self.detected_at,
                     "events": dict(self.events)}
        if with_returns and self.returns:
            obj["return"] = dict(self.returns)
        return obj
