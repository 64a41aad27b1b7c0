"""Event readers: every format, and a positioned error for every kind of bad record;
the match line formatters."""
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dqcep.core.events import Event
from dqcep.io.readers import EventInputError, read_events
from dqcep.core.errors import UserError
from tests.support.examples import examples
from tests.support.paths import ROOT


def events(path, fmt=None):
    return [e for _, e in read_events(str(path), fmt)]


def test_jsonl(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_text('{"id": 1, "type": "T", "ts": 5, "room": "r1", "v": 2.5, "ok": true, '
                 '"gone": null}\n\n{"id": 2, "type": "U", "ts": -3}\n')
    assert events(p) == [Event(1, "T", 5, {"room": "r1", "v": 2.5, "ok": True}),
                         Event(2, "U", -3, {})]


def test_msgpack_single_events_and_batches(tmp_path):
    p = tmp_path / "e.msgpack"
    p.write_bytes(msgpack.packb({"id": 1, "type": "T", "ts": 5, "x": 1})
                  + msgpack.packb({"events": [{"id": 2, "type": "T", "ts": 6},
                                              {"id": 3, "type": "U", "ts": 7, "s": "a"}]}))
    assert events(p) == [Event(1, "T", 5, {"x": 1}), Event(2, "T", 6, {}),
                         Event(3, "U", 7, {"s": "a"})]


def test_csv_typed_cells(tmp_path):
    p = tmp_path / "e.csv"
    p.write_text("id,type,ts,room,v,ok\n1,T,5,r1,2.5,true\n2,7,6,,3,FALSE\n")
    assert events(p) == [Event(1, "T", 5, {"room": "r1", "v": 2.5, "ok": True}),
                         Event(2, "7", 6, {"v": 3, "ok": False})]


BAD_JSONL = [
    ('{"id": 1, "type": "T", "ts": 5', "1:31", "invalid JSON: Expecting ',' delimiter"),
    ('{"id": 1, "ts": 5}', "1:1", "event has no 'type'"),
    ('{"id": 1, "type": "", "ts": 5}', "1:1", "'type' must be a non-empty string"),
    ('{"id": 1, "type": "T"}', "1:1", "event has no 'ts'"),
    ('{"id": 1, "type": "T", "ts": 5.5}', "1:1", "'ts' must be an integer, got 5.5"),
    ('{"id": 1, "type": "T", "ts": true}', "1:1", "'ts' must be an integer, got True"),
    ('{"type": "T", "ts": 5}', "1:1", "event has no 'id'"),
    ('{"id": 1, "type": "T", "ts": 99999999999999999999}', "1:1", "does not fit in 64 bits"),
    ('{"id": 1, "type": "T", "ts": 5, "v": [1]}', "1:1", "attribute 'v' must be a number"),
    ('{"id": 1, "type": "T", "ts": 5, "v": 18446744073709551616}', "1:1",
     "attribute 'v' 18446744073709551616 does not fit in 64 bits"),
    ('{"id": 1, "type": "T", "ts": 5, "v": NaN}', "1:1", "NaN is not a valid number"),
    ('[1, 2]', "1:1", "an event must be a map/object, got list"),
]


@pytest.mark.parametrize("line,where,reason", BAD_JSONL)
def test_bad_jsonl_records_are_positioned(tmp_path, line, where, reason):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": 0, "type": "T", "ts": 1}\n' + line + "\n")
    with pytest.raises(EventInputError) as info:
        events(p)
    line_no, col = where.split(":")
    assert info.value.where == f"{int(line_no) + 1}:{col}"
    assert reason in info.value.reason
    assert str(info.value).startswith(f"{p}:{int(line_no) + 1}:{col}: ")


def test_on_error_reports_and_goes_on(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": 0, "type": "T", "ts": 1}\nnot json\n{"id": 1, "ts": 2}\n'
                 '{"id": 2, "type": "T", "ts": 3}\n')
    errors = []
    got = [e.id for _, e in read_events(str(p), on_error=errors.append)]
    assert got == [0, 2]
    assert [e.where for e in errors] == ["2:1", "3:1"]


def test_bad_msgpack(tmp_path):
    p = tmp_path / "bad.msgpack"
    good = msgpack.packb({"id": 1, "type": "T", "ts": 5})
    p.write_bytes(good + msgpack.packb({"events": [{"id": 2, "type": "T"}]}))
    at = rf"record 2 \(byte {len(good)}\)"
    with pytest.raises(EventInputError, match=at + " event 0: event has no 'ts'"):
        events(p)
    p.write_bytes(good + good[:-3])
    with pytest.raises(EventInputError, match=at + ": truncated"):
        events(p)
    p.write_bytes(good + b"\xc1")
    with pytest.raises(EventInputError, match=at + ": invalid msgpack"):
        events(p)
    p.write_bytes(msgpack.packb({"events": 5}))
    with pytest.raises(EventInputError, match="must be a list"):
        events(p)


def test_bad_csv(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("id,type,value\n1,T,3\n")
    with pytest.raises(EventInputError, match=r":1:1: CSV header lacks column\(s\) ts"):
        events(p)
    p.write_text("id,type,ts\n1,T,3\n2,T\n")
    with pytest.raises(EventInputError, match=r":3:1: row has 2 cells, the header has 3"):
        events(p)
    p.write_text("id,type,ts\n1,T,x\n")
    with pytest.raises(EventInputError, match=r":2:1: event 'ts' must be an integer, got 'x'"):
        events(p)


def test_format_selection(tmp_path):
    p = tmp_path / "e.txt"
    p.write_text('{"id": 1, "type": "T", "ts": 5}\n')
    with pytest.raises(UserError, match="cannot tell the format"):
        events(p)
    assert events(p, "jsonl") == [Event(1, "T", 5, {})]
    with pytest.raises(UserError, match="cannot read event file"):
        events(tmp_path / "missing.jsonl")
    p2 = tmp_path / "e.jsonl"
    p2.write_bytes(b'{"id": 1, "type": "\xff", "ts": 5}\n')
    with pytest.raises(EventInputError, match="not UTF-8"):
        events(p2)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.tuples(
    st.integers(-2**63, 2**63 - 1), st.lists(st.integers(-1, 2**63 - 1), min_size=3,
                                             max_size=3)), max_size=6)), max_size=4),
       st.integers(1, 400))
