"""Events -> MQTT messages as devices send them (``dqcep publish``, ``dqcep generate``).

A topic template names each event's topic from its fields (``sensors/{room}/{type}``;
``{type}``, ``{id}``, ``{ts}`` and any attribute); a payload shape says what the
message holds:

- ``event``: the whole event map (``id``, ``type``, ``ts`` and the attributes): the
  contract without a map;
- ``object``: the attributes, without those the topic carries, as a device's state
  object (``{"value": 23.1}``, ``{"temperature": 21.5, "humidity": 40}``); with
  ``time_field`` the event's time too, in ``time_unit`` (a device with a clock);
- ``value``: one attribute's bare value (``23.1``), as ESPHome publishes a state.

Payloads are JSON unless ``encoding="msgpack"`` (``value`` is always text). What a
``--map`` rule reads back from these messages is the event again, but for its id
(and its time when no time was sent): the docs' examples and the tests publish this
way.
"""
from __future__ import annotations

import json
import string
import time
from dataclasses import dataclass

import msgpack

from dqcep.core.errors import UserError
from dqcep.core.events import Event
from dqcep.io.mqtt import topic_problem

SHAPES = ("event", "object", "value")
TIME_UNITS = {"s": 1000, "ms": 1}
EVENT_FIELDS = ("type", "id", "ts")


class TopicTemplate:
    """``sensors/{room}/{type}`` -> a topic per event; ``{{`` and ``}}`` are braces. A
    value with ``/`` fills several levels (``{device}`` = ``site1/room2/t-1``)."""

    def __init__(self, text: str):
        try:
            parts = list(string.Formatter().parse(text))
        except ValueError as err:
            raise UserError(f"topic template {text!r}: {err}") from None
        self.text = text
        self.fields = []
        for _, name, spec, conv in parts:
            if name is None:
                continue
            if not name or spec or conv or not name.isidentifier():
                raise UserError(f"topic template {text!r}: {{{name}}} is no field name (write "
                                "{type}, {room}: an event field or attribute)")
            self.fields.append(name)
        problem = topic_problem(text.format(**{f: "x" for f in self.fields}), subscribe=False)
        if problem:
            raise UserError(f"topic template {text!r}: {problem}")

    def topic(self, event: Event, where: str) -> str:
        values = {}
        for name in self.fields:
            try:
                value = event.value(name) if name != "type" else event.type
            except KeyError:
                raise UserError(f"{where}: the event (id {event.id}) has no {name!r} for the "
                                f"topic template {self.text!r}") from None
            text = str(value).lower() if isinstance(value, bool) else str(value)
            if not text or "+" in text or "#" in text or "\0" in text:
                raise UserError(f"{where}: {name} = {text!r} cannot be in a topic "
                                f"({self.text!r}): empty, or holds + # or NUL")
            values[name] = text
        topic = self.text.format(**values)
        problem = topic_problem(topic, subscribe=False) if len(topic) > 1000 or \
            topic.startswith("$") else None  # the rest is the template's, checked
        if problem:
            raise UserError(f"{where}: the event's topic {topic[:60]!r}...: {problem}"
                            if len(topic) > 60 else f"{where}: topic {topic!r}: {problem}")
        return topic


@dataclass(frozen=True)
class PayloadShape:
    shape: str = "event"
    encoding: str = "json"               # json | msgpack
    value_attr: str = "value"            # the attribute a ``value`` payload holds
    time_field: str | None = None        # ``object``: the field the time goes in
    time_unit: str = "ms"                # s (a float) | ms (an integer)
    omit: tuple[str, ...] = ()           # attributes the topic carries

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise UserError(f"--payload {self.shape!r} is not one of {', '.join(SHAPES)}")
        if self.encoding not in ("json", "msgpack"):
            raise UserError("--encoding must be json or msgpack")
        if self.time_unit not in TIME_UNITS:
            raise UserError(f"time unit {self.time_unit!r} is not one of s, ms")
        if self.time_field is not None and self.shape != "object":
            raise UserError("--time puts the event's time into an object payload "
                            "(--payload object)")

    def payload(self, event: Event, where: str) -> bytes:
        if self.shape == "value":
            try:
                value = event.attrs[self.value_attr]
            except KeyError:
                raise UserError(f"{where}: the event (id {event.id}) has no {self.value_attr!r} "
                                "for a value payload (--value-attr)") from None
            return json.dumps(value).encode() if not isinstance(value, str) else value.encode()
        if self.shape == "event":
            obj = event.as_mapping()
        else:
            obj = {k: v for k, v in event.attrs.items() if k not in self.omit}
            if self.time_field is not None:
                obj[self.time_field] = event.ts if self.time_unit == "ms" else event.ts / 1000
        if self.encoding == "msgpack":
            return msgpack.packb(obj, use_bin_type=True)
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def messages(events, template: TopicTemplate, shape: PayloadShape):
    """(topic, payload) per (where, event)."""
    for where, event in events:
        yield template.topic(event, where), shape.payload(event, where)


class Pacer:
    """Sleeps so that events go out at ``rate`` per second (None: no pacing), counted
    from the first ``wait``: the time to connect or open a file is no debt to catch
    up in a burst."""

    def __init__(self, rate: float | None):
        if rate is not None and rate <= 0:
            raise UserError(f"--rate must be > 0, got {rate}")
        self.rate, self.start, self.sent = rate, None, 0

    def wait(self, n: int) -> None:
        """Before sending ``n`` events: until those sent before had their time."""
        if self.start is None:
            self.start = time.monotonic()
        if self.rate:
            ahead = self.sent / self.rate - (time.monotonic() - self.start)
            if ahead > 0:
                time.sleep(ahead)
        self.sent += n


def add_shape_arguments(p, shapes: tuple[str, ...], default: str) -> None:
    """The options that shape messages, for ``dqcep publish`` and ``dqcep generate``."""
    group = p.add_argument_group(
        "message shapes (MQTT; the URL's topic may be a template: sensors/{room}/{type})")
    group.add_argument("--payload", choices=shapes, default=default,
                       help="what a message holds: " + ", ".join(
                           {"batch": "batch: msgpack batches {\"events\": [...]}",
                            "event": "event: one event map",
                            "object": "object: the attributes the topic does not carry "
                                      "(a device's state object)",
                            "value": "value: one attribute's bare value"}[s] for s in shapes)
                       + f" (default {default})")
    group.add_argument("--encoding", choices=("json", "msgpack"), default="json",
                       help="event and object payloads: JSON (default) or msgpack")
    group.add_argument("--value-attr", default="value", metavar="ATTR",
                       help="the attribute a value payload holds (default value)")
    group.add_argument("--time", metavar="FIELD[:s|ms]",
                       help="object payloads: put the event's time in FIELD, in seconds or "
                       "milliseconds (default ms); without it the payload has no time (a "
                       "device without a clock: the service stamps the arrival)")


def shape_from_args(args, template: TopicTemplate) -> PayloadShape:
    field_name, unit = (args.time.partition(":")[::2] if args.time else (None, ""))
    return PayloadShape(args.payload, args.encoding, args.value_attr, field_name or None,
                        unit or "ms", tuple(f for f in template.fields
                                            if f not in EVENT_FIELDS))
