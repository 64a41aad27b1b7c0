"""A durable, replayable journal of received payloads (MQTT ingest -> engine -> Spark).

Layout of a journal directory::

    00000000000000000000.seg   closed segment: records with offsets 0 .. k-1
    00000000000000004096.seg   closed segment starting at offset 4096
    00000000000000008192.open  the segment being written

Every record is ``[u32 length][u32 crc32][body]`` (little-endian), ``body`` the
msgpack array ``[topic, payload]``. Offsets count records from 0 across the
whole journal; a segment's name is the offset of its first record, so the
sorted names give the order and any offset is found without reading the others.

Durability: ``append`` buffers; ``commit`` flushes and fsyncs the open segment
(policy ``fsync="always"``; ``"never"`` leaves it to the OS, for tests and
benchmarks) and returns the offset up to which records are durable — the MQTT
source acknowledges messages only after that. A segment is closed by fsyncing
it, renaming ``.open`` to ``.seg`` (atomic) and fsyncing the directory, so a
closed segment appears whole or not at all, in increasing name order: the
contract a replayable file source (Spark) needs.

Recovery: opening a journal scans the ``.open`` segment and cuts it after the
last record whose length and checksum are intact (a crash mid-write leaves a
torn tail, never a gap); closed segments are trusted as written.
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

import msgpack

from dqcep.errors import UserError

HEADER = struct.Struct("<II")
SEG, OPEN = ".seg", ".open"
FSYNC_POLICIES = ("always", "never")
MAX_RECORD = 64 * 1024 * 1024


def _name(offset: int, suffix: str) -> str:
    return f"{offset:020d}{suffix}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _scan(f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(end position, body) of each intact record from the current position."""
    while True:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            return
        length, crc = HEADER.unpack(head)
        if length > MAX_RECORD:
            return
        body = f.read(length)
        if len(body) < length or zlib.crc32(body) != crc:
            return
        yield f.tell(), body


