"""A durable, replayable journal of received payloads (MQTT ingest -> engine -> Spark).

Layout of a journal directory::

    00000000000000000000.seg   closed segment: its first record has offset 0
    00000000000000004096.seg   closed segment starting at offset 4096
    00000000000000008192.open  the segment being written
    consumers/NAME.offset      how far each consumer has checkpointed (retention)

Every record is ``[u32 length][u32 crc32][body]`` (little-endian), ``body`` the
msgpack array ``[offset, topic, payload, arrival_us, mid]``; ``payload`` is the
bytes received, or an integer: the size of a payload refused at ingest (over the
size limit), kept so that the refusal is reported in stream order; ``arrival_us``
the wall-clock time it was received (microseconds since the epoch, taken once at
ingest: an event without a time of its own gets this one, on every replay and in
every consumer); ``mid`` the MQTT packet id it came with (a redelivery after a
crash comes with the same one, see ``dqcep.io.mqtt``); either may be nil. Offsets count records
across the whole journal and are written in each record, so that damage, a cut
segment or a deleted one shows as a gap in the offsets instead of shifting
every later record. A segment's name is the offset of its first record, so the
sorted names give the order.

Format: the file ``FORMAT`` holds the journal's format number (``FORMAT_VERSION``).
Older records are still read: format 1 bodies ``[offset, topic, payload]`` have no
arrival time and no packet id, and journals written before offsets were stored
hold ``[topic, payload]`` bodies, their offsets their positions. A journal of a
newer format than this code knows is refused with one line.

Durability: ``append`` keeps the record in memory; ``commit`` writes what was
appended in one write and fsyncs (policy ``fsync="always"``; ``"never"``
leaves it to the OS, for tests and benchmarks) and returns the offset up to
which records are durable: the MQTT source acknowledges messages only after
that. A commit that fails (a full disk, an I/O error) cuts the segment back to
its last durable length, keeps the records and raises ``JournalWriteError``; the
next commit tries them again. A segment is closed by fsyncing it, renaming
``.open`` to ``.seg`` (atomic) and fsyncing the directory, so a closed segment
appears whole or not at all, in increasing name order: the contract a
replayable file source (Spark) needs.

Recovery: opening a journal scans the ``.open`` segment. Damage that runs to
its end is a torn tail (a crash mid-write) and is cut; damage followed by intact
records is kept in place and reported by the readers as a gap, with the intact
records after it read as usual. The next offset never goes below
``min_next_offset`` (what a consumer's checkpoint says it has seen), so a
journal that lost records never gives their offsets to new ones.

Retention: ``trim(keep_bytes)`` deletes the oldest closed segments that every
registered consumer (``consumers/``) has checkpointed past, keeping at least
``keep_bytes`` of closed segments for replay.
"""
from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Union

import msgpack

from dqcep.core.errors import UserError

HEADER = struct.Struct("<II")
SEG, OPEN = ".seg", ".open"
FSYNC_POLICIES = ("always", "never")
MAX_RECORD = 64 * 1024 * 1024
CONSUMERS = "consumers"
# msgpack fixarray of 5 (format 2), 3 (format 1: offset, topic, payload) or 2 (topic, payload)
_BODY_START = (0x95, 0x93, 0x92)
FORMAT_VERSION = 2
FORMAT_FILE = "FORMAT"

# Records of the service's own, among the messages: their topics start with this (no
# MQTT input may subscribe to it). A tick (spec section 7) says that no message came for
# a while: its payload is the service clock's time in ms, as ASCII digits.
SERVICE_TOPICS = "$dqcep/"
TICK_TOPIC = SERVICE_TOPICS + "tick"


def tick_payload(at_ms: int) -> bytes:
    return str(int(at_ms)).encode()


def tick_time(payload) -> int | None:
    """The time of a tick record's payload; None when it is no tick's (damage)."""
    if not isinstance(payload, bytes) or not payload.isdigit() or len(payload) > 19:
        return None
    return int(payload)