def test_match_lines_writes_what_match_line_writes(parts, buffer_size):
    """The columnar formatter and the per-Match one agree byte for byte, unbound
    variables (OR branches) left out, names escaped as JSON; written to a file a
    buffer at a time (``write_match_lines``, as a file sink writes) too."""
    from dqcep.io.match_text import match_line, match_lines
    from dqcep.runtime import MatchBatch
    queries = (("q", ("a", "b", "c")), ('quoted "q" ü', ("x", "é", "z_1")), ("r", ("u", "v", "w")))
    batch = MatchBatch(queries, [
        (q, np.array([d for d, _ in rows], np.int64),
         np.array([ids for _, ids in rows], np.int64).reshape(len(rows), 3), None)
        for q, rows in parts])
    assert match_lines(batch).decode() == "".join(match_line(m) + "\n"
                                                  for m in batch.to_matches())
    assert written_a_buffer_at_a_time(batch, buffer_size) == match_lines(batch)


def test_a_failed_write_of_match_lines_is_an_oserror_with_its_errno(tmp_path):
    """The kernel writes without the GIL: a write the system refuses comes back as the
    OSError a Python write would raise (the sink names the file). A stream without a
    descriptor (stdout captured by an embedding program) is written as before."""
    import errno
    import os
    from dqcep.io.match_text import write_match_lines
    from dqcep.io.sinks import FileMatchSink
    from dqcep.runtime import MatchBatch
    batch = MatchBatch((("q", ("a",)),), [(0, np.array([5], np.int64),
                                            np.array([[7]], np.int64), None)])
    fd = os.open(tmp_path / "read-only", os.O_RDONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError) as err:
            write_match_lines(batch, fd, np.empty(64, np.uint8))
        assert err.value.errno == errno.EBADF
    finally:
        os.close(fd)
    import io
    sink = FileMatchSink(str(tmp_path / "m.jsonl"))
    sink.f.close()
    sink.f = io.BytesIO()  # a stream without a descriptor (a captured stdout)
    sink.write_batch(batch)
    assert sink.f.getvalue() == b'{"query": "q", "detected_at": 5, "events": {"a": 7}}\n'
    sink._lines = None
    sink.f = open(tmp_path / "m.jsonl", "rb")  # a file the sink cannot write
    with pytest.raises(OSError) as err:
        sink.write_batch(batch)
    assert err.value.filename == str(tmp_path / "m.jsonl")


def written_a_buffer_at_a_time(batch, buffer_size: int) -> bytes:
    """What ``write_match_lines`` writes to a file through a buffer of ``buffer_size``
    bytes (as a file sink writes), and says it wrote."""
    import tempfile
    from dqcep.io.match_text import write_match_lines
    with tempfile.TemporaryFile() as f:
        written = write_match_lines(batch, f.fileno(), np.empty(buffer_size, np.uint8))
        f.seek(0)
        text = f.read()
    assert written == len(text)
    return text


