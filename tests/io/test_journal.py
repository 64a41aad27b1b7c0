"""Journal: offsets across segments, torn-tail recovery, replay from an offset, SIGKILL."""
import os
import signal
import subprocess
import sys
import time

import pytest

from dqcep.core.errors import UserError
from dqcep.io.journal import Journal, read_journal


def payloads(n, start=0):
    return [(f"t/{i % 3}", f"payload {i}".encode() * (1 + i % 5)) for i in range(start, start + n)]


def test_offsets_segments_and_replay(tmp_path):
    j = Journal(tmp_path, segment_bytes=500)
    for i, (topic, p) in enumerate(payloads(100)):
        assert j.append(topic, p) == i
        if i % 7 == 0:
            assert j.commit() == i + 1
    j.commit()
    names = sorted(x.name for x in tmp_path.iterdir() if x.name != "FORMAT")
    assert len(names) > 5 and names[-1].endswith(".open")
    assert all(n.endswith(".seg") for n in names[:-1])
    firsts = [int(n.split(".")[0]) for n in names]
    assert firsts == sorted(firsts) and firsts[0] == 0
    got = list(j.read())
    assert [(t, p) for _, t, p, *_ in got] == payloads(100) and [o for o, *_ in got] == list(range(100))
    assert [o for o, *_ in j.read(57)] == list(range(57, 100))
    closed = list(read_journal(tmp_path))          # only closed segments
    assert closed and [o for o, *_ in closed] == list(range(len(closed)))
    j.close()
    assert [o for o, *_ in read_journal(tmp_path)] == list(range(100))
    assert [p.stat().st_size for p in tmp_path.glob("*.open")] == [0]  # keeps the offset
    j2 = Journal(tmp_path, segment_bytes=500)     # reopening continues the offsets
    assert j2.append("x", b"y") == 100


def test_torn_tail_is_cut_at_recovery(tmp_path):
    j = Journal(tmp_path)
    for topic, p in payloads(10):
        j.append(topic, p)
    j.commit()
    path = next(tmp_path.glob("*.open"))
    with open(path, "ab") as f:
        f.write(b"\x40\x00\x00\x00\x01\x02")     # a record header cut mid-write
    j2 = Journal(tmp_path)
    assert j2.truncated_bytes == 6 and j2.next_offset == 10
    assert j2.append("t", b"after") == 10
    j2.commit()
    assert [p for _, _, p, *_ in j2.read(9)] == [payloads(10)[9][1], b"after"]


def test_corrupt_record_ends_the_open_segment(tmp_path):
    j = Journal(tmp_path)
    for topic, p in payloads(5):
        j.append(topic, p)
    j.commit()
    path = next(tmp_path.glob("*.open"))
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF                               # flip a byte of the last record
    path.write_bytes(bytes(data))
    assert Journal(tmp_path).next_offset == 4


def test_policy_and_size_errors(tmp_path):
    with pytest.raises(UserError, match="fsync policy"):
        Journal(tmp_path, fsync="sometimes")
    with pytest.raises(UserError, match="record limit"):
        Journal(tmp_path).append("t", b"x" * (64 * 1024 * 1024 + 1))


def test_a_crash_between_starting_a_segment_and_closing_the_last(tmp_path):
    j = Journal(tmp_path)
    for topic, p in payloads(5):
        j.append(topic, p)
    j.commit()
    (tmp_path / "00000000000000000005.open").touch()  # the next segment, created first
    j2 = Journal(tmp_path)
    assert sorted(x.name for x in tmp_path.glob("*.*")) == [
        "00000000000000000000.seg", "00000000000000000005.open"]
    assert j2.append("t", b"x") == 5


WRITER = """
import sys
from dqcep.io.journal import Journal
j = Journal(sys.argv[1], segment_bytes=4000)
i = 0
while True:
    j.append("t", b"event %d" % i)
    i += 1
    if i % 10 == 0:
        print(j.commit(), flush=True)
"""


