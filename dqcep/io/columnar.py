"""Event files -> the engine's input columns, in chunks: the fast path of ``dqcep run``.

``read_columns`` yields, in arrival order, pieces an engine's ``process`` takes:

- a tuple ``(ts, id, type, val, kind)`` of numpy arrays in the engine's column
  layout (``dqcep.runtime.EventColumns``), decoded by a kernel with no Python
  object per event;
- a list of ``Event`` for a record the fast path does not take: the validator
  (``dqcep.core.events.event_from_mapping``, through ``readers.msgpack_record``)
  reads that record alone, and its bad events go to ``on_error`` (or are
  raised) with the same position and reason ``read_events`` gives.

The kernel accepts only records that obey every rule of the validator (a
hypothesis test holds the two paths to the same events, errors and matches),
so which path a record took changes nothing. Standard input in CSV or Parquet
comes as lists of ``Event`` in chunks, from ``read_events``.
"""
from __future__ import annotations

import functools
import os
import re
import sys
from typing import IO, Callable, Iterator, NamedTuple

import msgpack
import numpy as np

from dqcep._kernels.msgpack_decode import is_utf8, record_end
from dqcep.core.errors import UserError
from dqcep.core.events import TS_LIMIT
from dqcep.io.arrow_columns import (KIND_BOOL, KIND_NUM, KIND_STR,
                                    arrow_columns, string_codes, type_codes)
from dqcep.io.readers import (CSV_BOOL, CSV_DEC, CSV_INT, CSV_TRUE, PARQUET_BATCH_ROWS,
                              EventInputError,
                              csv_header, csv_rows, csv_text_attrs, format_for, jsonl_lines,
                              msgpack_record,
                              msgpack_stream, parquet_batches, parquet_rows, read_events)

ErrorHandler = Callable[[EventInputError], None] | None


class Sourced(NamedTuple):
    """A fast-path piece with the way back to its records: ``columns`` as
    ``read_columns`` yields them, and ``records()`` the piece's (position, Event) in
    the same order, read again from the piece's bytes by the validator (for the few
    events a caller must show whole, e.g. late ones)."""

    columns: tuple
    records: Callable[[], list]


def read_columns(path: str, fmt: str | None, engine, on_error: ErrorHandler = None,
                 chunk_rows: int = 65_536, progress: Callable[[int], None] | None = None,
                 texts: dict[str, frozenset[str]] | None = None) -> Iterator:
    """Pieces of about ``chunk_rows`` events (whole msgpack records, Parquet record
    batches) of the file (stdin for ``-``), in the column layout of ``engine`` (its
    ``column_decoder()``, ``types``, ``attrs``, ``dictionary``) where the format has
    a fast path; ``engine=None``: lists of ``Event`` only (the reference matcher,
    ``--returns``). ``progress(bytes)`` hears how far the fast paths have read.
    ``texts``: the CSV cells read as text (``readers.csv_text_attrs``; default: the
    engine's declared schemas')."""
    fmt = format_for(path, fmt)
    progress = progress or (lambda _: None)
    if texts is None:  # (an engine-like layout may declare no schema)
        texts = csv_text_attrs(getattr(engine, "schemas", ())) if engine is not None else {}
    if fmt == "parquet" and engine is not None and path != "-":
        yield from _parquet_columns(path, engine, on_error, progress)
        return
    if fmt == "csv" and engine is not None and path != "-" and not _small(path):
        yield from _csv_columns(path, engine, on_error, progress, chunk_rows, texts=texts)
        return
    if fmt not in ("msgpack", "jsonl") or engine is None:
        yield from _events_in_chunks(read_events(path, fmt, on_error=on_error, texts=texts),
                                     on_error, chunk_rows)
        return
    source = "<stdin>" if path == "-" else path
    stream = sys.stdin.buffer if path == "-" else _open(path)
    with stream:
        counted = _Counted(stream, progress)
        if fmt == "jsonl":
            yield from _jsonl_columns(counted, source, engine, on_error, chunk_rows)
        else:
            yield from _msgpack_columns(counted, source, engine.column_decoder(), on_error,
                                        chunk_rows)