@dataclass(frozen=True)
class Refused:
    """In place of a payload refused at ingest (over the size limit): its size."""
    size: int


@dataclass(frozen=True)
class Gap:
    """``count`` records from this offset on that the journal cannot give back."""
    count: int
    reason: str


Payload = Union[bytes, Refused, Gap]


class Record(NamedTuple):
    """One journal record as the readers give it back."""
    offset: int
    topic: str
    payload: Payload
    arrival_us: int | None = None  # received at (µs since the epoch); None: unknown
    mid: int | None = None         # the MQTT packet id it came with


class JournalWriteError(UserError):
    """A commit could not be written; the records are kept for the next commit."""


def frame_record(offset: int, topic: str, payload: bytes | Refused, arrival_us: int | None,
                 mid: int | None) -> bytes:
    """One record's bytes: ``[u32 length][u32 crc32][msgpack body]``."""
    body = msgpack.packb([offset, topic, payload.size if isinstance(payload, Refused)
                          else payload, arrival_us, mid], use_bin_type=True)
    if len(body) > MAX_RECORD:
        raise UserError(f"a payload of {len(payload)} bytes exceeds the journal's record "
                        f"limit of {MAX_RECORD} bytes")
    return HEADER.pack(len(body), zlib.crc32(body)) + body


def segment_name(offset: int, suffix: str) -> str:
    return f"{offset:020d}{suffix}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def segments(directory: str | Path, include_open: bool = True) -> list[Path]:
    """Segment files in offset order (the open one last), while a writer may close one.

    The open segments are listed before the closed ones: a segment closed (renamed
    from ``.open`` to ``.seg``) between the two listings is then in one of them, or in
    both (kept once, as closed). Listed the other way round, it was in neither, and a
    reader took the segment after it for its successor: its records read as lost.
    """
    directory = Path(directory)
    opened = list(directory.glob("*" + OPEN)) if include_open else []
    closed = list(directory.glob("*" + SEG))
    names = {int(p.stem) for p in closed}
    found = closed + [p for p in opened if int(p.stem) not in names]
    return sorted(found, key=lambda p: int(p.stem))


def journal_bytes(directory: str | Path) -> int:
    """Bytes the journal's segments take (one trimmed or closed meanwhile is skipped)."""
    total = 0
    for path in segments(directory):
        try:
            total += path.stat().st_size
        except OSError:
            pass  # trimmed, or closed (renamed) since the listing
    return total


# ---------------------------------------------------------------- records
def record_at(data, pos: int, positional: int):
    """(end, Record) of an intact record at ``pos``, else None.

    ``positional`` is the offset an old two-field record at this place has.
    """
    if pos + HEADER.size > len(data):
        return None
    length, crc = HEADER.unpack_from(data, pos)
    end = pos + HEADER.size + length
    if length == 0 or length > MAX_RECORD or end > len(data) \
            or data[pos + HEADER.size] not in _BODY_START:
        return None
    body = bytes(data[pos + HEADER.size:end])
    if zlib.crc32(body) != crc:
        return None
    try:
        fields = msgpack.unpackb(body, raw=False)
    except Exception:  # a checksum that matches by chance over bytes that are no record
        return None
    arrival = mid = None
    if len(fields) == 2:
        offset, (topic, payload) = positional, fields
    elif len(fields) == 3:
        offset, topic, payload = fields
    else:
        offset, topic, payload, arrival, mid = fields
    if not isinstance(offset, int) or not isinstance(topic, str) \
            or not (arrival is None or isinstance(arrival, int)) \
            or not (mid is None or isinstance(mid, int)):
        return None
    if isinstance(payload, int):
        payload = Refused(payload)
    elif not isinstance(payload, bytes):
        return None
    return end, Record(offset, topic, payload, arrival, mid)