@pytest.mark.integration
def test_sigkill_loses_nothing_committed(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    committed = 0
    deadline = time.monotonic() + 20
    while committed < 3000 and time.monotonic() < deadline:
        committed = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert committed >= 3000
    j = Journal(tmp_path, segment_bytes=4000)
    records = list(j.read())
    assert len(records) >= committed
    assert [p for _, _, p, *_ in records] == [b"event %d" % i for i in range(len(records))]


def test_tail_follows_appends_and_segment_rolls(tmp_path):
    from dqcep.io.journal_tail import JournalTail
    j = Journal(tmp_path, segment_bytes=300)
    tail = JournalTail(tmp_path, 0)
    seen = []
    for start in range(0, 200, 13):
        for topic, p in payloads(13, start):
            j.append(topic, p)
        j.commit()
        seen += list(tail.read(j.durable_offset))
    assert seen == list(j.read()) and len(seen) == len(payloads(13)) * 16
    assert len(list(tmp_path.glob("*.seg"))) > 10
    late = JournalTail(tmp_path, 150)   # starting in the middle of a closed segment
    assert [o for o, *_ in late.read(j.durable_offset)] == list(range(150, 208))
    assert list(late.read(j.durable_offset)) == []


def journal_of(tmp_path, n, segment_bytes=400):
    j = Journal(tmp_path, segment_bytes=segment_bytes)
    for topic, p in payloads(n):
        j.append(topic, p)
        j.commit()
    return j


def tail_all(tmp_path, upto, start=0):
    from dqcep.io.journal_tail import JournalTail
    return list(JournalTail(tmp_path, start).read(upto))


def gaps(items):
    from dqcep.io.journal import Gap
    return [(o, p.count) for o, _, p, *_ in items if isinstance(p, Gap)]


def flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x55
    path.write_bytes(bytes(data))


def record_starts(path):
    from dqcep.io.journal import scan
    return [(item[1], item[3]) for item in scan(path.read_bytes(), int(path.stem))]


@pytest.mark.parametrize("where", ["body", "length"])
def test_a_flipped_byte_in_a_closed_segment_loses_one_record(tmp_path, where):
    j = journal_of(tmp_path, 60)
    seg = sorted(tmp_path.glob("*.seg"))[1]
    starts = record_starts(seg)
    pos, victim = starts[2]
    flip(seg, pos + (12 if where == "body" else 1))
    items = tail_all(tmp_path, j.durable_offset)
    assert gaps(items) == [(victim, 1)]
    assert "damaged at byte" in items[victim][2].reason
    assert [o for o, _, p, *_ in items if isinstance(p, bytes)] == \
        [o for o in range(60) if o != victim]


def test_a_flipped_byte_in_the_open_segment_is_no_torn_tail(tmp_path):
    j = journal_of(tmp_path, 10, segment_bytes=1 << 20)
    j.close()
    next(tmp_path.glob("*.open")).unlink()     # as if the service had been killed
    seg = next(tmp_path.glob("*.seg"))         # while writing its only segment
    seg.rename(seg.with_suffix(".open"))
    pos, victim = record_starts(seg.with_suffix(".open"))[4]
    flip(seg.with_suffix(".open"), pos + 12)
    j2 = Journal(tmp_path)                      # the records after the damage stay
    assert j2.truncated_bytes == 0 and j2.damaged_bytes > 0 and j2.next_offset == 10
    assert j2.append("t", b"after") == 10
    j2.commit()
    items = tail_all(tmp_path, j2.durable_offset)
    assert gaps(items) == [(4, 1)] and [o for o, *_ in items] == list(range(11))


def test_a_cut_closed_segment_is_a_gap_not_a_stall(tmp_path):
    j = journal_of(tmp_path, 60)
    seg = sorted(tmp_path.glob("*.seg"))[1]
    first_after = int(sorted(tmp_path.glob("*.seg"))[2].stem)
    pos, cut_at = record_starts(seg)[2]
    with open(seg, "r+b") as f:
        f.truncate(pos + 5)                      # inside a record
    items = tail_all(tmp_path, j.durable_offset)
    assert gaps(items) == [(cut_at, first_after - cut_at)]
    assert "damaged at byte" in items[cut_at][2].reason
    assert [o for o, *_ in items] == list(range(cut_at + 1)) + list(range(first_after, 60))


def test_lost_segments_never_give_their_offsets_to_new_records(tmp_path):
    j = journal_of(tmp_path, 60)
    j.close()
    for seg in sorted(tmp_path.glob("*.seg"))[-3:]:
        seg.unlink()                              # the newest segments are gone
    j2 = Journal(tmp_path, min_next_offset=60)    # a consumer's checkpoint had seen 60
    assert j2.append("t", b"new") == 60
    j2.commit()
    items = tail_all(tmp_path, j2.durable_offset, start=0)
    (gap,) = gaps(items)
    assert gap[0] + gap[1] == 60 and items[-1][:2] == (60, "t")


def test_a_failed_commit_keeps_the_records_and_recovers(tmp_path):
    """A full disk, made by a file-size limit: nothing is acknowledged, nothing lost."""
    import resource
    from dqcep.io.journal import JournalWriteError
    j = Journal(tmp_path)
    for topic, p in payloads(5):
        j.append(topic, p)
    j.commit()
    size = next(tmp_path.glob("*.open")).stat().st_size
    for topic, p in payloads(50, 5):
        j.append(topic, p)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, hard))
    try:
        with pytest.raises(JournalWriteError, match="File too large"):
            j.commit()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert j.durable_offset == 5 and next(tmp_path.glob("*.open")).stat().st_size == size
    assert j.commit() == 55                       # space came back
    assert [p for _, _, p, *_ in j.read()] == [p for _, p in payloads(55)]
    j.close()
    assert [p for _, _, p, *_ in Journal(tmp_path).read()] == [p for _, p in payloads(55)]


