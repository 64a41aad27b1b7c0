"""Event files -> the engine's input columns, in chunks: the fast path of ``dqcep run``.

``read_columns`` yields, in arrival order, pieces an engine's ``process`` takes:

- a tuple ``(ts, id, type, val, kind)`` of numpy arrays in the engine's column
  layout (``dqcep.runtime.EventColumns``), decoded by a kernel with no Python
  object per event;
- a list of ``Event`` for a record the fast path does not take: the validator
  (``dqcep.events.event_from_mapping``, through ``readers.msgpack_record``)
  reads that record alone, and its bad events go to ``on_error`` (or are
  raised) with the same position and reason ``read_events`` gives.

The kernel accepts only records that obey every rule of the validator (a
hypothesis test holds the two paths to the same events, errors and matches),
so which path a record took changes nothing. Formats without a fast path yet
come as lists of ``Event`` in chunks, from ``read_events``.
"""
from __future__ import annotations

import sys
from typing import IO, Callable, Iterator

import msgpack

from dqcep._kernels.msgpack_decode import record_end
from dqcep.errors import UserError
from dqcep.io.readers import (EventInputError, format_for, msgpack_record, msgpack_stream,
                              read_events)

ErrorHandler = Callable[[EventInputError], None] | None


def read_columns(path: str, fmt: str | None, decoder, on_error: ErrorHandler = None,
                 chunk_rows: int = 65_536) -> Iterator:
    """Pieces of about ``chunk_rows`` events (whole msgpack records) of the file (stdin for ``-``), decoded by
    ``decoder`` (an engine's ``column_decoder()``) where the format has a fast path;
    ``decoder=None``: lists of ``Event`` only (the reference matcher, ``--returns``)."""
    fmt = format_for(path, fmt)
    if fmt != "msgpack" or decoder is None:
        yield from _events_in_chunks(read_events(path, fmt, on_error=on_error), on_error,
                                     chunk_rows)
        return
    source = "<stdin>" if path == "-" else path
    try:
        stream = sys.stdin.buffer if path == "-" else open(path, "rb")
    except OSError as err:
        raise UserError(f"cannot read event file {path}: {err.strerror}") from None
    with stream:
        yield from _msgpack_columns(stream, source, decoder, on_error, chunk_rows)


BLOCK_BYTES = 1 << 24  # read at a time; a longer record grows the block


def _report(item: EventInputError, on_error: ErrorHandler) -> None:
    if on_error is None:
        raise item
    on_error(item)


def _msgpack_columns(stream: IO[bytes], source: str, decoder, on_error: ErrorHandler,
                     chunk_rows: int) -> Iterator:
    buf, pos, base, record, eof = b"", 0, 0, 0, False   # buf[0] is byte ``base`` of the file
    while True:
        if not eof and len(buf) - pos < BLOCK_BYTES:
            more = stream.read(max(BLOCK_BYTES, len(buf) - pos))
            eof = not more
            buf, base, pos = buf[pos:] + more, base + pos, 0
        if pos >= len(buf):
            break
        pos, decoded, stuck = decoder.decode_stream(buf, pos, chunk_rows)
        record += decoded
        if decoder.rows >= chunk_rows:
            yield decoder.take()
        if not stuck:
            continue
        end = record_end(buf, pos)
        if end < 0 and not eof:  # the record goes on in the next block
            more = stream.read(max(BLOCK_BYTES, len(buf) - pos))
            eof = not more
            buf, base, pos = buf[pos:] + more, base + pos, 0
            continue
        if decoder.rows:
            yield decoder.take()
        # the record alone to the validator; a broken stream goes to the stream reader
        # from here, which raises its error (record number, byte) as it always did
        try:
            if end < 0:
                raise ValueError("not one whole msgpack object")
            obj = msgpack.unpackb(buf[pos:end], raw=False, strict_map_key=False)
        except (ValueError, TypeError, msgpack.StackError, msgpack.FormatError):
            yield from _events_in_chunks(
                msgpack_stream(_Chain(buf[pos:], stream), source, base + pos, record),
                on_error, chunk_rows)
            return
        record += 1
        events = []
        for item in msgpack_record(obj, source, f"record {record} (byte {base + pos})"):
            if isinstance(item, EventInputError):
                _report(item, on_error)
            else:
                events.append(item[1])
        if events:
            yield events
        pos = end
    if decoder.rows:
        yield decoder.take()


def _events_in_chunks(items, on_error: ErrorHandler, chunk_rows: int) -> Iterator:
    chunk = []
    for item in items:
        if isinstance(item, EventInputError):
            _report(item, on_error)
            continue
        chunk.append(item[1])
        if len(chunk) >= chunk_rows:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Chain:
    """``head`` and then the rest of ``stream``, as one stream msgpack.Unpacker reads."""

    def __init__(self, head: bytes, stream: IO[bytes]):
        self.head, self.stream = head, stream

    def read(self, size: int = -1) -> bytes:
        if not self.head:
            return self.stream.read(size)
        out = self.head if size < 0 else self.head[:size]
        self.head = self.head[len(out):]
        return out
