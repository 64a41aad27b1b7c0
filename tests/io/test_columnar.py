"""The columnar readers (dqcep.io.columnar) against the validator path (read_events):
on hypothesis-made files with malformed records mixed in, the same events (as the
engine's columns), the same errors with the same positions, the same matches."""
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dqcep.core.events import TS_LIMIT
from dqcep.io.columnar import read_columns
from dqcep.io.readers import EventInputError
from dqcep.runtime import EventColumns
from dqcep.runtime.compile import KIND_STR
from tests.support.msgpack_payloads import engine, payloads
from tests.support.examples import examples
from tests.support.paths import ROOT


def rows_of(piece, e) -> list:
    """The rows of a piece (columns or Events) with string values, not codes (two
    engines code strings apart)."""
    cols = EventColumns(*piece) if isinstance(piece, tuple) else \
        e.columns(piece)
    return [(int(cols.ts[i]), int(cols.id[i]), int(cols.type[i]),
             tuple((int(k), e.dictionary.values[int(v)] if k == KIND_STR else float(v))
                   for k, v in zip(cols.kind[i], cols.val[i])))
            for i in range(len(cols.ts))]


def file_outcome(path: Path, fmt: str, fast: bool):
    """(rows, errors) of one reading of a file that skips bad records."""
    e, errors = engine(), []
    rows = [r for piece in read_columns(str(path), fmt, e if fast else None, errors.append)
            for r in rows_of(piece, e)]
    return rows, [str(x) for x in errors]


def outcome(path: Path, fast: bool, chunk_rows: int, skip: bool = True):
    """(rows, errors, the error that stopped the reading) of one reading of a file;
    rows hold string values, not codes (two engines code them apart)."""
    e = engine()
    errors, rows, stopped = [], [], None
    try:
        for piece in read_columns(str(path), "msgpack", e if fast else None,
                                  errors.append if skip else None, chunk_rows):
            rows += rows_of(piece, e)
    except EventInputError as err:
        stopped = str(err)
    # a reading that stops fails the run: what came before it is not compared
    return rows if stopped is None else None, [str(x) for x in errors], stopped


@settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))
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
    pieces = list(read_columns(str(path), None, e, errors.append))
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
        list(read_columns(str(path), None, e))


@pytest.mark.integration
def test_dqcep_run_gives_the_same_matches_from_every_format(tmp_path):
    """The columnar msgpack, Parquet, JSON Lines and CSV paths of ``dqcep run``, on a
    stream with every imperfection of the generator."""
    import subprocess
    import sys
    root = ROOT
    queries = root / "dqcep" / "data" / "iot.cep"
    outs = []
    for fmt in ("msgpack", "jsonl", "parquet", "csv"):
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
    assert outs[2][0] == outs[0][0]  # the generator writes no malformed rows to Parquet
    assert outs[3][0] == outs[0][0] and outs[3][1]


# ------------------------------------------------------------------ Parquet

def _parquet_column(draw, name: str, n: int):
    """A column of n cells for field ``name``: mostly what the validator accepts,
    sometimes not (nulls in required fields, non-finite floats, odd types)."""
    import pyarrow as pa
    nulls = st.one_of(st.none(), st.none(), st.just("value"))
    if name == "type":
        kind = draw(st.sampled_from(["str", "str", "str", "int"]))
        values = draw(st.lists(st.sampled_from(["A", "B", "C", "", None] if kind == "str"
                                               else [1, 2]), min_size=n, max_size=n))
        if kind == "str" and draw(st.booleans()):
            values = [v or "A" for v in values]
        return pa.array(values, pa.string() if kind == "str" else pa.int64())
    if name in ("ts", "id"):
        kind = draw(st.sampled_from(["int64", "int64", "uint64", "int32", "float"]))
        big = TS_LIMIT + 1 if name == "ts" else 2**63
        ints = st.integers(0, 2**64 - 1) if kind == "uint64" else \
            st.integers(-2**31, 2**31 - 1) if kind == "int32" else st.integers(-big, big - 1) \
            if draw(st.booleans()) else st.integers(-2**63, 2**63 - 1)
        cells = st.floats(allow_nan=False) if kind == "float" else ints
        values = draw(st.lists(st.one_of(cells, cells, cells, st.none())
                               if draw(st.integers(0, 3)) == 0 else cells, min_size=n, max_size=n))
        return pa.array(values, {"int64": pa.int64(), "uint64": pa.uint64(), "int32": pa.int32(),
                                 "float": pa.float64()}[kind])
    kind = draw(st.sampled_from(["int", "float", "str", "bool", "binary", "null"]))
    cells = {"int": st.integers(-2**63, 2**63 - 1), "float": st.floats(width=32),
             "str": st.sampled_from(["x", "y", "", "ü"]), "bool": st.booleans(),
             "binary": st.binary(max_size=2), "null": st.none()}[kind]
    values = draw(st.lists(st.one_of(cells, st.none()), min_size=n, max_size=n))
    return pa.array(values, {"int": pa.int64(), "float": pa.float32(), "str": pa.string(),
                             "bool": pa.bool_(), "binary": pa.binary(), "null": pa.null()}[kind])