def resync(data, pos: int, after: int):
    """Position of the first intact record at or after ``pos`` whose offset is above
    ``after`` (the last good one), else None. Only the bytes a body starts with are
    tried, so a damaged segment costs one pass, not one checksum per byte."""
    while True:
        starts = [i for i in (data.find(bytes([b]), pos + HEADER.size) for b in _BODY_START)
                  if i >= 0]
        if not starts:
            return None
        q = min(starts) - HEADER.size
        rec = record_at(data, q, after + 1)
        if rec is not None and rec[1].offset > after:
            return q
        pos = q + 1


def scan(data, first: int) -> Iterator[tuple]:
    """Everything in a segment's bytes: ``("record", start, end, offset, Record)``
    for intact records and ``("damaged", start, end)`` for the bytes between them."""
    pos, last = 0, first - 1
    while pos < len(data):
        rec = record_at(data, pos, last + 1)
        if rec is not None and rec[1].offset > last:
            end, record = rec
            yield "record", pos, end, record.offset, record
            pos, last = end, record.offset
            continue
        nxt = resync(data, pos + 1, last)
        yield "damaged", pos, len(data) if nxt is None else nxt
        if nxt is None:
            return
        pos = nxt


def segment_items(path: str | Path) -> Iterator[Record]:
    """The records of one segment file, in order; a damaged stretch
    between intact records is one record whose payload is a ``Gap`` (damage at the very end of a segment
    cannot be counted here: the next segment's name tells, see ``dqcep.io.journal_tail.JournalTail``)."""
    path = Path(path)
    data = path.read_bytes()
    expected = int(path.stem)
    damaged_at = None
    for item in scan(data, expected):
        if item[0] == "damaged":
            damaged_at = item[1]
            continue
        record = item[4]
        if record.offset > expected:
            why = (f"damaged at byte {damaged_at} of {path.name}" if damaged_at is not None
                   else f"missing from {path.name}")
            yield Record(expected, "", Gap(record.offset - expected, why))
        damaged_at = None
        yield record
        expected = record.offset + 1


def segment_records(path: str | Path) -> Iterator[Record]:
    """The intact records of one segment file."""
    for record in segment_items(path):
        if not isinstance(record.payload, Gap):
            yield record


def _segment_end(path: Path) -> int:
    """The offset after the last intact record of a segment (its name if none)."""
    end = int(path.stem)
    for item in scan(path.read_bytes(), end):
        if item[0] == "record":
            end = item[3] + 1
    return end