def test_refused_payloads_keep_their_place(tmp_path):
    from dqcep.io.journal import Refused
    j = Journal(tmp_path)
    j.append("t", b"a")
    j.append("big", Refused(70_000_000))
    j.append("t", b"b")
    j.commit()
    assert [r[:3] for r in j.read()] == [(0, "t", b"a"), (1, "big", Refused(70_000_000)),
                                         (2, "t", b"b")]


def test_trim_deletes_only_what_every_consumer_is_past(tmp_path):
    j = journal_of(tmp_path, 100)
    before = sorted(tmp_path.glob("*.seg"))
    assert j.trim() == 0                          # no consumer registered: keep all
    j.checkpointed("service", 50)
    j.checkpointed("spark", 30)
    assert j.trim() > 0
    left = sorted(tmp_path.glob("*.seg"))
    assert int(left[0].stem) <= 30 < int(left[1].stem) and len(left) < len(before)
    assert [o for o, *_ in tail_all(tmp_path, j.durable_offset, start=30)] == \
        list(range(30, 100))
    j.checkpointed("spark", 100)
    j.checkpointed("service", 100)
    total = sum(p.stat().st_size for p in sorted(tmp_path.glob("*.seg"))[-3:])
    j.trim(keep_bytes=total)                      # retention keeps the newest bytes
    assert len(list(tmp_path.glob("*.seg"))) == 3


def test_format_2_records_keep_arrival_and_packet_id_and_older_ones_are_read(tmp_path):
    import struct
    import zlib

    import msgpack

    from dqcep.io.journal import FORMAT_FILE, FORMAT_VERSION
    # a format-1 journal: three-field bodies, no FORMAT file
    old = tmp_path / "old"
    old.mkdir()
    body = msgpack.packb([0, "t", b"before"], use_bin_type=True)
    (old / "00000000000000000000.open").write_bytes(
        struct.pack("<II", len(body), zlib.crc32(body)) + body)
    j = Journal(old)
    assert (old / FORMAT_FILE).read_text() == f"{FORMAT_VERSION}\n"
    j.append("t", b"after", arrival_us=1_764_151_200_000_123, mid=7)
    j.commit()
    assert [tuple(r) for r in j.read()] == [(0, "t", b"before", None, None),
                                            (1, "t", b"after", 1_764_151_200_000_123, 7)]
    j.close()


def test_a_journal_of_a_newer_format_is_refused_with_one_line(tmp_path):
    from dqcep.core.errors import UserError
    from dqcep.io.journal import FORMAT_FILE
    from dqcep.io.journal_tail import JournalTail
    (tmp_path / FORMAT_FILE).write_text("9\n")
    for open_it in (Journal, JournalTail, lambda d: list(read_journal(d))):
        with pytest.raises(UserError, match="is format 9; this dqcep reads formats up to 2"):
            open_it(tmp_path)