@pytest.mark.integration
def test_parquet_reads_what_the_generator_wrote(tmp_path):
    import subprocess
    import sys
    for ext in ("jsonl", "parquet"):
        subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n",
                        "500", "--missing-attributes", "0.1", "--quiet", "-o",
                        str(tmp_path / f"e.{ext}")], check=True)
    assert events(tmp_path / "e.parquet") == events(tmp_path / "e.jsonl")
    where = [w for w, _ in read_events(str(tmp_path / "e.parquet"))]
    assert where[:2] == ["row 1", "row 2"]
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(EventInputError, match="invalid Parquet"):
        events(tmp_path / "bad.parquet")


def test_msgpack_map_as_a_map_key_is_a_positioned_error(tmp_path):
    """Found by hypothesis: {{"events": []}: ...} is valid msgpack but unhashable."""
    path = tmp_path / "e.msgpack"
    path.write_bytes(b"\x81" + b"\x81\xa6events\x90" * 2)
    with pytest.raises(EventInputError, match=r"record 1 \(byte 0\): invalid msgpack"):
        events(path)


@pytest.mark.parametrize("url, topic", [
    ("mqtt://localhost:1883/sensors/#", "sensors/#"),
    ("mqtt://localhost/sensors/+/temperature", "sensors/+/temperature"),
    ("mqtt://h/#", "#"),
    ("mqtt://h/+", "+"),
    ("mqtt://h/a/b?c", "a/b?c"),          # '?' is a topic character, not a URL query
    ("mqtt://h/a%23b", "a%23b"),          # taken literally, never percent-decoded
    ("mqtts://u@h:8884/x/y/", "x/y/"),
])
def test_mqtt_url_keeps_the_topic_filter_as_written(url, topic):
    from dqcep.io.mqtt import MqttUrl
    assert MqttUrl.parse(url, subscribe=True).topic == topic


@pytest.mark.parametrize("url, subscribe, reason", [
    ("mqtt://h/sensors/#/x", True, "'#' must be a whole level and the last one"),
    ("mqtt://h/sensors#", True, "'#' must be a whole level"),
    ("mqtt://h/a/b+/c", True, "'+' must be a whole level"),
    ("mqtt://h/sensors/#", False, "cannot hold the wildcards"),
    ("mqtt://h/a/+/c", False, "cannot hold the wildcards"),
    ("mqtt://h/a\0b", True, "NUL"),
    ("mqtt://h/", True, "names no topic"),
    ("mqtt://h", True, "names no topic"),
    ("mqtt:///topic", True, "names no host"),
    ("mqtt://h:99999/t", True, "invalid port"),
    ("mqtt://u:pw@h/t", True, "put no password"),
    ("http://h/t", True, "not an MQTT URL"),
    ("mqtt://h/" + "a" * 70_000, True, "at most 65,535 bytes"),
])
def test_mqtt_url_that_cannot_mean_a_topic_is_refused(url, subscribe, reason):
    from dqcep.io.mqtt import MqttUrl
    import re
    with pytest.raises(UserError, match=re.escape(reason)):
        MqttUrl.parse(url, subscribe=subscribe)


def test_background_sink_keeps_the_order_and_raises_a_failed_write():
    from dqcep.io.sinks import BackgroundSink

    class Sink:
        def __init__(self, fail_at=None):
            self.got, self.fail_at, self.closed = [], fail_at, False

        def write_batch(self, batch):
            if len(self.got) == self.fail_at:
                raise OSError(28, "No space left on device", "m.jsonl")
            self.got.append(batch)

        def close(self):
            self.closed = True

    inner = Sink()
    sink = BackgroundSink(inner, depth=2)
    for i in range(100):
        sink.write_batch([i])
    sink.close()
    assert inner.got == [[i] for i in range(100)] and inner.closed

    inner = Sink(fail_at=3)
    sink = BackgroundSink(inner, depth=2)
    with pytest.raises(OSError, match="No space left"):
        try:  # as dqcep run does: the failure comes from a later write_batch
            for i in range(100):
                sink.write_batch([i])
        finally:
            sink.close()
    assert inner.got == [[0], [1], [2]] and inner.closed and not sink.thread.is_alive()