class Journal:
    """Journal(directory, segment_bytes=64 MiB, fsync="always", min_next_offset=0)"""

    def __init__(self, directory: str | Path, segment_bytes: int = 64 * 1024 * 1024,
                 fsync: str = "always", min_next_offset: int = 0):
        if fsync not in FSYNC_POLICIES:
            raise UserError(f"journal fsync policy must be one of {', '.join(FSYNC_POLICIES)}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        if check_format(self.dir) != FORMAT_VERSION:
            write_format(self.dir)  # older records stay readable; new ones are this format
        self.segment_bytes, self.fsync = segment_bytes, fsync
        self.truncated_bytes = 0   # torn tail cut off at recovery
        self.damaged_bytes = 0     # damaged stretches kept in place (the readers report them)
        opened = sorted(self.dir.glob("*" + OPEN), key=lambda p: int(p.stem))
        for earlier in opened[:-1]:  # a crash between starting a segment and closing the last
            os.replace(earlier, earlier.with_suffix(SEG))
        closed = segments(self.dir, include_open=False)
        nxt = min_next_offset
        if closed:
            nxt = max(nxt, _segment_end(closed[-1]))
        if opened:
            self._path = opened[-1]
            nxt = max(nxt, int(self._path.stem), self._recover(self._path))
        else:
            self._path = self.dir / segment_name(nxt, OPEN)
            open(self._path, "wb").close()
            _fsync_dir(self.dir)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
        self._size = os.fstat(self._fd).st_size  # bytes durable in the open segment
        self._next = self._durable = nxt
        self._pending: list[bytes] = []

    def _recover(self, path: Path) -> int:
        """Cut a torn tail off the open segment; returns the offset after its last record."""
        data = path.read_bytes()
        end, good_end = int(path.stem), 0
        for item in scan(data, end):
            if item[0] == "record":
                end, good_end = item[3] + 1, item[2]
            elif item[2] < len(data):
                self.damaged_bytes += item[2] - item[1]
        if len(data) > good_end:
            self.truncated_bytes = len(data) - good_end
            with open(path, "r+b") as f:
                f.truncate(good_end)
                os.fsync(f.fileno())
        return end

    @property
    def next_offset(self) -> int:
        """Offset the next appended record gets."""
        return self._next

    @property
    def durable_offset(self) -> int:
        """Every record below this offset is on disk (per the fsync policy), or lost
        and reported by the readers."""
        return self._durable

    def append(self, topic: str, payload: bytes | Refused, arrival_us: int | None = None,
               mid: int | None = None) -> int:
        """Append a record (durable after ``commit``); returns its offset."""
        offset = self._next
        self._pending.append(frame_record(offset, topic, payload, arrival_us, mid))
        self._next += 1
        return offset

    def append_framed(self, records: bytes, count: int) -> int:
        """Append ``count`` records framed as ``frame_record`` frames them, numbered from
        ``next_offset`` on (the MQTT source's kernel frames a whole read at once);
        returns the first one's offset."""
        offset = self._next
        self._pending.append(records)
        self._next += count
        return offset

    def commit(self) -> int:
        """Make everything appended durable; returns the durable offset.

        On failure the segment is cut back to its durable length, the records
        stay appended and JournalWriteError says why; call again to retry.
        """
        if self._pending:
            data = b"".join(self._pending)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view):]
                if self.fsync == "always":
                    os.fsync(self._fd)
            except OSError as err:
                try:
                    os.ftruncate(self._fd, self._size)
                except OSError:
                    pass  # the next commit writes from the durable length again regardless
                raise JournalWriteError(f"cannot write the journal {self._path}: "
                                        f"{err.strerror or err}") from None
            self._size += len(data)
            self._pending = []
        self._durable = self._next
        if self._size >= self.segment_bytes:
            try:
                self._roll()
            except OSError:
                pass  # stays open and grows; the next commit tries to close it again
        return self._durable

    def _roll(self) -> None:
        """Close the open segment (fsync, atomic rename) and start the next.

        The next segment is created first: a failure leaves the open one as it was.
        """
        path = self.dir / segment_name(self._next, OPEN)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.fsync(self._fd)
        os.close(self._fd)
        os.replace(self._path, self._path.with_suffix(SEG))
        self._path, self._fd, self._size = path, fd, 0
        _fsync_dir(self.dir)

    def close(self) -> None:
        """Commit and close the open segment, so every record is in a closed segment.

        An empty open segment named by the next offset stays: it keeps that offset
        when retention has deleted every closed segment.
        """
        self.commit()
        if self._size:
            self._roll()
        os.close(self._fd)

    # ---------------------------------------------------------------- retention
    def checkpointed(self, consumer: str, offset: int) -> None:
        """Record that ``consumer`` needs no record below ``offset`` any more."""
        write_consumer_offset(self.dir, consumer, offset)

    def trim(self, keep_bytes: int = 0) -> int:
        """Delete closed segments every consumer is past (newest ``keep_bytes`` kept);
        returns the bytes freed. With no consumer registered nothing is deleted."""
        return trim(self.dir, keep_bytes)

    # ------------------------------------------------------------------ reading
    def read(self, start: int = 0, include_open: bool = True) -> Iterator[Record]:
        """Records from offset ``start`` on: closed segments, then the open one."""
        return read_journal(self.dir, start, include_open, upto=self._durable)