def read_sourced(path: str, fmt: str, engine, on_error: ErrorHandler = None,
                 chunk_rows: int = 65_536, row_groups: tuple[int, int] | None = None,
                 first_row: int = 0) -> Iterator:
    """``read_columns`` of a JSON Lines, CSV or Parquet file, each piece with its
    positions: a ``Sourced`` for a fast-path piece, else a list of (position, Event).
    The same pieces, in the same order, as ``read_columns`` (one set of rules).
    ``row_groups``: a Parquet file's [first, end) row groups alone, whose first row is
    row ``first_row`` of the file (positions stay the file's)."""
    progress = lambda _: None  # noqa: E731
    if fmt == "parquet":
        yield from _parquet_columns(path, engine, on_error, progress, sourced=True,
                                    row_groups=row_groups, first_row=first_row)
    elif fmt == "csv":
        yield from _csv_columns(path, engine, on_error, progress, chunk_rows, sourced=True,
                                texts=csv_text_attrs(getattr(engine, "schemas", ())))
    elif fmt == "jsonl":
        with _open(path) as stream:
            yield from _jsonl_columns(stream, path, engine, on_error, chunk_rows, sourced=True)
    else:
        raise ValueError(f"no sourced fast path for {fmt}")


def _open(path: str) -> IO[bytes]:
    try:
        return open(path, "rb")
    except OSError as err:
        raise UserError(f"cannot read event file {path}: {err.strerror}") from None


BLOCK_BYTES = 1 << 24  # msgpack read at a time; a longer record grows the block


def _report(item: EventInputError, on_error: ErrorHandler) -> None:
    if on_error is None:
        raise item
    on_error(item)


def _msgpack_columns(stream: IO[bytes], source: str, decoder, on_error: ErrorHandler,
                     chunk_rows: int) -> Iterator:
    buf, pos, base, record, eof = b"", 0, 0, 0, False   # buf[0] is byte ``base`` of the file

    def refill() -> None:
        """The unread rest of the block and the next block; read only when the block
        is used up or a record runs past its end (each byte is copied once or twice)."""
        nonlocal buf, pos, base, eof
        more = stream.read(max(BLOCK_BYTES, len(buf) - pos))
        eof = not more
        buf, base, pos = buf[pos:] + more, base + pos, 0

    while True:
        if pos >= len(buf):
            if eof:
                break
            refill()
            continue
        pos, decoded, stuck = decoder.decode_stream(buf, pos, chunk_rows)
        record += decoded
        if decoder.rows >= chunk_rows:
            yield decoder.take()
        if not stuck:
            continue
        end = record_end(buf, pos)
        if end < 0 and not eof:  # the record goes on in the next block
            refill()
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


def _events_in_chunks(items, on_error: ErrorHandler, chunk_rows: int,
                      sourced: bool = False) -> Iterator:
    """Lists of the items' events (``sourced``: of (position, Event))."""
    chunk = []
    for item in items:
        if isinstance(item, EventInputError):
            _report(item, on_error)
            continue
        chunk.append(item if sourced else item[1])
        if len(chunk) >= chunk_rows:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Counted:
    """A binary stream that tells ``progress`` how many bytes have been read."""

    def __init__(self, stream: IO[bytes], progress: Callable[[int], None]):
        self.stream, self.progress, self.done = stream, progress, 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.done += len(data)
        self.progress(self.done)
        return data


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


