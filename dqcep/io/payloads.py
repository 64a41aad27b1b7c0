"""MQTT payloads -> events, and a reason for everything that is not an event.

A payload is msgpack or JSON: one event map, or a batch ``{"events": [<event
map>, ...]}`` (spec section 1). Without a format (``fmt=None``) each payload is
read as what it is (``detect_format``); a payload that fails to decode as the
format given, and looks like the other one, says which flag to use. ``decode_payload``
never raises on bad input: it returns the good events and one ``Rejected``
per bad payload or bad event of a batch, with the reason, for the dead-letter
sink. Limits keep a hostile payload from costing more than its size.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import msgpack

from dqcep.core.events import Event, EventError, batch_items, event_from_mapping
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

    A payload is written at most once, however many of its events are bad: as
    text when it is UTF-8 (``"encoding": "utf-8"``: what a device sent is read as
    it was), else base64 (``"encoding": "base64"``); the bad events of a batch are named by their positions,
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
        try:
            record["payload"], record["encoding"] = payload.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            record["payload"] = base64.b64encode(payload).decode()
            record["encoding"] = "base64"
    return record


# a msgpack map or array starts with one of these bytes (fixmap, fixarray, map16/32,
# array16/32); a JSON object or array with { or [ after white space, which msgpack
# reads as small integers: the two cannot be confused
_MSGPACK_CONTAINER = frozenset(range(0x80, 0xA0)) | {0xDC, 0xDD, 0xDE, 0xDF}
_JSON_SPACE = b" \t\r\n"


def detect_format(payload: bytes) -> str | None:
    """"json" for a JSON object or array, "msgpack" for a msgpack map or array, else
    None (the one rule for every reader of payloads without a format)."""
    if not payload:
        return None
    if payload[0] in _MSGPACK_CONTAINER:
        return "msgpack"
    start = payload.lstrip(_JSON_SPACE)[:1]
    return "json" if start in (b"{", b"[") else None


def _reject_constant(c):
    raise ValueError(f"{c} is not a valid number")


def decode_as(payload: bytes, fmt: str):
    """The object a payload holds in ``fmt`` ("json" or "msgpack"); ValueError says
    why it holds none."""
    try:
        if fmt == "json":
            return json.loads(payload.decode("utf-8"), parse_constant=_reject_constant)
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except RecursionError:
        raise ValueError(f"{fmt} nested too deeply") from None
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError, UnicodeDecodeError) as err:
        raise ValueError(f"not valid {fmt}: {err}") from None


def _undecodable(payload: bytes, fmt: str | None) -> str:
    """Why a payload that is no JSON or msgpack container is refused, with the flag."""
    if fmt is None:
        head = payload[:24]
        return (f"neither a JSON object or array nor a msgpack map or array (starts "
                f"{head!r}); a bare value needs a [[topic]] rule (--map)")
    other = detect_format(payload)
    return f"the payload looks like {other}: leave --format out (payloads are " \
        f"detected) or pass --format {other}" if other not in (None, fmt) else ""


def decode_payload(payload: bytes | Refused,
                   fmt: str | None = None) -> tuple[list[Event], list[Rejected]]:
    if isinstance(payload, Refused):
        return [], [Rejected(f"payload of {payload.size} bytes exceeds {MAX_PAYLOAD}; refused "
                             "at ingest, only its size was kept", None)]
    if len(payload) > MAX_PAYLOAD:
        return [], [Rejected(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}", None)]
    kind = fmt or detect_format(payload)
    if kind is None:
        return [], [Rejected(_undecodable(payload, None), None)]
    try:
        obj = decode_as(payload, kind)
    except ValueError as err:
        hint = _undecodable(payload, kind) if fmt else ""
        return [], [Rejected(f"{err}; {hint}" if hint else str(err), None)]
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
