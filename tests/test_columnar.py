"""The columnar readers (dqcep.io.columnar) against the validator path (read_events):
on hypothesis-made files with malformed records mixed in, the same events (as the
engine's columns), the same errors with the same positions, the same matches."""
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqcep.io.columnar import read_columns
from dqcep.io.readers import EventInputError
from dqcep.runtime import EventColumns
from dqcep.runtime.compile import KIND_STR
from tests.test_ingest_kernels import engine, payloads


def outcome(path: Path, fast: bool, chunk_rows: int, skip: bool = True):
    """(rows, errors, the error that stopped the reading) of one reading of a file;
    rows hold string values, not codes (two engines code them apart)."""
    e = engine()
    errors, rows, stopped, pieces = [], [], None, 0
    try:
        for piece in read_columns(str(path), "msgpack", e.column_decoder() if fast else None,
                                  errors.append if skip else None, chunk_rows):
            pieces += 1
            cols = EventColumns(*piece) if isinstance(piece, tuple) else \
                EventColumns(*e._columns_from_events(piece))
            for i in range(len(cols.ts)):
                cells = tuple((int(k), e.dictionary.values[int(v)] if k == KIND_STR else float(v))
                              for k, v in zip(cols.kind[i], cols.val[i]))
                rows.append((int(cols.ts[i]), int(cols.id[i]), int(cols.type[i]), cells))
    except EventInputError as err:
        stopped = str(err)
    # a reading that stops fails the run: what came before it is not compared
    return rows if stopped is None else None, [str(x) for x in errors], stopped


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(records=st.lists(st.one_of(payloads(good=True), payloads()), max_size=8),
       chunk_rows=st.integers(1, 6), skip=st.booleans())
def test_msgpack_files_fast_path_equals_the_validator(tmp_path_factory, records, chunk_rows,
                                                      skip):
    path = tmp_path_factory.mktemp("columnar") / "events.msgpack"
    path.write_bytes(b"".join(records))
    assert outcome(path, True, chunk_rows, skip) == outcome(path, False, chunk_rows, skip)


def test_a_clean_file_is_all_columns_and_a_bad_record_alone_takes_the_validator(tmp_path):
    good = [msgpack.packb({"events": [{"type": "A", "ts": t, "id": t, "p": 1, "s": "x"}
                                      for t in range(k, k + 3)]}) for k in (0, 3)]
    bad = msgpack.packb({"events": [{"type": "B", "ts": 9, "id": 9, "q": 1, "ok": True},
                                    {"type": "B", "ts": "late", "id": 10}]})
    path = tmp_path / "e.msgpack"
    path.write_bytes(good[0] + bad + good[1])
    e, errors = engine(), []
    pieces = list(read_columns(str(path), None, e.column_decoder(), errors.append))
    kinds = [type(p).__name__ for p in pieces]
    assert kinds == ["tuple", "list", "tuple"]
    assert [p.id for p in pieces[1]] == [9]
    assert [str(x) for x in errors] == [
        f"{path}:record 2 (byte {len(good[0])}) event 1: event 'ts' must be an integer, "
        "got 'late'"]
    assert list(pieces[0][1]) == [0, 1, 2] and list(pieces[2][1]) == [3, 4, 5]


@pytest.mark.parametrize("cut", [1, 5])
def test_a_broken_stream_stops_where_the_validator_stops(tmp_path, cut):
    good = msgpack.packb({"type": "A", "ts": 1, "id": 1})
    path = tmp_path / "e.msgpack"
    path.write_bytes(good + good[:-cut] if cut < len(good) else good)
    e = engine()
    with pytest.raises(EventInputError, match=r"record 2 \(byte \d+\): truncated msgpack"):
        list(read_columns(str(path), None, e.column_decoder()))


def test_dqcep_run_gives_the_same_matches_from_msgpack_and_json_lines(tmp_path):
    """The columnar msgpack path and the JSON Lines path of ``dqcep run``, on a stream
    with every imperfection of the generator."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parent.parent
    queries = root / "dqcep" / "data" / "iot.cep"
    outs = []
    for fmt in ("msgpack", "jsonl"):
        events = tmp_path / f"e.{fmt}"
        subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n",
                        "30000", "--seed", "5", "--plant", str(queries), "--quiet",
                        "--out-of-order", "0.1", "--slack", "300", "--late", "0.01",
                        "--duplicates", "0.01", "--malformed", "0.002", "--batch-size", "100",
                        "-o", str(events)], check=True)
        r = subprocess.run([sys.executable, "-m", "dqcep", "run", str(queries), "--input",
                            str(events), "--lateness", "300", "--on-bad-event", "skip",
                            "--chunk-size", "1000"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        # the order of matches depends on how the input is cut into batches
        outs.append((sorted(r.stdout.splitlines()), r.stderr.count("skipped:")))
    assert outs[0] == outs[1] and outs[0][0] and outs[0][1]