def _parquet_columns(path: str, engine, on_error: ErrorHandler, progress,
                     sourced: bool = False, row_groups: tuple[int, int] | None = None,
                     first_row: int = 0) -> Iterator:
    """Record batches of a Parquet file (or of its ``row_groups``, from row
    ``first_row`` on) as engine columns, by Arrow compute; a batch that breaks a rule of
    the validator goes to it whole (``parquet_rows``)."""
    import pyarrow.parquet as pq  # a plain dependency

    source, row = path, first_row
    groups = None if row_groups is None else list(range(*row_groups))
    try:
        with open(path, "rb") as f:
            parquet = pq.ParquetFile(f)
            size, total = os.fstat(f.fileno()).st_size, max(parquet.metadata.num_rows, 1)
            for batch in parquet_batches(parquet, groups, PARQUET_BATCH_ROWS):
                progress(size * (row + batch.num_rows) // total)
                cols = arrow_columns(batch, engine)
                if cols is not None:
                    yield Sourced(cols, _records(parquet_rows, batch, source, row)) \
                        if sourced else cols
                else:
                    yield from _events_in_chunks(parquet_rows(batch, source, row), on_error,
                                                 PARQUET_BATCH_ROWS, sourced)
                row += batch.num_rows
    except OSError as err:
        if err.filename is not None:
            raise UserError(f"cannot read event file {path}: {err.strerror}") from None
        raise EventInputError(source, f"row {row + 1}", f"invalid Parquet: {err}") from None
    except ValueError as err:  # pyarrow's ArrowInvalid
        raise EventInputError(source, f"row {row + 1}", f"invalid Parquet: {err}") from None


JSON_BLOCK_BYTES = 1 << 22  # JSON Lines read at a time, cut after the last whole line
# Text smaller than this goes to the validator, not to pyarrow: importing pyarrow's
# readers (and the pandas its conversions load) takes ~0.15 s, which the validator's
# ~5 us per line only reaches at ~30,000 lines (a `dqcep run` on a small file is mostly start-up)
FAST_PATH_MIN_BYTES = 1 << 16


def _small(path: str) -> bool:
    """Is the file at ``path`` smaller than the fast paths' threshold?"""
    try:
        return os.path.getsize(path) < FAST_PATH_MIN_BYTES
    except OSError:  # the reader says what is wrong with it
        return False
# The fast path leaves to the validator text that Python's json and pyarrow's reader
# might take differently: tabs and control bytes, a BOM, blank lines, a lone CR, and a
# line that does not open an object (pyarrow 26 crashes on a block of "null" lines).
# Bytes are tested with translate (deleting all others), not a regex: 50x faster.
_CONTROL = bytes(range(0x0a)) + b"\x0b\x0c" + bytes(range(0x0e, 0x20))
_NOT_CONTROL = bytes(sorted(set(range(256)) - set(_CONTROL)))
# A run of digits that may be an integer outside -2**63 .. 2**64 - 1, which the
# validator refuses (events.UINT64_MAX) and Arrow would read as a double: such a block
# goes to the validator, which knows an integer from a decimal.
_LONG_INTEGER = re.compile(rb"-[0-9]{19}|[0-9]{20}")
# digits -> "0", the rest -> " ": a run of 19 zeros is looked for first (5 ms a 4 MiB
# block; the regex alone took 105 ms, 6x pyarrow's read_json of it)
_DIGIT_RUNS = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))


def _long_integer(block: bytes) -> bool:
    return b"0" * 19 in block.translate(_DIGIT_RUNS) and \
        _LONG_INTEGER.search(block) is not None
# CSV: a tab is an ordinary character for both readers; CR and LF are line ends.
_NOT_CSV_CONTROL = bytes(sorted(set(range(256)) - (set(_CONTROL) - {0x09}) | {0x0a, 0x0d}))


def _jsonl_columns(stream: IO[bytes], source: str, engine, on_error: ErrorHandler,
                   chunk_rows: int, sourced: bool = False) -> Iterator:
    """Blocks of whole lines through pyarrow's JSON reader into engine columns; a block
    it cannot take, or that breaks a validator rule, goes to the validator line by line
    (``jsonl_lines``), so errors keep their line and column."""
    for block, line, _ in _line_blocks(stream, JSON_BLOCK_BYTES):
        cols = None if len(block) < FAST_PATH_MIN_BYTES else _json_block_columns(block, engine)
        if cols is not None:
            yield Sourced(cols, _records(_jsonl_text, block, source, line)) if sourced \
                else cols
        else:
            yield from _events_in_chunks(_jsonl_text(block, source, line), on_error,
                                         chunk_rows, sourced)


def _jsonl_text(block: bytes, source: str, line: int) -> Iterator:
    """``jsonl_lines`` of a block of whole lines that starts at ``line``."""
    import io
    return jsonl_lines(io.StringIO(block.decode("utf-8", "surrogateescape"), newline=""),
                       source, line)


def _records(read, *args) -> Callable[[], list]:
    """A piece's (position, Event) list, read again by the validator (``read(*args)``)
    when asked; a fast-path piece holds no bad record."""
    return lambda: list(read(*args))


def _line_blocks(stream: IO[bytes], block_bytes: int, rest: bytes = b"", line: int = 1,
                 offset: int = 0) -> Iterator[tuple[bytes, int, int]]:
    """The stream (after ``rest``, which starts at ``line`` and byte ``offset``) in
    blocks of whole lines of about ``block_bytes``: (block, its first line, its byte
    offset). Lines are counted as the text readers split them: LF, CRLF or a lone CR."""
    eof = False
    while True:
        more = b"" if eof else stream.read(block_bytes)
        eof = not more
        block = rest + more
        if more:
            cut = block.rfind(b"\n") + 1
            if cut == 0:  # one line longer than the block: read on
                rest = block
                continue
            block, rest = block[:cut], block[cut:]
        else:
            rest = b""
        if not block:
            return
        yield block, line, offset
        offset += len(block)
        line += block.count(b"\n")
        if b"\r" in block:
            line += block.count(b"\r") - block.count(b"\r\n")
        if eof:
            return


