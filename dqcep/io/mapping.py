"""Topics and payloads as IoT devices send them -> events (``--map FILE``).

A map file is TOML: ``[[topic]]`` rules, tried in order, the first whose MQTT
filter matches a record's topic reads it::

    [[topic]]
    filter = "sensors/+/+"   # which topics the rule reads (MQTT filter: + one level, # the rest)
    levels = "_/room/type"   # topic level -> attribute; `type` names the event type; `_` skips
    format = "json"          # json | msgpack | value (a bare number/string/bool); omitted: detect
    ts = "time"              # payload field (a dotted path into nested objects); omitted: arrival
    ts_unit = "s"            # s | ms | us | ns | iso8601; omitted: ms for numbers, ISO 8601 text
    ts_zone = "UTC"          # the zone of ISO 8601 times written without an offset
    type = "Temperature"     # a fixed event type (the topic's `type` level and a payload
                             # field `type` come after it, in that order)
    rename = { temp = "value" }  # payload field (dotted path) -> attribute
    id = "seq"               # a payload field: the device's own number of the reading
                             # (unique per topic); omitted: derived from the journal

Rules may also read a payload by its content, and one payload may give several
events, each of its own type::

    [[topic]]
    filter = "shellies/+/events/rpc"
    levels = "_/device/_/_"          # a level may be a pattern: "{room}_co2" captures room
    when = { method = "NotifyStatus" }  # payload fields equal to these values (dotted paths)
    has = ["params"]                 # payload fields present
    attrs = { src = "src" }          # attribute = payload field, for every event of the rule
    names = "clean"                  # keys that are no identifiers: other characters -> _
    ts = "params.ts"
    ts_unit = "s"

    [[topic.event]]                  # each event table that applies gives one event
    type = "Temperature"
    from = "params.temperature:0"    # its attributes: this object's fields (default: all)
    when = { ... }                   # and has, attrs, rename: as the rule's

A rule applies when its filter matches the topic, its level patterns fit the topic's
levels and its ``when`` and ``has`` hold; the first that applies reads the payload
(each item of an array payload on its own). A rule with event tables gives one event
per table that applies (its ``from`` field present and its own conditions true); none
applying is a dead letter that says why. A payload key that is no identifier
(``temperature:0``) cannot be named by a query: with ``names = "clean"`` it becomes one
(``temperature_0``); else it stays as it is, and is counted (``TopicMap.unnamable``:
``dqcep map test`` and the service say which, once).

A payload is one event (an object / map, or a bare value: the attribute
``value``) or several (an array of them). Nested objects flatten to
``parent_child`` attributes, nested arrays to ``parent_0``, ``parent_1``...; a
``null`` is an absent attribute. An event's id, unless the rule names a field
for it, is derived from its place in the journal: ``offset * 2**24 + index in
the payload``, so a replay after a crash gives the same ids. A device's own number
(``id = "seq"``) is unique on its topic only (two devices both count from 1): the
event's id is derived from the topic and that number (``device_id``), so the same
number on the same topic is a repeat and on another topic a reading of its own. Its
time, unless
the rule names a field for it, is the record's arrival time, journaled once at
ingest. Payload fields called ``id``, ``ts`` or ``type`` that the rule does not
read as such are not attributes (spec section 1: they are the event's own
fields); ``rename`` keeps them under another name.

``TopicMap.read(record)`` never raises on a payload: it returns the events and a
``Rejected`` (with the rule and the reason) for each one it cannot read.
Everything wrong with the file itself is a ``UserError`` naming the rule.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dqcep.core.errors import UserError
from dqcep.core.events import Event, EventError, event_from_mapping
from dqcep.io.journal import Record, Refused
from dqcep.io.mqtt import topic_problem
from dqcep.io.payloads import MAX_PAYLOAD, Rejected, decode_as, detect_format

ID_SHIFT = 24          # a derived id is offset << ID_SHIFT | index: 16 Mi events per payload
MAX_EVENTS = 1 << ID_SHIFT
FORMATS = ("json", "msgpack", "value")
TS_UNITS = {"s": 1000, "ms": 1, "us": 0.001, "ns": 0.000001, "iso8601": None}
RULE_KEYS = ("filter", "levels", "format", "ts", "ts_unit", "ts_zone", "type", "rename", "id",
             "when", "has", "attrs", "names", "event")
EVENT_KEYS = ("type", "from", "when", "has", "attrs", "rename")
NAMES = ("keep", "clean")  # what becomes of a payload key that is no identifier
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
EVENT_FIELDS = ("id", "ts", "type")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
TOPIC_CACHE = 1 << 16  # topics whose rule and level attributes are kept
MAX_UNNAMABLE = 256    # (rule, key) pairs counted by ``TopicMap.unnamable``


def derived_id(offset: int, index: int) -> int:
    """The id of the ``index``-th event of the payload at journal offset ``offset``."""
    return (offset << ID_SHIFT) | index


def device_id(topic: str, number: int, table: int = 0) -> int:
    """The id of the reading a device numbered ``number`` on ``topic``: 64 bits of
    BLAKE2b over both (the same in every process and run; two readings collide with
    probability 2**-62) in 2**62 .. 2**63 - 1, above ``derived_id``'s (below 2**62 up
    to journal offset 2**38). ``table``: the rule's event table (1-based; 0: a rule
    without tables), so that the events one message gives have ids of their own."""
    key = f"{topic}\0{number}" if not table else f"{topic}\0{number}\0{table}"
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return (1 << 62) | (int.from_bytes(digest, "little") >> 2)


def filter_matches(levels: list[str], topic: list[str]) -> bool:
    """MQTT 3.1.1 section 4.7: ``+`` is one level, ``#`` the rest (also none); a topic
    starting with ``$`` is matched by no wildcard in the first level."""
    if topic and topic[0].startswith("$") and levels and levels[0] in ("+", "#"):
        return False
    for i, level in enumerate(levels):
        if level == "#":
            return True
        if i >= len(topic) or (level != "+" and level != topic[i]):
            return False
    return len(topic) == len(levels)


def _path(text: str) -> tuple[str, ...]:
    return tuple(text.split("."))


_PRESENT = object()  # a ``has`` condition: the field is there, whatever it holds


@dataclass(frozen=True)
class Condition:
    """A payload field (a dotted path) present (``has``) or equal to a value (``when``)."""
    path: tuple[str, ...]
    value: object = _PRESENT

    def failure(self, item) -> str | None:
        """Why the condition does not hold on ``item``, or None when it does."""
        try:
            found = _lookup(item, self.path)
        except EventError:
            return f"no field {'.'.join(self.path)!r}"
        if self.value is _PRESENT or _same(found, self.value):
            return None
        return f"field {'.'.join(self.path)!r} is {_short(found)}, not {_short(self.value)}"


def _same(a, b) -> bool:
    """Equality as the language has it (spec section 2): numbers by value (1 = 1.0),
    booleans apart from numbers, strings as strings."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and isinstance(a, str) and a == b