class Journal:
    """Journal(directory, segment_bytes=64 MiB, fsync="always")"""

    def __init__(self, directory: str | Path, segment_bytes: int = 64 * 1024 * 1024,
                 fsync: str = "always"):
        if fsync not in FSYNC_POLICIES:
            raise UserError(f"journal fsync policy must be one of {', '.join(FSYNC_POLICIES)}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes, self.fsync = segment_bytes, fsync
        self.truncated_bytes = 0  # torn tail cut off at recovery
        closed = sorted(self.dir.glob("*" + SEG))
        opened = sorted(self.dir.glob("*" + OPEN))
        if len(opened) > 1:
            raise UserError(f"journal {self.dir} has {len(opened)} open segments; expected one")
        if opened:
            self._start = int(opened[0].stem)
            self._path = opened[0]
            self._count, good_end = 0, 0
            with open(self._path, "rb") as f:
                for end, _ in _scan(f):
                    self._count, good_end = self._count + 1, end
            size = self._path.stat().st_size
            if size > good_end:
                self.truncated_bytes = size - good_end
                with open(self._path, "r+b") as f:
                    f.truncate(good_end)
                    os.fsync(f.fileno())
        else:
            self._start = self._next_after(closed[-1]) if closed else 0
            self._path = self.dir / _name(self._start, OPEN)
            self._count = 0
            open(self._path, "wb").close()
            _fsync_dir(self.dir)
        self._file = open(self._path, "ab")
        self._durable = self._start + self._count

    @staticmethod
    def _next_after(segment: Path) -> int:
        with open(segment, "rb") as f:
            return int(segment.stem) + sum(1 for _ in _scan(f))

    @property
    def next_offset(self) -> int:
        """Offset the next appended record gets."""
        return self._start + self._count

    @property
    def durable_offset(self) -> int:
        """Every record below this offset is on disk (per the fsync policy)."""
        return self._durable

    def append(self, topic: str, payload: bytes) -> int:
        body = msgpack.packb([topic, payload], use_bin_type=True)
        if len(body) > MAX_RECORD:
            raise UserError(f"a payload of {len(payload)} bytes exceeds the journal's record "
                            f"limit of {MAX_RECORD} bytes")
        self._file.write(HEADER.pack(len(body), zlib.crc32(body)))
        self._file.write(body)
        offset = self.next_offset
        self._count += 1
        return offset

    def commit(self) -> int:
        """Make everything appended durable; returns the durable offset."""
        self._file.flush()
        if self.fsync == "always":
            os.fsync(self._file.fileno())
        self._durable = self.next_offset
        if self._file.tell() >= self.segment_bytes:
            self._roll()
        return self._durable

    def _roll(self) -> None:
        """Close the open segment (fsync, atomic rename) and start the next."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._path, self.dir / _name(self._start, SEG))
        self._start += self._count
        self._count = 0
        self._path = self.dir / _name(self._start, OPEN)
        self._file = open(self._path, "ab")
        _fsync_dir(self.dir)

    def close(self) -> None:
        """Commit and close the open segment, so every record is in a closed segment."""
        self.commit()
        if self._count:
            self._roll()
        self._file.close()
        if self._path.exists() and self._path.stat().st_size == 0:
            self._path.unlink()

    # ------------------------------------------------------------------ reading
    def read(self, start: int = 0, include_open: bool = True) -> Iterator[tuple[int, str, bytes]]:
        """(offset, topic, payload) from ``start`` on: closed segments, then the open one."""
        return read_journal(self.dir, start, include_open, upto=self._durable)


def read_journal(directory: str | Path, start: int = 0, include_open: bool = False,
                 upto: int | None = None) -> Iterator[tuple[int, str, bytes]]:
    """Records of a journal directory from offset ``start`` (another process may write it).

    Without ``include_open`` only closed segments are read: what a replayable
    source may consume. ``upto`` stops before that offset.
    """
    directory = Path(directory)
    segments = sorted(directory.glob("*" + SEG))
    if include_open:
        segments += sorted(directory.glob("*" + OPEN))
    for i, seg in enumerate(segments):
        first = int(seg.stem)
        nxt = int(segments[i + 1].stem) if i + 1 < len(segments) else None
        if nxt is not None and nxt <= start:
            continue
        if not seg.exists():  # an open segment closed (renamed) since the listing
            seg = directory / _name(first, SEG)
        for offset, topic, payload in segment_records(seg):
            if upto is not None and offset >= upto:
                return
            if offset >= start:
                yield offset, topic, payload


def segment_records(path: str | Path) -> Iterator[tuple[int, str, bytes]]:
    """(offset, topic, payload) of the intact records of one segment file."""
    path = Path(path)
    with open(path, "rb") as f:
        for offset, (_, body) in enumerate(_scan(f), start=int(path.stem)):
            topic, payload = msgpack.unpackb(body, raw=False)
            yield offset, topic, payload


class JournalTail:
    """Follows a journal from an offset without re-reading: keeps its file and position.

    ``read(upto)`` yields the records from where the previous call stopped up to
    (not including) offset ``upto`` — pass the writer's durable offset, so only
    whole, committed records are read. When a segment ends it moves on to the
    segment starting at the next offset (the writer may have renamed the one it
    was reading: an open file keeps reading the same data).
    """

    def __init__(self, directory: str | Path, offset: int = 0):
        self.dir = Path(directory)
        self.offset = offset
        self._file: BinaryIO | None = None

    def _open_at(self, offset: int) -> bool:
        """Open the segment holding ``offset`` and skip to it; False if none does yet."""
        names = sorted(self.dir.glob("*" + SEG)) + sorted(self.dir.glob("*" + OPEN))
        names.sort(key=lambda p: int(p.stem))
        holding = [p for p in names if int(p.stem) <= offset]
        if not holding:
            return False
        path = holding[-1]
        try:
            f = open(path, "rb")
        except FileNotFoundError:  # renamed meanwhile
            f = open(self.dir / _name(int(path.stem), SEG), "rb")
        for _ in range(offset - int(path.stem)):
            head = f.read(HEADER.size)
            if len(head) < HEADER.size:
                f.close()
                return False
            f.seek(HEADER.unpack(head)[0], os.SEEK_CUR)
        if self._file is not None:
            self._file.close()
        self._file = f
        return True

    def read(self, upto: int) -> Iterator[tuple[int, str, bytes]]:
        while self.offset < upto:
            if self._file is None and not self._open_at(self.offset):
                return
            head = self._file.read(HEADER.size)
            if len(head) < HEADER.size:  # end of this segment: the next one starts here
                self._file.seek(-len(head), os.SEEK_CUR)
                if not self._open_at(self.offset):
                    return
                continue
            length, crc = HEADER.unpack(head)
            body = self._file.read(length)
            if len(body) < length or zlib.crc32(body) != crc:
                raise UserError(f"journal {self.dir} is damaged at offset {self.offset}")
            topic, payload = msgpack.unpackb(body, raw=False)
            yield self.offset, topic, payload
            self.offset += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