def _json_block_columns(block: bytes, engine):
    """Engine columns of a block of JSON Lines (whole lines) when pyarrow's reader takes
    it with one object per line and every row obeys the validator's rules, else None."""
    import pyarrow as pa
    import pyarrow.json as pj

    if not block.endswith(b"\n"):
        block += b"\n"  # the last line of the file
    lines = block.count(b"\n")
    if not block.startswith(b"{") or block.count(b"\n{") != lines - 1 \
            or block.translate(None, _NOT_CONTROL) or b"\xef\xbb\xbf" in block \
            or b"\r" in block and block.count(b"\r") != block.count(b"\r\n") \
            or not is_utf8(block) or _long_integer(block):
        return None
    try:
        table = pj.read_json(pa.BufferReader(block))
    except pa.ArrowInvalid:
        return None
    if table.num_rows != lines:  # two objects on one line
        return None
    batches = table.combine_chunks().to_batches()
    return arrow_columns(batches[0], engine) if len(batches) == 1 else None


CSV_BLOCK_BYTES = 1 << 22  # CSV read at a time, cut after the last whole line
# readers' cell patterns, anchored for RE2 (Python's fullmatch)
_CSV_INT, _CSV_NUM, _CSV_BOOL, _CSV_TRUE = (f"^(?:{p})$" for p in (CSV_INT, CSV_DEC,
                                                                  CSV_BOOL, CSV_TRUE))


def _csv_columns(path: str, engine, on_error: ErrorHandler, progress,
                 chunk_rows: int, sourced: bool = False, texts=None) -> Iterator:
    """Blocks of whole lines through pyarrow's CSV reader (every cell read as text,
    then typed by Arrow compute with the validator's patterns) into engine columns;
    a block it cannot take, or that breaks a validator rule, goes to the validator
    (``readers.csv_rows``), so errors keep their line. A quote character anywhere
    hands the rest of the file to the validator (a quoted cell may hold a newline, so
    lines are no longer rows); so does a header the fast path does not read alike."""
    import csv
    import io

    with _open(path) as f:
        stream = _Counted(f, progress)
        block, eof = b"", False
        while b"\n" not in block and not eof:
            more = stream.read(CSV_BLOCK_BYTES)
            block, eof = block + more, not more
        cut = block.find(b"\n") + 1 or len(block)
        first = block[:cut]
        text = first.decode("utf-8", "surrogateescape")
        header = next(csv.reader(io.StringIO(text, newline="")), None) if first else None
        if header is None:
            return
        if b'"' in first or b"\r" in first.rstrip(b"\r\n") or len(set(header)) != len(header):
            yield from _events_in_chunks(read_events(path, "csv", on_error=on_error,
                                                     texts=texts), on_error, chunk_rows, sourced)
            return
        csv_header(header, path)
        for block, line, offset in _line_blocks(stream, CSV_BLOCK_BYTES, block[cut:], 2, cut):
            if b'"' in block:  # the rest of the file, from this block on, as the validator reads it
                f.seek(offset)
                text = io.TextIOWrapper(f, encoding="utf-8", newline="", errors="surrogateescape")
                yield from _events_in_chunks(csv_rows(csv.reader(text), header, path, line - 1,
                                                      texts), on_error, chunk_rows, sourced)
                return
            cols = _csv_block_columns(block, header, engine, texts)
            rows = functools.partial(_csv_text, texts=texts)
            if cols is not None:
                yield Sourced(cols, _records(rows, block, header, path, line)) \
                    if sourced else cols
            else:
                yield from _events_in_chunks(rows(block, header, path, line), on_error,
                                             chunk_rows, sourced)


def _csv_text(block: bytes, header: list[str], source: str, line: int,
              texts=None) -> Iterator:
    """``csv_rows`` of a block of whole lines (no quote character) that starts at ``line``."""
    import csv
    import io
    text = io.StringIO(block.decode("utf-8", "surrogateescape"), newline="")
    return csv_rows(csv.reader(text), header, source, line - 1, texts)