@st.composite
def parquet_tables(draw):
    import pyarrow as pa
    n = draw(st.integers(0, 6))
    names = draw(st.lists(st.sampled_from(["p", "q", "s", "ok", "other"]), unique=True,
                          max_size=4))
    required = [x for x in ("type", "ts", "id") if draw(st.integers(0, 12)) > 0]
    columns = {name: _parquet_column(draw, name, n) for name in required + names}
    return pa.table(columns)




@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(tables=st.lists(parquet_tables(), min_size=1, max_size=3))
def test_parquet_files_fast_path_equals_the_validator(tmp_path_factory, tables):
    import pyarrow.parquet as pq
    path = tmp_path_factory.mktemp("columnar") / "events.parquet"
    schema = tables[0].schema
    tables = [t for t in tables if t.schema.equals(schema)]
    with pq.ParquetWriter(path, schema) as w:
        for t in tables:  # one row group each
            w.write_table(t)
    assert file_outcome(path, "parquet", True) == file_outcome(path, "parquet", False)


# ------------------------------------------------------------------ JSON Lines

JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                        st.floats(allow_nan=False, allow_infinity=False),
                        st.sampled_from(["x", "y", "", "ü", "\u20ac"]))


@st.composite
def json_lines(draw):
    """A line of JSON Lines text: mostly an event, sometimes anything that breaks it."""
    import json
    obj = {"type": draw(st.sampled_from(["A", "B", "C", ""])),
           "ts": draw(st.integers(-TS_LIMIT, TS_LIMIT)), "id": draw(st.integers(-2**63, 2**63 - 1))}
    for k in draw(st.lists(st.sampled_from(["p", "q", "s", "ok", "other"]), max_size=4)):
        obj[k] = draw(JSON_VALUES)
    odd = draw(st.integers(0, 40))
    if odd == 1:
        del obj[draw(st.sampled_from(["type", "ts", "id"]))]
    elif odd == 2:
        obj[draw(st.sampled_from(["ts", "id", "type", "p"]))] = draw(st.one_of(
            st.floats(), st.text(max_size=2), st.none(), st.integers(2**63, 2**64),
            st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=1),
                                                                      st.integers(), max_size=1)))
    line = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    if odd == 3:
        line = draw(st.sampled_from(["", "   ", "\t", "garbage", "[1, 2]", "5", "null"]))
    elif odd == 4:
        line = line + " " + line  # two objects on one line
    elif odd == 5:
        line = line.replace('"type"', '"p": 1, "p"', 1)  # a repeated key
    elif odd == 6:
        line = line.replace(", ", ",\t", 1)
    elif odd == 7:
        line = line[:-1] + ', "s": "\\ud800"}'  # a lone surrogate
    elif odd == 8:
        line = line[:-1] + ', "p": NaN}'
    elif odd == 9:
        line = "\ufeff" + line
    elif odd == 10:
        line = line[:draw(st.integers(0, len(line)))]
    ending = draw(st.sampled_from(["\n"] * 8 + ["\r\n", "\r"]))
    return line + ending




@settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(json_lines(), max_size=12), block=st.sampled_from([32, 200, 1 << 22]),
       last_newline=st.booleans())
def test_json_lines_fast_path_equals_the_validator(tmp_path_factory, lines, block,
                                                  last_newline):
    import dqcep.io.columnar as columnar
    text = "".join(lines)
    if not last_newline:
        text = text.rstrip("\r\n")
    path = tmp_path_factory.mktemp("columnar") / "events.jsonl"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    with pytest.MonkeyPatch.context() as mp:  # blocks cut between lines anywhere
        mp.setattr(columnar, "JSON_BLOCK_BYTES", block)
        mp.setattr(columnar, "FAST_PATH_MIN_BYTES", 0)  # small files too
        assert file_outcome(path, "jsonl", True) == file_outcome(path, "jsonl", False)


