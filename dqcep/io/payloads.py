"""MQTT payloads -> events, and a reason for everything that is not an event.

A payload is msgpack (default) or JSON (``fmt="json"``): one event map, or a
batch ``{"events": [<event map>, ...]}`` (spec section 1). ``decode_payload``
never raises on bad input: it returns the good events and one ``Rejected``
per bad payload or bad event of a batch, with the reason, for the dead-letter
sink. Limits keep a hostile payload from costing more than its size.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import msgpack

from dqcep.events import Event, EventError, batch_items, event_from_mapping
from dqcep.io.journal import Refused

MAX_PAYLOAD = 16 * 1024 * 1024


@dataclass(frozen=True)
class Rejected:
    reason: str
    index: int | None  # position in a batch, None for the whole payload

    def describe(self) -> str:
        return self.reason if self.index is None else f"event {self.index} of the batch: {self.reason}"


MAX_REASONS = 20  # distinct reasons named in one dead letter; the rest are counted


def _ranges(indexes: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``: positions in a batch, compactly."""
    out, start = [], None
    for i, x in enumerate(indexes):
        if start is None:
            start = x
        if i + 1 == len(indexes) or indexes[i + 1] != x + 1:
            out.append(str(x) if x == start else f"{start}-{x}")
            start = None
    return ",".join(out)


def dead_letter(offset: int, topic: str, payload: bytes | None, size: int,
                rejected: list[Rejected]) -> dict:
    """The one dead-letter record of a payload with rejections (docs/streaming.md).

    A payload is written at most once, base64-encoded, however many of its
    events are bad; the bad events of a batch are named by their positions,
    grouped by reason (at most MAX_REASONS reasons, each at most a line long),
    so a dead letter grows with the payload's size, not with its bad events
    times its size. ``payload=None``: a payload not kept (larger than the
    limit); its ``size`` is named instead.
    """
    record: dict = {"offset": offset, "topic": topic}
    whole = [r for r in rejected if r.index is None]
    if whole:
        record["reason"] = whole[0].reason
    else:
        by_reason: dict[str, list[int]] = {}
        for r in rejected:
            by_reason.setdefault(r.reason, []).append(r.index)
        groups = list(by_reason.items())
        if len(groups) > MAX_REASONS:
            rest = sorted(i for _, idx in groups[MAX_REASONS - 1:] for i in idx)
            groups = groups[:MAX_REASONS - 1] + [
                (f"{len(groups) - MAX_REASONS + 1} other reasons", rest)]
        record["reason"] = f"{len(rejected)} event(s) of the batch rejected"
        record["rejected"] = [{"events": _ranges(idx), "reason": reason}
                              for reason, idx in groups]
    if payload is None:
        record["size"] = size
    else:
        record["payload"] = base64.b64encode(payload).decode()
    return record


def _decode(payload: bytes, fmt: str):
    if fmt == "json":
        return json.loads(payload.decode("utf-8"),
                          parse_constant=lambda c: (_ for _ in ()).throw(
                              ValueError(f"{c} is not a valid number")))
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


def decode_payload(payload: bytes | Refused,
                   fmt: str = "msgpack") -> tuple[list[Event], list[Rejected]]:
    if isinstance(payload, Refused):
        return [], [Rejected(f"payload of {payload.size} bytes exceeds {MAX_PAYLOAD}; refused "
                             "at ingest, only its size was kept", None)]
    if len(payload) > MAX_PAYLOAD:
        return [], [Rejected(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}", None)]
    try:
        obj = _decode(payload, fmt)
    except RecursionError:
        return [], [Rejected(f"{fmt} nested too deeply", None)]
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError, UnicodeDecodeError) as err:
        return [], [Rejected(f"not valid {fmt}: {err}", None)]
    try:
        batch = batch_items(obj)
    except EventError as err:
        return [], [Rejected(str(err), None)]
    if batch is not None:
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