def test_background_sink_syncs_where_synced_was_asked_while_the_caller_goes_on():
    """``synced``: the writer thread syncs once every batch given before is written,
    and hands the length to ``then`` (an asynchronous checkpoint); batches given after
    it are not in it. A failed write before it fails it; a failing ``then`` fails it
    and is raised by the next call."""
    import threading
    from dqcep.io.sinks import BackgroundSink

    class Sink:
        def __init__(self, fail_at=None):
            self.got, self.fail_at, self.gate = [], fail_at, threading.Event()

        def write_batch(self, batch):
            self.gate.wait(10)  # the writer is slow until the test lets it go
            if len(self.got) == self.fail_at:
                raise OSError(28, "No space left on device", "m.jsonl")
            self.got.append(batch)

        def sync(self):
            return len(self.got)

        def close(self):
            pass

    inner = Sink()
    sink = BackgroundSink(inner, depth=8)
    seen = []
    sink.write_batch([0])
    sink.write_batch([1])
    done = sink.synced(lambda length: seen.append(length) or "written")
    sink.write_batch([2])  # the caller went on: not held up by the sync
    assert not done.done()
    inner.gate.set()
    assert done.result(10) == "written" and seen == [2]
    sink.close()
    assert inner.got == [[0], [1], [2]]

    inner = Sink(fail_at=1)
    inner.gate.set()
    sink = BackgroundSink(inner, depth=8)
    sink.write_batch([0])
    sink.write_batch([1])
    done = sink.synced(lambda length: seen.append(length))
    with pytest.raises(OSError, match="No space left"):
        done.result(10)
    assert seen == [2]  # then was not called
    with pytest.raises(OSError, match="No space left"):
        sink.close()

    sink = BackgroundSink(Sink(), depth=8)
    sink.sink.gate.set()

    def failing(length):
        raise OSError(5, "Input/output error", "ck")
    with pytest.raises(OSError, match="Input/output"):
        sink.synced(failing).result(10)
    with pytest.raises(OSError, match="Input/output"):
        sink.write_batch([3])
    sink.close()


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.lists(st.tuples(
    st.integers(-2**63, 2**63 - 1), st.lists(st.integers(-1, 2**63 - 1), min_size=2, max_size=2),
    st.lists(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=5), min_size=2,
             max_size=2)), max_size=5), max_size=3), st.integers(1, 400))
def test_match_lines_writes_kleene_lists_as_match_line_does(parts, buffer_size):
    """Kleene lists (spec 5.1): the kernel writes each list as a JSON array of its ids,
    byte for byte what the per-Match formatter writes, beside plain and unbound ids."""
    from dqcep.io.match_text import match_line, match_lines
    from dqcep.runtime import MatchBatch
    from dqcep.runtime.eventtime import LIST_ID, MatchLists
    queries = (("k", ("a", "t[]x", "b", "u")),)
    built = []
    for rows in parts:
        ids = np.array([[plain[0], LIST_ID, plain[1], LIST_ID] for _, plain, _ in rows],
                       np.int64).reshape(len(rows), 4)
        cells = [lst for _, _, lists in rows for lst in lists]
        offsets = np.cumsum([0] + [len(c) for c in cells]).astype(np.int64)
        values = np.array([x for c in cells for x in c], np.int64)
        built.append((0, np.array([d for d, _, _ in rows], np.int64), ids,
                      MatchLists((1, 3), offsets, values)))
    batch = MatchBatch(queries, built)
    assert match_lines(batch).decode() == "".join(match_line(m) + "\n"
                                                  for m in batch.to_matches())
    assert written_a_buffer_at_a_time(batch, buffer_size) == match_lines(batch)


@pytest.mark.integration
def test_a_walked_directory_leaves_out_the_generators_ground_truth(tmp_path):
    """docs/spark.md's quick start generates events/iot.msgpack with its ground truth
    beside it (events/iot.msgpack.truth.jsonl); `dqcep spark run --input events/` read
    the truth as events (35 dead letters). A walked directory leaves it out; named
    alone, a file is read as given."""
    import subprocess
    import sys
    from dqcep.io.readers import list_event_files
    events = tmp_path / "events"
    r = subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n",
                        "2000", "--plant", "dqcep/data/iot.cep", "--plant-every", "130000",
                        "--quiet", "-o", str(events / "iot.msgpack")],
                       cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert (events / "iot.msgpack.truth.jsonl").is_file()
    assert list_event_files([str(events)]) == [str((events / "iot.msgpack").resolve())]
    truth = str(events / "iot.msgpack.truth.jsonl")
    assert list_event_files([truth]) == [str(Path(truth).resolve())]