def test_a_line_that_opens_no_object_goes_to_the_validator(tmp_path):
    """pyarrow 26's JSON reader crashes the process on a block of "null" lines: such
    lines never reach it."""
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'null\r\n{"type": "A", "ts": 1, "id": 1}\n')
    e, errors = engine(), []
    pieces = list(read_columns(str(path), None, e, errors.append))
    assert [str(x) for x in errors] == [f"{path}:1:1: an event must be a map/object, got NoneType"]
    ids = [int(i) for p in pieces for i in (p[1] if isinstance(p, tuple) else
                                            [ev.id for ev in p])]
    assert ids == [1]


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_small_text_file_is_read_without_pyarrow(tmp_path, fmt):
    """Below FAST_PATH_MIN_BYTES the validator reads the file: `dqcep run` on a small
    file does not pay for importing pyarrow (and the pandas its conversions load);
    above it, the fast path's columns."""
    import subprocess
    import sys

    from dqcep.io.columnar import FAST_PATH_MIN_BYTES
    rows = ["id,type,ts,p"] + [f"{i},A,{i},{i % 7}" for i in range(1, 8000)] if fmt == "csv" \
        else [f'{{"id": {i}, "type": "A", "ts": {i}, "p": {i % 7}}}' for i in range(1, 8000)]
    small, large = tmp_path / f"small.{fmt}", tmp_path / f"large.{fmt}"
    small.write_text("\n".join(rows[:50]) + "\n")
    large.write_text("\n".join(rows) + "\n")
    assert small.stat().st_size < FAST_PATH_MIN_BYTES <= large.stat().st_size
    probe = ("import sys; from tests.support.msgpack_payloads import engine; "
             "from dqcep.io.columnar import read_columns; "
             "p = list(read_columns(sys.argv[1], None, engine())); "
             "print(sum(isinstance(x, tuple) for x in p), 'pyarrow' in sys.modules)")
    for path, expected in ((small, "0 False"), (large, "1 True")):
        out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True,
                             text=True, check=True, cwd=str(ROOT))
        assert out.stdout.split() == expected.split(), (path, out.stdout, out.stderr)


CSV_ODD_CELLS = st.sampled_from(["+5", "-0", "007", "5.", ".5", "+.5e-3", "1e999", "-1E5",
                                 "FALSE", "True", "nan", "inf", "", " ", " 5", "1_0", "0x10",
                                 "\u0663", str(10**20), "-" + str(2**63)])
CSV_CLEAN_CELLS = st.one_of(
    st.integers(-10**15, 10**15).map(str), st.sampled_from(["true", "false", "", "x", "é"]),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters='",'),
            max_size=3))
CSV_CELLS = st.one_of(CSV_CLEAN_CELLS, CSV_CLEAN_CELLS, CSV_CLEAN_CELLS, CSV_ODD_CELLS)


@st.composite
def csv_files(draw):
    """A CSV event file: header (sometimes odd), rows (sometimes broken)."""
    header = ["id", "type", "ts"] + draw(st.lists(st.sampled_from(["p", "q", "s", "ok", "other"]),
                                                  unique=True, max_size=3))
    header = draw(st.permutations(header))
    odd_header = draw(st.integers(0, 30))
    if odd_header == 1:
        header = header[1:]          # a required column missing
    elif odd_header == 2:
        header = header + [header[0]]  # a repeated column
    lines = [",".join(header)]
    for _ in range(draw(st.integers(0, 10))):
        row = []
        for name in header:
            if name == "type":
                row.append(draw(st.sampled_from(["A", "B", "C", "Z", "A", "B"] * 4 + [""])))
            elif name in ("ts", "id"):
                row.append(str(draw(st.integers(-TS_LIMIT, TS_LIMIT))) if draw(st.integers(0, 30))
                           else draw(CSV_CELLS))
            else:
                row.append(draw(CSV_CELLS))
        odd = draw(st.integers(0, 60))
        if odd == 1:
            row = row[:-1]           # too few cells
        elif odd == 2:
            row = [" "] * len(row)   # a blank row: skipped
        elif odd == 3:
            row[0] = '"' + row[0] + '"'  # quoting: the rest goes to the validator
        elif odd == 4:
            row[-1] = row[-1] + "\x01"
        lines.append(",".join(row))
        if draw(st.integers(0, 20)) == 1:
            lines.append("")         # an empty line
    ending = draw(st.sampled_from(["\n"] * 6 + ["\r\n", "\r"]))
    text = ending.join(lines) + draw(st.sampled_from([ending, ""]))
    return text.encode("utf-8") + (b"\xff\n" if draw(st.integers(0, 30)) == 1 else b"")


@settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=csv_files(), block=st.sampled_from([16, 64, 1 << 22]))
def test_csv_fast_path_equals_the_validator(tmp_path_factory, data, block):
    import dqcep.io.columnar as columnar
    path = tmp_path_factory.mktemp("columnar") / "events.csv"
    path.write_bytes(data)

    def reading(fast):
        try:
            return file_outcome(path, "csv", fast), None
        except EventInputError as err:  # a bad header stops both alike
            return None, str(err)

    with pytest.MonkeyPatch.context() as mp:  # blocks cut between lines anywhere
        mp.setattr(columnar, "CSV_BLOCK_BYTES", block)
        mp.setattr(columnar, "FAST_PATH_MIN_BYTES", 0)  # small files too
        assert reading(True) == reading(False)


def test_a_clean_csv_file_is_all_columns(tmp_path, monkeypatch):
    import dqcep.io.columnar as columnar
    monkeypatch.setattr(columnar, "FAST_PATH_MIN_BYTES", 0)
    path = tmp_path / "e.csv"
    path.write_text("id,type,ts,p,s\n1,A,5,1.5,x\n2,B,6,,true\n3,A,7,+4,y\n")
    e = engine()
    pieces = list(read_columns(str(path), None, e))
    assert pieces and all(isinstance(p, tuple) for p in pieces)
    assert file_outcome(path, "csv", True) == file_outcome(path, "csv", False)