def _short(value) -> str:
    """A payload value as a reason names it."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class EventTable:
    """One ``[[topic.event]]`` of a rule: an event of its own from each payload it
    applies to."""
    number: int                       # 1-based place in the rule
    type: str | None
    source: tuple[str, ...] | None    # ``from``: the object whose fields it takes
    conditions: tuple[Condition, ...]
    attrs: dict = field(default_factory=dict)   # attribute -> path
    rename: dict = field(default_factory=dict)  # flattened name -> attribute

    def failure(self, item) -> str | None:
        if self.source is not None:
            try:
                _lookup(item, self.source)
            except EventError:
                return f"no field {'.'.join(self.source)!r}"
        for c in self.conditions:
            why = c.failure(item)
            if why is not None:
                return why
        return None

    @property
    def name(self) -> str:
        return f"event {self.number}" + (f" ({self.type})" if self.type else "")


@dataclass(frozen=True)
class TopicRule:
    number: int                       # 1-based place in the file
    filter: str
    levels: tuple[str | None, ...]    # attribute per topic level (None: skipped)
    format: str | None
    ts: tuple[str, ...] | None
    ts_unit: str | None
    ts_zone: object
    type: str | None
    rename: dict = field(default_factory=dict)  # flattened name -> attribute
    id: tuple[str, ...] | None = None
    conditions: tuple[Condition, ...] = ()      # when and has
    attrs: dict = field(default_factory=dict)   # attribute -> path
    names: str = "keep"                         # NAMES
    events: tuple[EventTable, ...] = ()         # [[topic.event]]

    @property
    def name(self) -> str:
        return f"rule {self.number} ({self.filter})"

    @property
    def plain(self) -> bool:
        """Reads every payload of its topics alike (no content condition, no event
        tables, no attributes from fields, no names made): what the kernel may read."""
        return not (self.conditions or self.attrs or self.events or self.names != "keep")

    @property
    def reads_fields(self) -> bool:
        """Names fields of the payload: a payload that is no object cannot serve it."""
        return bool(self.ts or self.id or self.conditions or self.attrs or
                    any(e.source or e.conditions or e.attrs for e in self.events))

    def fit(self, parts: list[str]) -> dict | None:
        """The attributes the topic's levels give (a ``type`` among them), or None when a
        level pattern does not fit its level."""
        attrs = {}
        for i, level in enumerate(self.levels):
            if level is None or i >= len(parts):
                continue
            if isinstance(level, str):
                attrs[level] = parts[i]
                continue
            m = level.fullmatch(parts[i])
            if m is None:
                return None
            attrs.update(m.groupdict())
        return attrs


def _rule(number: int, raw, source: str) -> TopicRule:
    where = f"{source}: [[topic]] {number}"
    if not isinstance(raw, dict):
        raise UserError(f"{where} is not a table")
    unknown = [k for k in raw if k not in RULE_KEYS]
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r} (a rule has "
                        f"{', '.join(RULE_KEYS)})")

    def text(key, default=None):
        v = raw.get(key, default)
        if v is not None and (not isinstance(v, str) or not v):
            raise UserError(f"{where}: {key} must be a non-empty string")
        return v

    flt = text("filter")
    if flt is None:
        raise UserError(f"{where} has no filter (e.g. filter = \"sensors/+/+\")")
    problem = topic_problem(flt, subscribe=True)
    if problem:
        raise UserError(f"{where}: filter {flt!r}: {problem}")
    where = f"{source}: [[topic]] {number} ({flt})"
    flt_levels = flt.split("/")
    levels: tuple = ()
    if "levels" in raw:
        spec = text("levels").split("/")
        wild = flt_levels[-1] == "#"
        if (len(spec) != len(flt_levels) and not wild) or \
                (wild and len(spec) < len(flt_levels) - 1):
            raise UserError(f"{where}: levels {raw['levels']!r} names {len(spec)} levels, "
                            f"the filter has {len(flt_levels)}")
        seen: set = set()
        levels = tuple(None if n == "_" else _level(n, where, seen) for n in spec)
    fmt = text("format")
    if fmt is not None and fmt not in FORMATS:
        raise UserError(f"{where}: format {fmt!r} is not one of {', '.join(FORMATS)} "
                        "(omit it to detect each payload's)")
    ts = text("ts")
    unit = text("ts_unit")
    if unit is not None and unit not in TS_UNITS:
        raise UserError(f"{where}: ts_unit {unit!r} is not one of {', '.join(TS_UNITS)}")
    if unit is not None and ts is None:
        raise UserError(f"{where}: ts_unit without ts (the field that holds the time)")
    zone_name = text("ts_zone", "UTC")
    try:
        from zoneinfo import ZoneInfo
        zone = timezone.utc if zone_name == "UTC" else ZoneInfo(zone_name)
    except (ValueError, OSError, LookupError) as err:
        raise UserError(f"{where}: ts_zone {zone_name!r} is no time zone ({err})") from None
    rename = raw.get("rename", {})
    names = text("names", "keep")
    if names not in NAMES:
        raise UserError(f"{where}: names {names!r} is not one of {', '.join(NAMES)} (what "
                        "becomes of a payload key that is no identifier)")
    events = raw.get("event", [])
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise UserError(f"{where}: event must be [[topic.event]] tables")
    etype = text("type")
    if etype is not None:
        _check_type(etype, f"{where}: type")
    return TopicRule(number, flt, levels, fmt, None if ts is None else _path(ts), unit, zone,
                     etype, _renames(rename, where),
                     None if raw.get("id") is None else _path(text("id")),
                     _conditions(raw, where), _attrs(raw.get("attrs", {}), where), names,
                     tuple(_table(j + 1, e, f"{where} [[topic.event]] {j + 1}")
                           for j, e in enumerate(events)))


def _level(spec: str, where: str, seen: set):
    """A ``levels`` entry: an attribute name (the whole level) or a pattern of literal
    text and ``{name}`` captures (a compiled regex with named groups); a capture takes
    as much of the level as it can, from the left (``{room}_{type}`` reads
    ``living_room_temperature`` as living_room and temperature)."""
    def name_ok(name: str) -> str:
        if not NAME.match(name) or name in ("id", "ts"):
            raise UserError(f"{where}: levels: {name!r} is no attribute name (letters, "
                            "digits and _, not id or ts; _ skips a level; {name} captures "
                            "part of one)")
        if name in seen:
            raise UserError(f"{where}: levels names {name!r} twice")
        seen.add(name)
        return name
    if "{" not in spec and "}" not in spec:
        return name_ok(spec)
    pieces = re.split(r"\{([^{}]*)\}", spec)
    if any("{" in p or "}" in p for p in pieces[0::2]):
        raise UserError(f"{where}: levels: {spec!r}: braces must pair, as in {{room}}_co2")
    regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{name_ok(p)}>.+)"
                    for i, p in enumerate(pieces))
    return re.compile(regex, re.DOTALL)


def _check_type(name: str, where: str) -> None:
    if not NAME.match(name):
        raise UserError(f"{where}: {name!r} is no event type a query can name (letters, "
                        "digits and _)")


def _renames(rename, where: str) -> dict:
    if not isinstance(rename, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in rename.items()):
        raise UserError(f"{where}: rename must be a table of \"field\" = \"attribute\" "
                        "(quote a dotted field: \"a.b\" = \"x\")")
    for source, target in rename.items():
        if not NAME.match(target) or target in EVENT_FIELDS:
            raise UserError(f"{where}: rename: {source!r} = {target!r}: {target!r} is no "
                            "attribute name a query can name (letters, digits and _, not "
                            "id, ts or type)")
    return {k.replace(".", "_"): v for k, v in rename.items()}


def _flat_table(table, prefix: str = "") -> dict:
    """A TOML table whose bare dotted keys made nested tables, as dotted paths."""
    out = {}
    for k, v in table.items():
        if isinstance(v, dict):
            out.update(_flat_table(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _conditions(raw: dict, where: str) -> tuple[Condition, ...]:
    when, has = raw.get("when", {}), raw.get("has", [])
    if not isinstance(when, dict):
        raise UserError(f"{where}: when must be a table of \"field\" = value")
    out = []
    for path, value in _flat_table(when).items():
        if not isinstance(value, (str, int, float, bool)):
            raise UserError(f"{where}: when: {path!r} = {value!r}: a value is a string, "
                            "number or boolean")
        out.append(Condition(_path(path), value))
    if not isinstance(has, list) or not all(isinstance(h, str) and h for h in has):
        raise UserError(f"{where}: has must be a list of fields, as has = [\"params.ts\"]")
    out += [Condition(_path(h)) for h in has]
    return tuple(out)


def _attrs(attrs, where: str) -> dict:
    if not isinstance(attrs, dict) or not all(isinstance(v, str) and v
                                              for v in attrs.values()):
        raise UserError(f"{where}: attrs must be a table of attribute = \"field\"")
    for name in attrs:
        if not NAME.match(name) or name in EVENT_FIELDS:
            raise UserError(f"{where}: attrs: {name!r} is no attribute name a query can "
                            "name (letters, digits and _, not id, ts or type)")
    return {name: _path(path) for name, path in attrs.items()}


def _table(number: int, raw: dict, where: str) -> EventTable:
    unknown = [k for k in raw if k not in EVENT_KEYS]
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r} (an event table has "
                        f"{', '.join(EVENT_KEYS)})")
    for key in ("type", "from"):
        v = raw.get(key)
        if v is not None and (not isinstance(v, str) or not v):
            raise UserError(f"{where}: {key} must be a non-empty string")
    if raw.get("type") is not None:
        _check_type(raw["type"], f"{where}: type")
    return EventTable(number, raw.get("type"),
                      None if raw.get("from") is None else _path(raw["from"]),
                      _conditions(raw, where), _attrs(raw.get("attrs", {}), where),
                      _renames(raw.get("rename", {}), where))


class TopicMap:
    """The rules of a map file; ``read`` turns a journal record into events."""

    def __init__(self, rules: list[TopicRule], source: str = "the map", text: str = ""):
        self.rules = rules
        self.source = source
        self.text = text  # what it was parsed from (handed to Spark's journal source)
        self._filters = [r.filter.split("/") for r in rules]
        self._topics: dict[str, tuple] = {}
        # (rule number, attribute no query can name) -> events that carried it (``_named``)
        self.unnamable: dict[tuple[int, str], int] = {}

    @classmethod
    def parse(cls, text: str, source: str = "the map") -> "TopicMap":
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise UserError(f"{source}: not valid TOML: {err}") from None
        except RecursionError:  # tomllib reads nested arrays and tables recursively
            raise UserError(f"{source}: nested too deeply to be a map (a rule's values "
                            "are strings and tables of strings)") from None
        extra = [k for k in doc if k != "topic"]
        if extra:
            raise UserError(f"{source}: unknown key {extra[0]!r} (a map holds [[topic]] rules)")
        rules = doc.get("topic")
        if not isinstance(rules, list) or not rules:
            raise UserError(f"{source} has no [[topic]] rule")
        return cls([_rule(i + 1, r, source) for i, r in enumerate(rules)], source, text)

    @classmethod
    def load(cls, path: str | Path) -> "TopicMap":
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UserError(f"cannot read the map {path}: "
                            f"{getattr(err, 'strerror', None) or err}") from None
        return cls.parse(text, str(path))

    # ---------------------------------------------------------------- reading
    def _for_topic(self, topic: str) -> tuple:
        """The rules whose filter matches the topic and whose level patterns fit it, in
        order, each with (rule, attributes from the levels, type from a level); and the
        rules whose filter matches but whose patterns do not fit (for the reason)."""
        hit = self._topics.get(topic)
        if hit is not None:
            return hit
        parts = topic.split("/")
        fitting, misfits = [], []
        for rule, levels in zip(self.rules, self._filters):
            if filter_matches(levels, parts):
                attrs = rule.fit(parts)
                if attrs is None:
                    misfits.append(rule)
                    continue
                fitting.append((rule, attrs, attrs.pop("type", None)))
                if not rule.conditions:  # it always applies: no later rule is reached
                    break
        hit = (tuple(fitting), tuple(misfits))
        if len(self._topics) >= TOPIC_CACHE:
            self._topics.clear()
        self._topics[topic] = hit
        return hit

    def kernel_reading(self, topic: str):
        """How the kernel (``MappedColumns``) may read the records of ``topic``: (event
        type, format, {attribute: value} from the topic's levels), or None when they are
        for ``read``: no rule matches, or the first rule that may apply reads a time, an
        id, renames or reads the payload's content, or the type would come from the
        payload."""
        fitting, _ = self._for_topic(topic)
        if not fitting:
            return None
        rule, level_attrs, level_type = fitting[0]
        if rule.ts is not None or rule.id is not None or rule.rename or not rule.plain:
            return None
        etype = rule.type or level_type
        if not etype:
            return None
        return etype, rule.format, level_attrs

    def read(self, record: Record) -> tuple[list[Event], list[Rejected]]:
        """The events of one journal record, and why any part of it is no event."""
        fitting, misfits = self._for_topic(record.topic)
        payload = record.payload
        if not fitting:
            why = f"no [[topic]] rule of {self.source} matches the topic {record.topic!r}"
            if misfits:
                why += "; " + "; ".join(f"{r.name}: its levels do not fit" for r in misfits[:3])
            return [], [Rejected(why, None)]
        if isinstance(payload, Refused):
            return [], [Rejected(f"payload of {payload.size} bytes exceeds {MAX_PAYLOAD}; "
                                 "refused at ingest, only its size was kept", None)]
        if len(payload) > MAX_PAYLOAD:
            return [], [Rejected(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}", None)]
        decoded: dict = {}  # format -> (items, single) or the reason it holds none

        def items_for(rule):
            fmt = rule.format or detect_format(payload)
            if fmt is None:
                if rule.reads_fields:
                    return (f"{rule.name}: the payload is neither JSON nor msgpack (starts "
                            f"{payload[:24]!r}); the rule reads its fields")
                fmt = "value"
            if fmt not in decoded:
                try:
                    obj = _read_value(payload) if fmt == "value" else decode_as(payload, fmt)
                except ValueError as err:
                    decoded[fmt] = f"{rule.name}: {err}"
                else:
                    items = obj if isinstance(obj, list) else [obj]
                    decoded[fmt] = (f"{rule.name}: {len(items)} events in one payload; at "
                                    f"most {MAX_EVENTS}") if len(items) > MAX_EVENTS \
                        else (items, not isinstance(obj, list))
            return decoded[fmt]

        first = items_for(fitting[0][0])
        if isinstance(first, str):
            return [], [Rejected(first, None)]
        items, single = first
        events, rejected = [], []
        for i, item in enumerate(items):
            chosen, whys = None, []
            for rule, level_attrs, level_type in fitting:
                got = items_for(rule)
                if isinstance(got, str):
                    whys.append(got)
                    continue
                mine = got[0][i] if i < len(got[0]) else None
                why = next((w for c in rule.conditions if (w := c.failure(mine)) is not None),
                           None) if i < len(got[0]) else "no such item"
                if why is None:
                    chosen = (rule, mine, level_attrs, level_type)
                    break
                whys.append(f"{rule.name}: {why}")
            if chosen is None:
                rejected.append(Rejected("no [[topic]] rule applies: " + "; ".join(whys[:4]),
                                         None if single else i))
                continue
            try:
                events += self._events(*chosen, record, i)
            except (EventError, RecursionError) as err:
                why = "nested too deeply" if isinstance(err, RecursionError) else str(err)
                rejected.append(Rejected(f"{chosen[0].name}: {why}", None if single else i))
        return events, rejected

    def _events(self, rule: TopicRule, item, level_attrs: dict, level_type: str | None,
                record: Record, index: int) -> list[Event]:
        """The events one payload item gives by ``rule``: one, or one per event table
        that applies (none applying: an EventError naming each table's reason)."""
        if not rule.events:
            return [self._event(rule, None, item, record, derived_id(record.offset, index)
                                if rule.id is None else None, level_attrs, level_type)]
        out, whys = [], []
        n = len(rule.events)
        if (index + 1) * n > MAX_EVENTS:
            raise EventError(f"more than {MAX_EVENTS} events in one payload")
        for table in rule.events:
            why = table.failure(item)
            if why is not None:
                whys.append(f"{table.name}: {why}")
                continue
            out.append(self._event(rule, table, item, record,
                                   derived_id(record.offset, index * n + table.number - 1)
                                   if rule.id is None else None, level_attrs, level_type))
        if not out:
            raise EventError("no [[topic.event]] table applies: " + "; ".join(whys[:4]))
        return out

    def _event(self, rule: TopicRule, table: EventTable | None, item, record: Record,
               event_id: int | None, level_attrs: dict, level_type: str | None) -> Event:
        source = table.source if table is not None and table.source else ()
        obj = _lookup(item, source) if source else item
        if isinstance(obj, dict):
            flat: dict = {}
            _flatten(obj, "", flat)
        elif isinstance(obj, list):
            raise EventError("an array inside the payload's array is no event" if not source
                             else f"the field {'.'.join(source)!r} holds an array, no object")
        else:
            flat = {"value": obj}

        def inside(path):  # a path's attribute name when it lies in the event's object
            return "_".join(path[len(source):]) if path[:len(source)] == source else None

        if rule.ts is not None:
            ts = _time(_lookup(item, rule.ts), rule, record.arrival_us)
            flat.pop(inside(rule.ts), None)
        elif record.arrival_us is None:
            raise EventError("the journal record has no arrival time (written before journal "
                             "format 2); name the payload's time field (ts)")
        else:
            ts = record.arrival_us // 1000
        if rule.id is not None:
            number = _lookup(item, rule.id)
            flat.pop(inside(rule.id), None)
            if not isinstance(number, int) or isinstance(number, bool):
                raise EventError(f"the id field {'.'.join(rule.id)!r} must hold an integer, "
                                 f"got {number!r}"[:200])
            event_id = device_id(record.topic, number, table.number if table else 0)
        for renames in (rule.rename, table.rename if table is not None else {}):
            for src, dst in renames.items():
                if src in flat:
                    flat[dst] = flat.pop(src)
        for attrs in (rule.attrs, table.attrs if table is not None else {}):
            for name, path in attrs.items():
                try:
                    value = _lookup(item, path)
                except EventError:
                    continue  # an attribute the payload does not carry: absent
                if isinstance(value, (dict, list)):
                    sub: dict = {}
                    _flatten(value if isinstance(value, dict) else
                             {str(i): x for i, x in enumerate(value)}, name + "_", sub)
                    flat.update(sub)
                elif value is not None:
                    flat[name] = value
        payload_type = flat.pop("type", None)
        flat.pop("id", None)
        flat.pop("ts", None)
        etype = (table.type if table is not None else None) or rule.type or level_type \
            or payload_type
        if etype is None:
            raise EventError("no event type: the rule names none (type = ...), nor does the "
                             "topic (a `type` level) or the payload (a field `type`)")
        flat = self._named(rule, flat)
        flat.update(level_attrs)
        flat["id"], flat["ts"], flat["type"] = event_id, ts, etype
        return event_from_mapping(flat)

    def _named(self, rule: TopicRule, flat: dict) -> dict:
        """The attributes, a key that is no identifier cleaned (``names = "clean"``) or
        kept as it is and counted (``unnamable``: no query can name it)."""
        if all(NAME.match(k) for k in flat):
            return flat
        if rule.names == "keep":
            for k in flat:
                if not NAME.match(k):
                    key = (rule.number, k)
                    if key in self.unnamable or len(self.unnamable) < MAX_UNNAMABLE:
                        self.unnamable[key] = self.unnamable.get(key, 0) + 1
            return flat
        out = {}
        for k, v in flat.items():
            name = k if NAME.match(k) else clean_name(k)
            if name in out or (name != k and name in flat):
                raise EventError(f"two fields give the attribute {name!r} ({k!r} cleaned "
                                 "is another field's name); rename one")
            out[name] = v
        return out

    def unnamable_lines(self, since: int = 0) -> list[str]:
        """The attributes no query can name, one line per (rule, key), from the
        ``since``-th on (a reader that said the first ones asks for the rest)."""
        return [f"{self.rules[n - 1].name}: the attribute {k!r} ({c} event(s)) is no name "
                f"a query can give: rename = {{ {json.dumps(k)} = \"{clean_name(k)}\" }} "
                "or names = \"clean\""
                for (n, k), c in list(self.unnamable.items())[since:]]


def clean_name(key: str) -> str:
    """A payload key as an attribute name: every character but letters, digits and _
    becomes _, and a name that would start with a digit gets a _ before it."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", key)
    return "_" + name if not name or name[0].isdigit() else name


def _read_value(payload: bytes):
    """A bare value: JSON's number, string, true or false, else the text itself."""
    try:
        text = payload.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError("a value payload must be UTF-8 text") from None
    try:
        v = json.loads(text)
    except ValueError:
        return text
    if isinstance(v, (dict, list)):
        return v
    return text if isinstance(v, float) and not math.isfinite(v) else v


def _flatten(obj: dict, prefix: str, out: dict) -> None:
    for k, v in obj.items():
        if not isinstance(k, str):
            raise EventError(f"field names must be strings, got {k!r}"[:120])
        name = prefix + k
        if isinstance(v, dict):
            _flatten(v, name + "_", out)
        elif isinstance(v, list):
            _flatten({str(i): x for i, x in enumerate(v)}, name + "_", out)
        elif v is not None:
            if name in out:
                raise EventError(f"two fields flatten to the attribute {name!r}")
            out[name] = v


def _lookup(obj, path: tuple[str, ...]):
    for part in path:
        if isinstance(obj, dict) and part in obj:
            obj = obj[part]
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            raise EventError(f"no field {'.'.join(path)!r} in the payload")
    return obj


def _local_time(dt: datetime, zone, arrival_us: int | None) -> int:
    """A local time without an offset in ``zone``, in ms since the epoch. A time the
    zone's clocks pass twice (the hour repeated when summer time ends) is the pass
    nearer the record's arrival (a device sends its readings as it takes them; without
    an arrival, the first pass); a time they skip (the hour summer time leaves out)
    has the offset from before the change, as a clock not yet put forward shows it."""
    first = (dt.replace(tzinfo=zone, fold=0) - EPOCH) // timedelta(milliseconds=1)
    second = (dt.replace(tzinfo=zone, fold=1) - EPOCH) // timedelta(milliseconds=1)
    if second <= first or arrival_us is None:  # (the skipped hour: second < first)
        return first
    arrival = arrival_us // 1000
    return second if abs(second - arrival) < abs(first - arrival) else first


def _time(value, rule: TopicRule, arrival_us: int | None = None) -> int:
    """A payload's time in ms since the epoch, as the rule's ts_unit reads it
    (``arrival_us``: the record's arrival, which places a repeated local time)."""
    unit = rule.ts_unit
    name = ".".join(rule.ts)
    if isinstance(value, bool) or value is None:
        raise EventError(f"the time field {name!r} holds {value!r}, no time")
    if unit == "iso8601" or (unit is None and isinstance(value, str)):
        if not isinstance(value, str):
            raise EventError(f"the time field {name!r} holds {value!r}, no ISO 8601 text")
        try:
            dt = datetime.fromisoformat(value)
        except ValueError:
            raise EventError(f"the time field {name!r} holds {value[:60]!r}, no ISO 8601 "
                             "time") from None
        if dt.tzinfo is None:
            return _local_time(dt, rule.ts_zone, arrival_us)
        return (dt - EPOCH) // timedelta(milliseconds=1)
    if isinstance(value, str):
        try:
            value = int(value) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError:
            raise EventError(f"the time field {name!r} holds {value[:60]!r}, no number") \
                from None
    if not isinstance(value, (int, float)) or (isinstance(value, float)
                                               and not math.isfinite(value)):
        raise EventError(f"the time field {name!r} holds {value!r}, no time"[:200])
    unit = unit or "ms"
    if isinstance(value, int):
        if unit == "s":
            return value * 1000
        return value if unit == "ms" else value // (1000 if unit == "us" else 1_000_000)
    ms = value * TS_UNITS[unit]
    if abs(ms) >= 2.0**63:
        raise EventError(f"the time field {name!r} holds {value!r}, out of range")
    return round(ms)


class MappedColumns:
    """A map's records read by the ``map_decode`` kernel, for the topics whose rule it
    can read (``TopicMap.kernel_reading``); each new topic is resolved by the map once.
    ``decode(block, start, rows)`` reads records of a ``RecordBlock`` from ``start``
    into a ``ColumnDecoder``'s rows (the service); ``encode(...)`` writes their events
    as msgpack maps (``dqcep spark stream``'s rows). Both return where they stopped:
    the block's end, or a record the map must ``read`` in Python."""

    def __init__(self, topic_map: TopicMap, decoder, types: list[str], attrs: list[str],
                 type_code=None):
        from dqcep._kernels.map_decode import DETECT, JSON, VALUE, MapDecoder
        self.map, self.decoder = topic_map, decoder
        # an event type's code (-1: no query reads it); ``type_code``: codes given as
        # types come (a ``SharedReading``'s)
        self._type_code = {t: i for i, t in enumerate(types)}
        self.type_code = type_code or (lambda t: self._type_code.get(t, -1))
        self._column = {a: i for i, a in enumerate(attrs)}
        self.kernel = MapDecoder(decoder, self._column.get("events", -1))
        self._formats = {None: DETECT, "json": JSON, "value": VALUE}

    def decode(self, block, start: int, rows) -> int:
        from dqcep._kernels.map_decode import NEW_TOPIC
        while True:
            i, why = self.kernel.decode(block.data, block.first, block.spans, start, rows)
            if why != NEW_TOPIC:
                return i
            self._register(block, i)
            start = i

    def encode(self, block, start: int, out, at: int, ends, ids, ts) -> tuple[int, int, int]:
        """Records ``start``.. as msgpack event maps into ``out`` from byte ``at``
        (``MapDecoder.encode``): (where it stopped, why: DONE, PYTHON or FULL, the
        byte after the last event written)."""
        from dqcep._kernels.map_decode import NEW_TOPIC
        while True:
            i, why, at = self.kernel.encode(block.data, block.first, block.spans, start, out,
                                            at, ends, ids, ts)
            if why != NEW_TOPIC:
                return i, why, at
            self._register(block, i)
            start = i

    def _register(self, block, i: int) -> None:
        from dqcep.io.journal_tail import TOPIC, TOPIC_LEN
        t, n = block.spans[i, TOPIC], block.spans[i, TOPIC_LEN]
        topic = bytes(block.data[t:t + n])
        reading = self.map.kernel_reading(topic.decode("utf-8"))
        fmt = reading[1] if reading is not None else None
        if reading is None or fmt not in self._formats:
            self.kernel.register(topic, None, 0, [])
            return
        etype, _, levels = reading
        self.kernel.register(topic, self.type_code(etype), self._formats[fmt],
                             [(self._column.get(a, -1), a, v) for a, v in levels.items()],
                             etype)


class DecodedRun(NamedTuple):
    """Records ``start``..``stop - 1`` of a block as the compiled map read them
    (``rows``: the rows each gave, over the whole block) and their rows' columns (ts,
    id, type, val, kind) in a ``SharedReading``'s codes; read-only, shared."""
    stop: int
    rows: np.ndarray
    columns: tuple


class _Codes(list):
    """Names in the order they came, each coded by its place (``index``: name -> code)."""

    def __init__(self):
        super().__init__()
        self.index: dict[str, int] = {}

    def code(self, name: str) -> int:
        c = self.index.get(name)
        if c is None:
            c = self.index[name] = len(self)
            self.append(name)
        return c


class SharedReading:
    """The compiled map's reading of journal blocks, once a process for every consumer
    in it (a worker's query consumers each read every record, each in the codes of its
    own engine): a run of records is decoded once, into columns of this reading's own
    codes (event types as they come, the attributes its consumers read, its own string
    dictionary), and each consumer takes them in its codes (``Recoding``). The runs of
    the newest ``keep`` blocks are kept (``BlockCache`` shares the blocks)."""

    def __init__(self, topic_map: TopicMap, keep: int = 16):
        self.map, self.keep = topic_map, keep
        self.types = _Codes()   # event types as they come
        self.attrs = _Codes()   # the attributes its consumers read
        self.values = _Codes()  # the strings met (the decoder's dictionary: ``code``)
        self._mapped: MappedColumns | None = None
        self._runs: dict[tuple[int, int], tuple[object, DecodedRun]] = {}

    def code(self, value: str) -> int:
        """A string's code here (the decoder asks once per distinct string)."""
        return self.values.code(value)

    def read_attributes(self, attrs) -> None:
        """A consumer reads these attributes: new ones make the decoder again (and the
        runs read without them go)."""
        if any(a not in self.attrs.index for a in attrs):
            for a in attrs:
                self.attrs.code(a)
            self._mapped = None
            self._runs.clear()

    def read(self, block, start: int) -> DecodedRun:
        """Records ``start``.. of ``block`` as the compiled map reads them, up to the
        block's end or a record the map must read in Python (``DecodedRun.stop``)."""
        key = (block.first, start)
        hit = self._runs.get(key)
        if hit is not None and hit[0] is block:
            return hit[1]
        if self._mapped is None:
            from dqcep._kernels.msgpack_decode import ColumnDecoder
            self._mapped = MappedColumns(self.map, ColumnDecoder([], self.attrs, self),
                                         [], self.attrs, type_code=self.types.code)
        rows = np.zeros(block.count, np.int64)
        stop = self._mapped.decode(block, start, rows)
        columns = self._mapped.decoder.take()
        for a in (rows, *columns):
            a.flags.writeable = False
        run = DecodedRun(stop, rows, columns)
        self._runs.pop(key, None)
        self._runs[key] = (block, run)
        while len(self._runs) > self.keep:
            del self._runs[next(iter(self._runs))]
        return run


class Recoding:
    """A ``SharedReading``'s columns in one consumer's codes: the event types, attribute
    columns and string dictionary of its engine (made again with them: the decoder
    the consumer would read with, ``decoder``, tells when)."""

    def __init__(self, shared: SharedReading, decoder, types, attrs, dictionary):
        self.shared, self.decoder, self.dictionary = shared, decoder, dictionary
        shared.read_attributes(attrs)
        self._code = {t: i for i, t in enumerate(types)}
        self._types = np.zeros(0, np.int32)  # shared type code -> ours (-1: none)
        self._columns = np.array([shared.attrs.index[a] for a in attrs], np.int64)
        self._strings = np.zeros(0, np.int64)  # shared string code -> ours (-1: not yet)
        self._sweeps = dictionary.sweeps

    def columns(self, run: DecodedRun) -> tuple:
        """(ts, id, type, val, kind) of the run's rows in our codes."""
        from dqcep._kernels.map_decode import recode
        from dqcep._kernels.store import KINDS
        ts, ids, types, val, kind = run.columns
        shared = self.shared
        if len(self._types) < len(shared.types):
            self._types = np.array([self._code.get(t, -1) for t in shared.types], np.int32)
        if self.dictionary.sweeps != self._sweeps:  # codes freed: looked up again
            self._strings, self._sweeps = self._strings[:0], self.dictionary.sweeps
        while (out := recode(types, val, kind, self._types, self._columns,
                             self._strings)) is None:
            # strings new to us: coded as they come, as a decoder codes them
            codes = val[kind == KINDS["STR"]].astype(np.int64)
            if len(self._strings) <= codes.max():
                self._strings = np.concatenate(
                    (self._strings, np.full(codes.max() + 1 - len(self._strings), -1)))
            new, first = np.unique(codes[self._strings[codes] < 0], return_index=True)
            for c in new[np.argsort(first)].tolist():
                self._strings[c] = self.dictionary.code(shared.values[c])
        return (ts, ids, *out)
