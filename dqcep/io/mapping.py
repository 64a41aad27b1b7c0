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
RULE_KEYS = ("filter", "levels", "format", "ts", "ts_unit", "ts_zone", "type", "rename", "id")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
EVENT_FIELDS = ("id", "ts", "type")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
TOPIC_CACHE = 1 << 16  # topics whose rule and level attributes are kept


def derived_id(offset: int, index: int) -> int:
    """The id of the ``index``-th event of the payload at journal offset ``offset``."""
    return (offset << ID_SHIFT) | index


def device_id(topic: str, number: int) -> int:
    """The id of the reading a device numbered ``number`` on ``topic``: 64 bits of
    BLAKE2b over both (the same in every process and run; two readings collide with
    probability 2**-62) in 2**62 .. 2**63 - 1, above ``derived_id``'s (below 2**62 up
    to journal offset 2**38)."""
    digest = hashlib.blake2b(f"{topic}\0{number}".encode("utf-8", "surrogatepass"),
                             digest_size=8).digest()
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

    @property
    def name(self) -> str:
        return f"rule {self.number} ({self.filter})"


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
        seen = set()
        for name in spec:
            if name == "_":
                continue
            if not NAME.match(name) or name in ("id", "ts"):
                raise UserError(f"{where}: levels: {name!r} is no attribute name (letters, "
                                "digits and _, not id or ts; _ skips a level)")
            if name in seen:
                raise UserError(f"{where}: levels names {name!r} twice")
            seen.add(name)
        levels = tuple(None if n == "_" else n for n in spec)
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
    if not isinstance(rename, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in rename.items()):
        raise UserError(f"{where}: rename must be a table of field = \"attribute\"")
    for target in rename.values():
        if not NAME.match(target) or target in EVENT_FIELDS:
            raise UserError(f"{where}: rename: {target!r} is no attribute name (letters, "
                            "digits and _, not id, ts or type)")
    return TopicRule(number, flt, levels, fmt, None if ts is None else _path(ts), unit, zone,
                     text("type"), {k.replace(".", "_"): v for k, v in rename.items()},
                     None if raw.get("id") is None else _path(text("id")))


class TopicMap:
    """The rules of a map file; ``read`` turns a journal record into events."""

    def __init__(self, rules: list[TopicRule], source: str = "the map", text: str = ""):
        self.rules = rules
        self.source = source
        self.text = text  # what it was parsed from (handed to Spark's journal source)
        self._filters = [r.filter.split("/") for r in rules]
        self._topics: dict[str, tuple] = {}

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
    def _for_topic(self, topic: str):
        """(rule, attributes from the topic's levels, type from a level) or None."""
        hit = self._topics.get(topic)
        if hit is not None:
            return hit
        parts = topic.split("/")
        hit = (None, {}, None)
        for rule, levels in zip(self.rules, self._filters):
            if filter_matches(levels, parts):
                attrs = {name: parts[i] for i, name in enumerate(rule.levels)
                         if name is not None and i < len(parts)}
                hit = (rule, attrs, attrs.pop("type", None))
                break
        if len(self._topics) >= TOPIC_CACHE:
            self._topics.clear()
        self._topics[topic] = hit
        return hit

    def kernel_reading(self, topic: str):
        """How the kernel (``MappedColumns``) may read the records of ``topic``: (event
        type, format, {attribute: value} from the topic's levels), or None when they are
        for ``read``: no rule matches, or the rule reads a time, an id or renames, or
        the type would come from the payload."""
        rule, level_attrs, level_type = self._for_topic(topic)
        if rule is None or rule.ts is not None or rule.id is not None or rule.rename:
            return None
        etype = rule.type or level_type
        if not etype:
            return None
        return etype, rule.format, level_attrs

    def read(self, record: Record) -> tuple[list[Event], list[Rejected]]:
        """The events of one journal record, and why any part of it is no event."""
        rule, level_attrs, level_type = self._for_topic(record.topic)
        payload = record.payload
        if rule is None:
            return [], [Rejected(f"no [[topic]] rule of {self.source} matches the topic "
                                 f"{record.topic!r}", None)]
        if isinstance(payload, Refused):
            return [], [Rejected(f"payload of {payload.size} bytes exceeds {MAX_PAYLOAD}; "
                                 "refused at ingest, only its size was kept", None)]
        if len(payload) > MAX_PAYLOAD:
            return [], [Rejected(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}", None)]
        fmt = rule.format or detect_format(payload) or "value"
        try:
            obj = _read_value(payload) if fmt == "value" else decode_as(payload, fmt)
        except ValueError as err:
            return [], [Rejected(f"{rule.name}: {err}", None)]
        items = obj if isinstance(obj, list) else [obj]
        if len(items) > MAX_EVENTS:
            return [], [Rejected(f"{rule.name}: {len(items)} events in one payload; at most "
                                 f"{MAX_EVENTS}", None)]
        arrival = record.arrival_us
        events, rejected = [], []
        single = not isinstance(obj, list)
        for i, item in enumerate(items):
            try:
                events.append(self._event(rule, item, record.topic, record.offset, i, arrival,
                                          level_attrs, level_type))
            except (EventError, RecursionError) as err:
                why = "nested too deeply" if isinstance(err, RecursionError) else str(err)
                rejected.append(Rejected(f"{rule.name}: {why}", None if single else i))
        return events, rejected

    def _event(self, rule: TopicRule, item, topic: str, offset: int, index: int,
               arrival: int | None,
               level_attrs: dict, level_type: str | None) -> Event:
        if isinstance(item, dict):
            flat: dict = {}
            _flatten(item, "", flat)
        elif isinstance(item, list):
            raise EventError("an array inside the payload's array is no event")
        else:
            flat = {"value": item}
        if rule.ts is not None:
            ts = _time(_lookup(item, rule.ts), rule, arrival)
            flat.pop("_".join(rule.ts), None)
        elif arrival is None:
            raise EventError("the journal record has no arrival time (written before journal "
                             "format 2); name the payload's time field (ts)")
        else:
            ts = arrival // 1000
        if rule.id is not None:
            event_id = _lookup(item, rule.id)
            flat.pop("_".join(rule.id), None)
            if not isinstance(event_id, int) or isinstance(event_id, bool):
                raise EventError(f"the id field {'.'.join(rule.id)!r} must hold an integer, "
                                 f"got {event_id!r}"[:200])
            event_id = device_id(topic, event_id)
        else:
            event_id = derived_id(offset, index)
        for src, dst in rule.rename.items():
            if src in flat:
                flat[dst] = flat.pop(src)
        payload_type = flat.pop("type", None)
        flat.pop("id", None)
        flat.pop("ts", None)
        etype = rule.type or level_type or payload_type
        if etype is None:
            raise EventError("no event type: the rule names none (type = ...), nor does the "
                             "topic (a `type` level) or the payload (a field `type`)")
        flat.update(level_attrs)
        flat["id"], flat["ts"], flat["type"] = event_id, ts, etype
        return event_from_mapping(flat)


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