class JournalView:
    """A journal as a consumer in another process than its writer's sees it: the offset
    below which records are durable comes from the writer (``durable()``, e.g. a
    shared value it sets after each commit); retention goes through the consumer-offset
    files, which any process may write."""

    def __init__(self, directory: str | Path, durable: Callable[[], int]):
        self.dir = Path(directory)
        self._durable = durable

    @property
    def durable_offset(self) -> int:
        return self._durable()

    def checkpointed(self, consumer: str, offset: int) -> None:
        write_consumer_offset(self.dir, consumer, offset)

    def trim(self, keep_bytes: int = 0) -> int:
        return trim(self.dir, keep_bytes)

    def close(self) -> None:
        """Nothing to close: the writer owns the files."""


def check_format(directory: str | Path) -> int | None:
    """The format number of a journal directory (None: written before formats were
    numbered, read as format 1); a newer format than this code reads is an error."""
    path = Path(directory) / FORMAT_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        version = int(text.strip())
    except ValueError:
        raise UserError(f"{path} holds no journal format number ({text[:40]!r}); "
                        f"this dqcep writes format {FORMAT_VERSION}") from None
    if version > FORMAT_VERSION:
        raise UserError(f"the journal {directory} is format {version}; this dqcep reads "
                        f"formats up to {FORMAT_VERSION}: run a newer dqcep on it")
    return version


def write_format(directory: str | Path) -> None:
    path = Path(directory) / FORMAT_FILE
    tmp = path.with_name(FORMAT_FILE + ".tmp")
    tmp.write_text(f"{FORMAT_VERSION}\n")
    os.replace(tmp, path)
    _fsync_dir(Path(directory))


def write_consumer_offset(directory: str | Path, consumer: str, offset: int) -> None:
    folder = Path(directory) / CONSUMERS
    folder.mkdir(exist_ok=True)
    tmp = folder / f"{consumer}.offset.tmp"
    tmp.write_text(f"{offset}\n")
    os.replace(tmp, folder / f"{consumer}.offset")


def forget_consumer(directory: str | Path, consumer: str) -> None:
    """A consumer that is gone (a query removed): retention no longer waits for it."""
    try:
        (Path(directory) / CONSUMERS / f"{consumer}.offset").unlink()
    except FileNotFoundError:
        pass


def trim(directory: str | Path, keep_bytes: int = 0) -> int:
    """See ``Journal.trim``; usable by any process (a consumer offset is a file)."""
    directory = Path(directory)
    try:
        offsets = [int(p.read_text()) for p in (directory / CONSUMERS).glob("*.offset")]
    except (OSError, ValueError):
        return 0  # a consumer file being replaced or damaged: trim next time
    if not offsets:
        return 0
    safe = min(offsets)
    names = segments(directory)
    closed = [p for p in names if p.suffix == SEG]
    freed, kept = 0, sum(p.stat().st_size for p in closed)
    for seg, following in zip(names, names[1:]):
        if seg.suffix != SEG or int(following.stem) > safe:
            break  # the next segment's first offset bounds this one's records
        size = seg.stat().st_size
        if kept - size < keep_bytes:
            break
        seg.unlink()
        freed, kept = freed + size, kept - size
    return freed


def read_journal(directory: str | Path, start: int = 0, include_open: bool = False,
                 upto: int | None = None) -> Iterator[Record]:
    """Intact records of a journal directory from offset ``start`` (another process may
    write it). Without ``include_open`` only closed segments are read: what a
    replayable source may consume. ``upto`` stops before that offset."""
    check_format(directory)
    names = segments(directory, include_open)
    for i, seg in enumerate(names):
        nxt = int(names[i + 1].stem) if i + 1 < len(names) else None
        if nxt is not None and nxt <= start:
            continue
        if not seg.exists():  # an open segment closed (renamed) since the listing
            seg = seg.with_suffix(SEG)
        for record in segment_records(seg):
            if upto is not None and record.offset >= upto:
                return
            if record.offset >= start:
                yield record