def test_a_segment_closed_while_a_tail_lists_the_journal_is_not_lost(tmp_path, monkeypatch):
    """The writer closes a segment (renames it from .open to .seg) and starts the next
    while a tail lists the directory: the closed one was once in neither listing, and
    the tail took the one after it for its successor (its records read as lost; seen
    under load in the service's full-disk test)."""
    from dqcep.io.journal_tail import JournalTail
    j = Journal(tmp_path, segment_bytes=300)
    for topic, p in payloads(12):                # a closed segment and an open one
        j.append(topic, p)
        j.commit()
    assert len(list(tmp_path.glob("*.seg"))) >= 1
    tail = JournalTail(tmp_path, 0)
    seen = list(tail.read(j.durable_offset))
    assert [o for o, *_ in seen] == list(range(12))

    def commit_until_a_segment_closes(start):
        """Commits records from ``start`` on until the open segment is closed and
        one more record is in the next; returns the offset after them."""
        opened = tmp_path / next(n for n in os.listdir(tmp_path) if n.endswith(".open"))
        while opened.exists():
            j.append(*payloads(1, start)[0])
            j.commit()
            start += 1
        j.append(*payloads(1, start)[0])
        j.commit()
        return start + 1
    upto = commit_until_a_segment_closes(12)  # the tail's segment closed, the next open
    real_glob, raced = type(tmp_path).glob, []

    def glob_while_the_writer_rolls(self, pattern):
        found = list(real_glob(self, pattern))
        if not raced and tail._file is not None:  # the tail looks for its next segment
            raced.append(commit_until_a_segment_closes(upto))
        return iter(found)
    monkeypatch.setattr(type(tmp_path), "glob", glob_while_the_writer_rolls)
    seen = list(tail.read(upto))
    monkeypatch.undo()
    seen += list(tail.read(j.durable_offset))
    assert raced and gaps(seen) == []
    assert [o for o, *_ in seen] == list(range(12, raced[0]))


def blocks_and_records(directory, upto, start=0, max_records=7, stop_prefix="stop",
                       cache=None):
    """What a kernel consumer reads: blocks where ``block`` gives them, else one record
    from ``read``; as records, in order (``cache``: blocks shared with other tails)."""
    from dqcep.io.journal_tail import JournalTail
    tail, out = JournalTail(directory, start, cache), []
    while True:
        block = tail.block(upto, max_records, stop_prefix)
        if block is not None:
            assert block.first == tail.offset - block.count
            out += [block.record(i) for i in range(block.count)]
            continue
        record = next(tail.read(upto), None)
        if record is None:
            return out
        out.append(record)


@pytest.mark.parametrize("damage", [None, "body", "length", "cut"])
@pytest.mark.parametrize("start", [0, 33])
def test_blocks_read_what_records_read_around_damage_and_segment_ends(tmp_path, damage, start):
    from dqcep.io.journal import Refused
    j = Journal(tmp_path, segment_bytes=2048)
    for i in range(120):
        topic = ("stop", "stop/tick")[i % 2] if i % 17 == 5 else f"t/{i % 3}"
        payload = Refused(1000 + i) if i % 13 == 4 else f"payload {i}".encode() * (1 + i % 5)
        j.append(topic, payload, None if i % 11 == 3 else 1_000_000 + i,
                 None if i % 7 == 2 else i % 65536)
        if i % 10 == 9:
            j.commit()  # (a segment is closed by a commit)
    seg = sorted(tmp_path.glob("*.seg"))[1]
    pos, _ = record_starts(seg)[2]
    if damage == "cut":
        with open(seg, "r+b") as f:
            f.truncate(pos + 5)
    elif damage:
        flip(seg, pos + (12 if damage == "body" else 1))
    j.append("t/late", b"not durable yet")  # appended, not committed: not read
    want = tail_all(tmp_path, j.durable_offset, start)
    assert blocks_and_records(tmp_path, j.durable_offset, start) == want
    assert blocks_and_records(tmp_path, 60, start) == tail_all(tmp_path, 60, start)
    # tails that share their blocks (a worker's consumers): one up to 60 first, then
    # one to the end, one with smaller blocks, one from the start: the same records
    from dqcep.io.journal_tail import BlockCache
    cache = BlockCache(keep=1000)
    assert blocks_and_records(tmp_path, 60, start, cache=cache) == \
        tail_all(tmp_path, 60, start)
    assert blocks_and_records(tmp_path, j.durable_offset, start, cache=cache) == want
    assert blocks_and_records(tmp_path, j.durable_offset, start, max_records=3,
                              cache=cache) == want
    assert blocks_and_records(tmp_path, j.durable_offset, 0, cache=cache) == \
        tail_all(tmp_path, j.durable_offset, 0)
    assert blocks_and_records(tmp_path, 60, start, cache=cache) == \
        tail_all(tmp_path, 60, start)  # (the cache holds blocks past 60 now)


