"""Following a journal (``dqcep.io.journal``) while another process writes it.

``JournalTail`` follows a journal from an offset across calls, keeping its file
and position, and gives the offsets the journal cannot give back (damaged bytes,
a cut, deleted or trimmed segment) as ``Gap`` records in their place. ``block``
gives a run of plain records at once as a ``RecordBlock`` (arrays, no object per
record), which a kernel consumer reads without a ``Record`` each.
"""
from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from dqcep._kernels.journal_records import scan_records
from dqcep.io.journal import (HEADER, MAX_RECORD, SEG, Gap, Record, Refused, check_format,
                              record_at, resync, segment_name, segments)

BLOCK_BYTES = 4 << 20  # bytes of a segment a block is scanned from, at most
# ... and at least: a block's read is sized by the records it may take (below the durable
# offset) at the bytes a record has taken so far; a consumer stepped after every commit
# took 4 MiB a step where its records were 60 KB (5 query consumers over 100,000
# readings: 9% of their steps)
MIN_BLOCK_BYTES = 64 << 10
TOPIC, TOPIC_LEN, PAYLOAD, PAYLOAD_LEN, ARRIVAL, MID = range(6)  # columns of RecordBlock.spans
NO_ARRIVAL = np.iinfo(np.int64).min


class RecordBlock:
    """``count`` consecutive journal records from offset ``first``, as they lie in
    ``data`` (bytes of a segment): ``spans[i]`` is record ``first + i``'s topic start and
    length, payload start and length (refused at ingest: -1 - its size), arrival µs
    (NO_ARRIVAL: none) and packet id (-1: none)."""

    def __init__(self, data: bytes, first: int, spans: np.ndarray):
        self.data, self.first, self.spans = data, first, spans
        self.count = len(spans)

    def arrival_ms(self) -> np.ndarray:
        """Each record's arrival in ms (-1: unknown)."""
        arrival = self.spans[:, ARRIVAL]
        return np.where(arrival == NO_ARRIVAL, -1, arrival // 1000)

    def record(self, i: int) -> Record:
        """Record ``first + i`` as the Python reader gives it."""
        t, tn, p, pn, arrival, mid = self.spans[i].tolist()
        payload = Refused(-1 - pn) if pn < 0 else self.data[p:p + pn]
        return Record(self.first + i, self.data[t:t + tn].decode("utf-8"), payload,
                      None if arrival == NO_ARRIVAL else arrival, None if mid < 0 else mid)


class BlockCache:
    """Blocks one tail scanned, for the other tails of its process that follow the same
    journal (a worker's query consumers each read every record): a tail at the place a
    block starts takes it and its place after it, so a run of records is read from the
    file and scanned once a process. The newest ``keep`` blocks are kept."""

    def __init__(self, keep: int = 16):
        self.keep = keep
        # first offset -> (segment, start and end position in it, stop topic, block)
        self._blocks: dict[int, tuple[int, int, int, str, RecordBlock]] = {}

    def put(self, segment: int, start: int, end: int, stop_prefix: str,
            block: RecordBlock) -> None:
        self._blocks.pop(block.first, None)
        self._blocks[block.first] = (segment, start, end, stop_prefix, block)
        while len(self._blocks) > self.keep:
            del self._blocks[next(iter(self._blocks))]

    def get(self, segment: int, start: int, first: int, upto: int, max_records: int,
            stop_prefix: str) -> tuple[int, RecordBlock] | None:
        """(end position, block) of the block at record ``first``, position ``start``
        of ``segment``, if it was cut as this call would cut it or shorter."""
        entry = self._blocks.get(first)
        if entry is None:
            return None
        seg, at, end, stop, block = entry
        if (seg, at, stop) != (segment, start, stop_prefix) or block.count > max_records \
                or first + block.count > upto:
            return None
        return end, block


class JournalTail:
    """Follows a journal from an offset: keeps its file and position between calls.

    ``read(upto)`` yields records from where the previous call
    stopped up to (not including) offset ``upto``: pass the writer's durable
    offset, so only committed records are read. Offsets that the journal cannot
    give back (damaged bytes, a cut or deleted segment, records trimmed away)
    come as one ``Record(first offset, "", Gap(count, reason))`` each, in their place,
    so a consumer reports them and goes on with the records after them.
    """

    def __init__(self, directory: str | Path, offset: int = 0,
                 cache: BlockCache | None = None):
        self.dir = Path(directory)
        check_format(self.dir)
        self.offset = offset
        self.cache = cache  # blocks shared with the process's other tails (``block``)
        self._file: BinaryIO | None = None
        self._first = 0           # name (first offset) of the segment being read
        self._last = -1           # offset of the last record read from that segment
        self._damage: str | None = None  # where the bytes before the next record broke
        self._record_start = 0    # file position of the record read last
        self._record_bytes = 256.0  # bytes a record took in the last block read (with room)

    def _open(self, name: Path) -> None:
        if self._file is not None:
            self._file.close()
        try:
            self._file = open(name, "rb")
        except FileNotFoundError:  # the open segment was closed (renamed) meanwhile
            self._file = open(name.with_suffix(SEG), "rb")
        self._first = int(name.stem)
        self._last = self._first - 1

    def _gap(self, upto_offset: int, reason: str):
        count = upto_offset - self.offset
        item = Record(self.offset, "", Gap(count, reason))
        self.offset = upto_offset
        return item

    def _next_record(self):
        """The next intact record of the open file, "eof", or "partial" (a record still
        being written: wait). Damaged bytes are stepped over (``_damage`` says where)."""
        f = self._file
        start = f.tell()
        head = f.read(HEADER.size)
        if not head:
            return "eof"
        if len(head) == HEADER.size:
            length, _ = HEADER.unpack(head)
            if 0 < length <= MAX_RECORD:
                body = f.read(length)
                if len(body) < length:
                    f.seek(start)
                    return "partial"
                rec = record_at(head + body, 0, self._last + 1)
                if rec is not None and rec[1].offset > self._last:
                    self._record_start = start
                    return rec
        else:
            f.seek(start)
            return "partial"
        return self._step_over_damage(start)

    def _step_over_damage(self, start: int):
        """The next intact record after damaged bytes at ``start``, or "eof"."""
        f = self._file
        f.seek(start)
        data = f.read()
        nxt = resync(data, 1, self._last)
        self._damage = f"damaged at byte {start} of segment {segment_name(self._first, '')}"
        f.seek(start + (len(data) if nxt is None else nxt))
        return self._next_record() if nxt is not None else "eof"

    def block(self, upto: int, max_records: int, stop_prefix: str) -> RecordBlock | None:
        """The next run of plain records below offset ``upto`` (at most ``max_records``)
        as one block, or None where ``read`` must take the next record: a gap, damage,
        a record of an older format or still being written, a segment's end, or a
        record whose topic starts with ``stop_prefix``."""
        if self._file is None and self.offset < upto:
            holding = [p for p in segments(self.dir) if int(p.stem) <= self.offset]
            if holding:
                self._open(holding[-1])
        f = self._file
        if f is None or self._damage is not None or self._last != self.offset - 1 \
                or self.offset >= upto:
            return None
        start = f.tell()
        hit = None if self.cache is None else \
            self.cache.get(self._first, start, self.offset, upto, max_records, stop_prefix)
        if hit is not None:
            end, block = hit
            f.seek(end)
        else:
            limit = min(upto - self.offset, max_records)
            want = min(BLOCK_BYTES, max(MIN_BLOCK_BYTES, int(limit * self._record_bytes)))
            while True:
                data = f.read(want)
                spans = np.empty((min(limit, len(data) // HEADER.size + 1), 6), np.int64)
                end, count, _ = scan_records(data, 0, self.offset, len(spans),
                                             stop_prefix.encode(), spans)
                if count or len(data) < want or want == BLOCK_BYTES:
                    break
                f.seek(start)  # a record longer than the read: as much as a block takes
                want = BLOCK_BYTES
            f.seek(start + end)
            if not count:
                return None
            # the bytes a record takes, with room: a block of ``limit`` records is read at once
            self._record_bytes = 1.25 * end / count
            block = RecordBlock(data[:end] if end < len(data) else data, self.offset,
                                spans[:count])
            if self.cache is not None:
                self.cache.put(self._first, start, start + end, stop_prefix, block)
        self._last = self.offset + block.count - 1
        self.offset += block.count
        return block

    def read(self, upto: int) -> Iterator[Record]:
        while self.offset < upto:
            if self._file is None:
                names = segments(self.dir)
                holding = [p for p in names if int(p.stem) <= self.offset]
                later = [p for p in names if int(p.stem) > self.offset]
                if holding:
                    self._open(holding[-1])
                elif later:
                    yield self._gap(int(later[0].stem), "no longer in the journal "
                                    "(trimmed or deleted)")
                    continue
                else:
                    yield self._gap(upto, "missing from the journal")
                    return
            rec = self._next_record()
            if rec == "partial":
                if not [p for p in segments(self.dir) if int(p.stem) > self._first]:
                    return  # the open segment's last record is still being written
                # a closed segment: no record is being written there; damaged bytes
                rec = self._step_over_damage(self._file.tell())
            if rec == "eof":
                later = [p for p in segments(self.dir) if int(p.stem) > self._first]
                if later:
                    nxt = int(later[0].stem)
                    if nxt > self.offset:
                        reason = self._damage or (f"missing: segment {segment_name(self._first, '')} "
                                                  "ends early")
                        yield self._gap(nxt, reason)
                    self._damage = None
                    self._open(later[0])
                    continue
                yield self._gap(upto, self._damage or "missing from the journal")
                self._damage = None
                return
            record = rec[1]
            offset = record.offset
            if offset >= upto:  # appended after the caller's snapshot: read it next time
                self._file.seek(self._record_start)
                return
            if offset < self.offset:
                self._last = offset
                continue  # before where this tail started
            if offset > self.offset:
                # the gap first; the record is read again after it, so that a caller
                # who stops after the gap does not lose it
                self._file.seek(self._record_start)
                yield self._gap(offset, self._damage or "missing from the journal")
                self._damage = None
                continue
            self._last = offset
            self._damage = None
            self.offset = offset + 1  # before the yield: a caller may stop after any record
            yield record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
