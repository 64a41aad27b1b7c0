"""MQTT payloads -> events, and a reason for everything that is not an event.

A payload is msgpack (default) or JSON (``fmt="json"``): one event map, or a
batch ``{"events": [<event map>, ...]}`` (spec section 1). ``decode_payload``
never raises on bad input: it returns the good events and one ``Rejected``
per bad payload or bad event of a batch, with the reason, for the dead-letter
sink. Limits keep a hostile payload from costing more than its size.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import msgpack

from dqcep.events import Event, EventError, event_from_mapping

MAX_PAYLOAD = 16 * 1024 * 1024


@dataclass(frozen=True)
class Rejected:
    reason: str
    index: int | None  # position in a batch, None for the whole payload

    def describe(self) -> str:
        return self.reason if self.index is None else f"event {self.index} of the batch: {self.reason}"


def _decode(payload: bytes, fmt: str):
    if fmt == "json":
        return json.loads(payload.decode("utf-8"),
                          parse_constant=lambda c: (_ for _ in ()).throw(
                              ValueError(f"{c} is not a valid number")))
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


def decode_payload(payload: bytes, fmt: str = "msgpack") -> tuple[list[Event], list[Rejected]]:
    if len(payload) > MAX_PAYLOAD:
        return [], [Rejected(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}", None)]
    try:
        obj = _decode(payload, fmt)
    except RecursionError:
        return [], [Rejected(f"{fmt} nested too deeply", None)]
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError, UnicodeDecodeError) as err:
        return [], [Rejected(f"not valid {fmt}: {err}", None)]
    if isinstance(obj, dict) and "events" in obj and "type" not in obj:
        batch = obj["events"]
        if not isinstance(batch, list):
            return [], [Rejected("'events' of a batch must be a list", None)]
        events, rejected = [], []
        for i, item in enumerate(batch):
            try:
                events.append(event_from_mapping(item))
            except EventError as err:
                rejected.append(Rejected(str(err), i))
        return events, rejected
    try:
        return [event_from_mapping(obj)], []
    except EventError as err:
        return [], [Rejected(str(err), None)]