def test_a_block_read_is_sized_by_the_records_it_takes(tmp_path, monkeypatch):
    """A block reads about as many bytes as its records took before (at least
    MIN_BLOCK_BYTES), and a record longer than that read gets a read as long as a
    block may be: every record comes in a block, as ``read`` gives it."""
    import dqcep.io.journal_tail as jt
    monkeypatch.setattr(jt, "MIN_BLOCK_BYTES", 64)
    j = Journal(tmp_path)
    for i in range(200):
        j.append(f"t/{i % 3}", b"x" * (5000 if i % 50 == 49 else 1 + i % 20), 1_000 + i)
    j.commit()
    tail = jt.JournalTail(tmp_path, 0)
    tail._open(sorted(tmp_path.glob("*.open"))[0])
    tail._file = counted = CountedReads(tail._file)
    got = []
    while (block := tail.block(j.durable_offset, 16, "stop")) is not None:
        got += [block.record(i) for i in range(block.count)]
    assert got == tail_all(tmp_path, j.durable_offset, 0)
    reads = counted.reads
    assert max(reads) == jt.BLOCK_BYTES and reads.count(jt.BLOCK_BYTES) <= 2 * 4
    assert sorted(reads)[len(reads) // 2] < 1024  # 16 records of ~15 bytes: not 4 MiB


class CountedReads:
    """A file whose reads are counted (the sizes asked for)."""

    def __init__(self, f):
        self.f, self.reads = f, []

    def read(self, n=-1):
        self.reads.append(n)
        return self.f.read(n)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_tails_that_share_blocks_scan_each_run_of_records_once(tmp_path):
    """A worker's consumers read every record each: with a BlockCache a run of records
    is read and scanned by the first tail at it; the next takes the same block."""
    import dqcep.io.journal_tail as journal_tail
    from dqcep.io.journal_tail import BlockCache, JournalTail
    j = Journal(tmp_path)
    for i in range(100):
        j.append(f"t/{i % 3}", f"payload {i}".encode())
    j.commit()
    scanned = []
    real = journal_tail.scan_records

    def counting(data, *args):
        scanned.append(len(data))
        return real(data, *args)
    journal_tail.scan_records = counting
    try:
        cache = BlockCache()
        tails = [JournalTail(tmp_path, 0, cache) for _ in range(3)]
        got = [[], [], []]
        for upto in (40, 100):
            for i, tail in enumerate(tails):
                while (block := tail.block(upto, 16, "stop")) is not None:
                    got[i].append((block.first, block.count))
        plain = JournalTail(tmp_path, 0)
        alone = []
        for upto in (40, 100):
            while (block := plain.block(upto, 16, "stop")) is not None:
                alone.append((block.first, block.count))
    finally:
        journal_tail.scan_records = real
    assert got[0] == got[1] == got[2] == alone
    assert len(scanned) == 2 * len(alone)  # the shared tails' scans, then plain's own
    # a block is taken only where it fits: below the caller's upto, within its
    # max_records, from the same place of the same segment
    short = JournalTail(tmp_path, 0, cache)
    assert [(b.first, b.count) for b in iter(lambda: short.block(30, 16, "stop"), None)] \
        == [(0, 16), (16, 14)]
    small = JournalTail(tmp_path, 0, cache)
    assert small.block(100, 8, "stop").count == 8
    elsewhere = BlockCache()
    first = JournalTail(tmp_path, 0, elsewhere).block(100, 16, "stop")
    segment, start, end, stop, block = elsewhere._blocks[0]
    elsewhere._blocks[0] = (segment, start + 1, end, stop, block)  # as if another place
    assert JournalTail(tmp_path, 0, elsewhere).block(100, 16, "stop") is not first
