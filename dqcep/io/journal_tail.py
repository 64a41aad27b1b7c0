"""Following a journal (``dqcep.io.journal``) while another process writes it.

``JournalTail`` follows a journal from an offset across calls, keeping its file
and position, and gives the offsets the journal cannot give back (damaged bytes,
a cut, deleted or trimmed segment) as ``Gap`` records in their place.
"""
from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Iterator

from dqcep.io.journal import (HEADER, MAX_RECORD, SEG, Gap, Record, check_format, record_at,
                              resync, segment_name, segments)


class JournalTail:
    """Follows a journal from an offset: keeps its file and position between calls.

    ``read(upto)`` yields records from where the previous call
    stopped up to (not including) offset ``upto``: pass the writer's durable
    offset, so only committed records are read. Offsets that the journal cannot
    give back (damaged bytes, a cut or deleted segment, records trimmed away)
    come as one ``Record(first offset, "", Gap(count, reason))`` each, in their place,
    so a consumer reports them and goes on with the records after them.
    """

    def __init__(self, directory: str | Path, offset: int = 0):
        self.dir = Path(directory)
        check_format(self.dir)
        self.offset = offset
        self._file: BinaryIO | None = None
        self._first = 0           # name (first offset) of the segment being read
        self._last = -1           # offset of the last record read from that segment
        self._damage: str | None = None  # where the bytes before the next record broke
        self._record_start = 0    # file position of the record read last

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
            self._last = offset
            if offset < self.offset:
                continue  # before where this tail started
            if offset > self.offset:
                yield self._gap(offset, self._damage or "missing from the journal")
            self._damage = None
            self.offset = offset + 1  # before the yield: a caller may stop after any record
            yield record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