def _csv_block_columns(block: bytes, header: list[str], engine, texts=None):
    """Engine columns of a block of CSV rows (whole lines, no quote character) when
    pyarrow reads it with one row per line and every cell obeys the validator's rules
    (``readers._csv_cell`` typing, ``event_from_mapping``), else None. The cells of
    attributes the row's type declares STRING (``texts``) are text whatever they look
    like."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    if block.translate(None, _NOT_CSV_CONTROL) \
            or b"\r" in block and block.count(b"\r") != block.count(b"\r\n") \
            or not is_utf8(block) or _long_integer(block):
        return None
    try:
        table = pcsv.read_csv(
            pa.BufferReader(block),
            read_options=pcsv.ReadOptions(column_names=header, block_size=len(block) + 1),
            parse_options=pcsv.ParseOptions(quote_char=False, newlines_in_values=False,
                                            ignore_empty_lines=True),
            convert_options=pcsv.ConvertOptions(
                column_types={name: pa.string() for name in header},
                strings_can_be_null=False, quoted_strings_can_be_null=False))
    except pa.ArrowInvalid:
        return None
    n = table.num_rows
    if n == 0:
        return None
    column = {name: table.column(name).combine_chunks() for name in header}
    plus = b"+" in block
    etype = column["type"]
    if not pc.all(pc.not_equal(etype, "")).as_py():
        return None
    fields = []
    for name in ("ts", "id"):
        if not pc.all(pc.match_substring_regex(column[name], _CSV_INT)).as_py():
            return None
        try:  # Arrow's integers take no "+"
            v = pc.cast(pc.replace_substring_regex(column[name], r"^\+", "") if plus
                        else column[name], pa.int64())
        except pa.ArrowInvalid:  # beyond 64 bits
            return None
        v = v.to_numpy()
        if name == "ts" and (v.max() > TS_LIMIT or v.min() < -TS_LIMIT):
            return None
        fields.append(v.astype(np.int64))
    attrs = engine.attrs
    slot = {a: i for i, a in enumerate(attrs)}
    val, kind = np.zeros((n, len(attrs)), np.float64), np.zeros((n, len(attrs)), np.int8)
    for name, c in column.items():
        if name in ("id", "type", "ts"):
            continue
        # An integer and a decimal cell give the same double (int(text) and float(text)
        # round alike), so one pattern (CSV_DEC covers CSV_INT) types both; only the
        # sign of a zero differs: int("-0") is +0.0, float("-0.0") is -0.0.
        nums = pc.match_substring_regex(c, _CSV_NUM)
        values = None
        if pc.any(nums).as_py():
            picked = pc.filter(c, nums)
            values = pc.cast(picked, pa.float64()).to_numpy(zero_copy_only=False).copy()
            if not np.isfinite(values).all():  # too large for a double: a bad event
                return None
            zero = values == 0.0
            if zero.any():
                ints = pc.match_substring_regex(pc.filter(picked, pa.array(zero)), _CSV_INT)
                values[np.flatnonzero(zero)[ints.to_numpy(zero_copy_only=False)]] = 0.0
        if name not in slot:
            continue
        a = slot[name]
        present = pc.not_equal(c, "").to_numpy(zero_copy_only=False)
        numeric = nums.to_numpy(zero_copy_only=False)
        text = [t for t, attrs in (texts or {}).items() if name in attrs]
        forced = pc.is_in(etype, value_set=pa.array(text, pa.string())).to_numpy(
            zero_copy_only=False) if text else np.zeros(n, bool)
        if values is not None:
            keep = ~forced[numeric]
            numeric = numeric & ~forced
            val[numeric, a], kind[numeric, a] = values[keep], KIND_NUM
        rest = present & ~numeric
        if not rest.any():
            continue
        rows = np.flatnonzero(rest)
        words = pc.filter(c, pa.array(rest))
        bools = pc.match_substring_regex(words, _CSV_BOOL).to_numpy(zero_copy_only=False) \
            & ~forced[rows]
        if bools.any():
            trues = pc.match_substring_regex(words, _CSV_TRUE).to_numpy(zero_copy_only=False)
            val[rows[bools], a] = trues[bools]
            kind[rows[bools], a] = KIND_BOOL
        if not bools.all():
            strings = rows[~bools]
            val[strings, a] = string_codes(pc.filter(words, pa.array(~bools)), engine)
            kind[strings, a] = KIND_STR
    return fields[0], fields[1], type_codes(etype, engine), val, kind
