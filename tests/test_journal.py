"""Journal: offsets across segments, torn-tail recovery, replay from an offset, SIGKILL."""
import os
import signal
import subprocess
import sys
import time

import pytest

from dqcep.errors import UserError
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
    names = sorted(x.name for x in tmp_path.iterdir())
    assert len(names) > 5 and names[-1].endswith(".open")
    assert all(n.endswith(".seg") for n in names[:-1])
    firsts = [int(n.split(".")[0]) for n in names]
    assert firsts == sorted(firsts) and firsts[0] == 0
    got = list(j.read())
    assert [(t, p) for _, t, p in got] == payloads(100) and [o for o, _, _ in got] == list(range(100))
    assert [o for o, _, _ in j.read(57)] == list(range(57, 100))
    closed = list(read_journal(tmp_path))          # only closed segments
    assert closed and [o for o, _, _ in closed] == list(range(len(closed)))
    j.close()
    assert [o for o, _, _ in read_journal(tmp_path)] == list(range(100))
    assert not list(tmp_path.glob("*.open"))
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
    assert [p for _, _, p in j2.read(9)] == [payloads(10)[9][1], b"after"]


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
    (tmp_path / "00000000000000000000.open").touch()
    (tmp_path / "00000000000000000005.open").touch()
    with pytest.raises(UserError, match="2 open segments"):
        Journal(tmp_path)


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
    assert [p for _, _, p in records] == [b"event %d" % i for i in range(len(records))]


def test_tail_follows_appends_and_segment_rolls(tmp_path):
    from dqcep.io.journal import JournalTail
    j = Journal(tmp_path, segment_bytes=300)
    tail = JournalTail(tmp_path, 0)
    seen = []
    for start in range(0, 200, 13):
        for topic, p in payloads(13, start):
            j.append(topic, p)
        j.commit()
        seen += [(o, t, p) for o, t, p in tail.read(j.durable_offset)]
    assert seen == list(j.read()) and len(seen) == len(payloads(13)) * 16
    assert len(list(tmp_path.glob("*.seg"))) > 10
    late = JournalTail(tmp_path, 150)   # starting in the middle of a closed segment
    assert [o for o, _, _ in late.read(j.durable_offset)] == list(range(150, 208))
    assert list(late.read(j.durable_offset)) == []
