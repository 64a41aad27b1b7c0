"""Generator: determinism, distributions, planted ground truth, imperfections, formats, MQTT."""
import io
import json
import re
import subprocess
import sys
import time
import tracemalloc
from collections import Counter

import msgpack
import numpy as np
import pytest

from dqcep.core.batch import EventBatch
from dqcep.io.readers import read_events
from dqcep.lang import parse_file
from dqcep.baseline.reference import ReferenceMatcher
from dqcep.generator import (GeneratorConfig, Imperfections, IotConfig, Planting, StreamGenerator,
                       UniformConfig, generate)
from dqcep.generator.config import load_scenario
from dqcep.generator.profiles import SENSORS, StockConfig, StockProfile
from tests.support.broker import subscribed
from tests.support.paths import ROOT

IMPERFECT = Imperfections(out_of_order=0.1, slack=300, late=0.02, late_max=2000,
                          duplicates=0.02, missing_attributes=0.05, malformed=0.01,
                          clock_skew=50)


def cli(*args, check=True):
    r = subprocess.run([sys.executable, "-m", "dqcep", "generate", *map(str, args)],
                       capture_output=True, cwd=ROOT)
    if check:
        assert r.returncode == 0, r.stderr.decode()
    return r


def whole(batches) -> EventBatch:
    return EventBatch.concat(list(batches))


def same(a: EventBatch, b: EventBatch):
    assert a.schema == b.schema
    for name in ("id", "ts", "type"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    for k in a.columns:
        np.testing.assert_array_equal(a.columns[k], b.columns[k])
    np.testing.assert_array_equal(a.malformed, b.malformed)


# ------------------------------------------------------------------ determinism


@pytest.mark.parametrize("profile", ["iot", "stock", "uniform"])
def test_chunk_size_does_not_change_the_events(profile):
    cfg = dict(profile=profile, events=150_000, seed=11, imperfections=IMPERFECT)
    ref = whole(generate(GeneratorConfig(**cfg), 65_536))
    for chunk in (1_000, 7_919, 200_000):
        got = list(generate(GeneratorConfig(**cfg), chunk))
        assert all(len(b) == chunk for b in got[:-1])
        same(whole(got), ref)
    assert len(np.unique(ref.id)) == 150_000


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["jsonl", "msgpack", "csv", "parquet"])
def test_same_arguments_same_bytes(tmp_path, fmt):
    args = ["--profile", "iot", "-n", 30_000, "--seed", 5, "--format", fmt, "--quiet",
            "--out-of-order", 0.1, "--duplicates", 0.01, "--malformed", 0.01]
    a, b = tmp_path / f"a.{fmt}", tmp_path / f"b.{fmt}"
    cli(*args, "-o", a)
    cli(*args, "-o", b)
    assert a.read_bytes() == b.read_bytes()
    c = tmp_path / f"c.{fmt}"
    cli(*args[:5], 6, *args[6:], "-o", c)
    assert c.read_bytes() != a.read_bytes()  # another seed, another stream


@pytest.mark.integration
def test_stdout_equals_file(tmp_path):
    out = tmp_path / "e.jsonl"
    cli("--profile", "stock", "-n", 2000, "--quiet", "-o", out)
    r = cli("--profile", "stock", "-n", 2000, "--quiet")
    assert r.stdout == out.read_bytes()


# ---------------------------------------------------------------- distributions


def test_uniform_type_frequencies_attributes_and_rate():
    cfg = UniformConfig(types=4, attributes=2, domain=10, keys=3, event_rate=500)
    b = whole(generate(GeneratorConfig(profile="uniform", events=200_000, seed=1,
                                       profile_config=cfg)))
    freq = np.bincount(b.type) / len(b)
    assert np.allclose(freq, 0.25, atol=0.005)
    assert b.columns["a0"].min() == 0 and b.columns["a0"].max() == 9
    assert 0 <= b.columns["x"].min() and b.columns["x"].max() < 1
    assert set(np.unique(b.columns["key"])) == {0, 1, 2}
    assert abs(np.mean(b.columns["x"] < 0.3) - 0.3) < 0.005   # selectivity knob
    span_s = (b.ts[-1] - b.ts[0]) / 1000
    assert abs(len(b) / span_s - 500) / 500 < 0.02
    assert np.all(np.diff(b.ts) >= 0)  # no imperfections: event-time order


def test_uniform_zipf_frequencies():
    cfg = UniformConfig(types=5, zipf=1.0)
    b = whole(generate(GeneratorConfig(profile="uniform", events=200_000, seed=2,
                                       profile_config=cfg)))
    freq = np.bincount(b.type) / len(b)
    expect = (1 / np.arange(1, 6)) / (1 / np.arange(1, 6)).sum()
    assert np.allclose(freq, expect, atol=0.005)


def test_iot_devices_values_and_rates():
    cfg = IotConfig(sites=2, rooms=3, devices={"Temperature": 2, "Smoke": 1, "Door": 1},
                    rates={"Temperature": 2.0, "Smoke": 1.0, "Door": 0.5})
    g = StreamGenerator(GeneratorConfig(profile="iot", events=120_000, seed=3,
                                        profile_config=cfg))
    b = whole(g.batches())
    types = np.array(g.schema.types)[b.type]
    # per-type share follows devices x rate: T 2x2.0, S 1x1.0, D 1x0.5 (per room)
    share = Counter(types.tolist())
    assert abs(share["Temperature"] / len(b) - 4 / 5.5) < 0.01
    assert abs(share["Door"] / len(b) - 0.5 / 5.5) < 0.005
    assert set(share) == {"Temperature", "Smoke", "Door"}
    for sensor in ("Temperature", "Smoke"):
        attr, _, lo, hi = SENSORS[sensor][:4]
        v = b.columns[attr][types == sensor]
        assert lo <= v.min() and v.max() <= hi and not np.isnan(v).any()
        assert len(np.unique(v)) > 100  # a process, not a constant
    devices = np.array(g.schema.dictionary("device"))[b.columns["device"]]
    rooms = np.array(g.schema.dictionary("room"))[b.columns["room"]]
    assert all(d.startswith(r + "/") for d, r in zip(devices[:1000], rooms[:1000]))
    assert len(set(devices.tolist())) == 2 * 3 * 4
    door = b.columns["open"][types == "Door"]
    assert set(np.unique(door)) == {0, 1}


def test_stock_ticks():
    b = whole(generate(GeneratorConfig(profile="stock", events=50_000, seed=4)))
    sch = b.schema
    assert (np.array(sch.types)[b.type] == np.array(sch.dictionary("symbol"))[
        b.columns["symbol"]]).all()
    assert (b.columns["price"] > 0).all() and (b.columns["volume"] % 100 == 0).all()
    assert np.bincount(b.type)[0] > np.bincount(b.type)[-1]  # Zipf popularity


def test_stock_ticks_named_with_integer_prices_as_sase_streams(tmp_path):
    """examples/sase-stock.toml: SASE's stock1..stock3, equally popular, integer prices
    drawn from 1..1000 for every tick; a bad knob is a clear error."""
    cfg = load_scenario(str(ROOT / "examples" / "sase-stock.toml"), {"events": 30_000})
    b = whole(generate(cfg))
    assert b.schema.types == ("stock1", "stock2", "stock3")
    price = b.columns["price"]
    assert price.dtype.kind == "i" and price.min() >= 1 and price.max() <= 1000
    assert len(np.unique(price)) > 900  # not a walk: the whole range is drawn
    assert np.bincount(b.type).min() > 9000
    ev = b.to_events()[0]
    assert isinstance(ev.attrs["price"], int) and ev.type == ev.attrs["symbol"]
    for bad, message in ((dict(symbols=2, names=("x",)), "1 names for 2 symbols"),
                         (dict(min_price=5.0, max_price=5.0), "min_price < max_price"),
                         (dict(price_step=0.0), "price_step")):
        with pytest.raises(ValueError, match=message):
            StockProfile(StockConfig(**bad))
    walk = whole(generate(GeneratorConfig(profile="stock", events=5_000, seed=1,
                                          profile_config=StockConfig(price_step=0.5))))
    assert (walk.columns["price"] * 2 == np.round(walk.columns["price"] * 2)).all()


# --------------------------------------------------------------------- planting


def test_planted_occurrences_are_found_by_the_reference_matcher(tmp_path):
    queries = ROOT / "dqcep" / "data" / "iot.cep"
    cfg = GeneratorConfig(profile="iot", events=20_000, seed=9,
                          plant=Planting(queries=str(queries), every=130_000))
    g = StreamGenerator(cfg)
    events = whole(g.batches(5_000)).to_events()
    assert g.summary.occurrences >= 6 and len(g.truth) == g.summary.occurrences
    assert {t["query"] for t in g.truth} == {"overheating", "intrusion", "stuffy"}
    found = {(m.query, frozenset(m.events))
             for m in ReferenceMatcher(parse_file(queries).queries).run(events)}
    for t in g.truth:
        assert (t["query"], frozenset(t["events"].items())) in found, t
    planted_ids = {i for t in g.truth for i in t["events"].values()}
    assert g.summary.planted_events >= len(planted_ids)


@pytest.mark.integration
def test_planting_cli_writes_ground_truth(tmp_path):
    out = tmp_path / "s.jsonl"
    r = cli("--profile", "iot", "-n", 10_000, "--plant", ROOT / "dqcep" / "data" / "iot.cep",
            "--plant-query", "intrusion", "--plant-every", 20_000, "-o", out)
    truth = [json.loads(x) for x in (tmp_path / "s.jsonl.truth.jsonl").read_text().splitlines()]
    assert truth and all(t["query"] == "intrusion" for t in truth)
    assert f"{len(truth)} occurrences" in r.stderr.decode()


@pytest.mark.integration
def test_planting_errors_are_user_errors(tmp_path):
    r = cli("--profile", "uniform", "-n", 10, "--plant", ROOT / "dqcep" / "data" / "iot.cep",
            "-o", tmp_path / "x.jsonl", check=False)
    assert r.returncode == 2 and b"profile uniform has no event type" in r.stderr
    r = cli("--profile", "iot", "-n", 10, "--plant", ROOT / "dqcep" / "data" / "iot.cep",
            "--plant-every", 1000, "-o", tmp_path / "x.jsonl", check=False)
    assert r.returncode == 2 and b"must be more than 2 x (window + clock skew)" in r.stderr
    q = tmp_path / "impossible.cep"
    q.write_text("PATTERN SEQ(Temperature a, Temperature b) WHERE a.value > 1000 WITHIN 1 s")
    r = cli("--profile", "iot", "-n", 10, "--plant", q, "-o", tmp_path / "x.jsonl", check=False)
    assert r.returncode == 2 and b"could not plant query" in r.stderr
    r = cli("-n", 10, "--plant", q, check=False)
    assert r.returncode == 2 and b"--truth FILE" in r.stderr


# ----------------------------------------------------------------- imperfections


@pytest.mark.integration
def test_imperfection_fractions_as_set(tmp_path):
    out = tmp_path / "s.msgpack"
    n = 100_000
    r = cli("--profile", "iot", "-n", n, "--seed", 8, "-o", out, "--out-of-order", 0.1,
            "--slack", 300, "--late", 0.02, "--late-max", 2000, "--duplicates", 0.02,
            "--missing-attributes", 0.05, "--malformed", 0.01, "--clock-skew", 50)
    counts = _summary_counts(r.stderr.decode())
    errors = []
    events = [e for _, e in read_events(str(out), on_error=errors.append)]
    # every record is there: n events plus the duplicate copies
    assert len(events) + len(errors) == n + counts["duplicates"]
    assert abs(counts["duplicates"] / n - 0.02) < 0.003
    assert abs(counts["malformed"] / n - 0.01) < 0.002
    # the reader sees each malformed record (and a duplicated one twice)
    assert counts["malformed"] <= len(errors) <= counts["malformed"] * 1.1
    ids = Counter(e.id for e in events)
    assert sum(c - 1 for c in ids.values()) <= counts["duplicates"]
    # arrival order vs event time: late events show up as ts inversions beyond the slack
    late, max_ts = 0, -1
    for e in events:
        if e.ts < max_ts - 300 - 2 * 50:
            late += 1
        max_ts = max(max_ts, e.ts)
    assert 0.01 < late / n < 0.03
    # missing attributes: an iot event carries device, room, site and one value
    missing = sum(1 for e in events if len(e.attrs) < 4)
    assert abs(missing / len(events) - 0.05) < 0.005


def _summary_counts(stderr: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(duplicates|malformed) (\d+)", stderr)}


# ---------------------------------------------------------------------- formats


@pytest.mark.integration
def test_every_format_decodes_to_the_same_events(tmp_path):
    cfg = GeneratorConfig(profile="iot", events=3_000, seed=12)
    expect = whole(generate(cfg)).to_events()
    for fmt in ("jsonl", "msgpack", "csv"):
        out = tmp_path / f"e.{fmt}"
        cli("--profile", "iot", "-n", 3000, "--seed", 12, "--quiet", "-o", out)
        got = [e for _, e in read_events(str(out))]
        assert got == expect, fmt
    import pyarrow.parquet as pq
    out = tmp_path / "e.parquet"
    cli("--profile", "iot", "-n", 3000, "--seed", 12, "--quiet", "-o", out)
    table = pq.read_table(out).to_pylist()
    assert [r["id"] for r in table] == [e.id for e in expect]
    assert table[0]["room"] == expect[0].attrs["room"]


@pytest.mark.integration
def test_msgpack_payloads_are_batches_of_batch_size(tmp_path):
    out = tmp_path / "e.msgpack"
    cli("--profile", "uniform", "-n", 2500, "--batch-size", 1000, "--quiet", "-o", out)
    payloads = list(msgpack.Unpacker(open(out, "rb"), raw=False))
    assert [len(p["events"]) for p in payloads] == [1000, 1000, 500]


def test_bounded_memory():
    def peak(n):
        tracemalloc.start()
        for _ in generate(GeneratorConfig(profile="iot", events=n, seed=1,
                                          imperfections=IMPERFECT), 10_000):
            pass
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top
    small, large = peak(200_000), peak(1_000_000)
    assert large < 1.3 * small, (small, large)


# ------------------------------------------------------------------------- MQTT


def test_publish_to_mosquitto_every_event_arrives(mosquitto, tmp_path):
    host, port = mosquitto
    topic = "dqcep/test/generate"
    with subscribed(host, port, topic, "test-sub") as received:
        n = 25_000
        args = ["--profile", "iot", "-n", n, "--seed", 3, "--batch-size", 500,
                "--duplicates", 0.01, "--malformed", 0.006]
        r = cli(*args, "-o", f"mqtt://{host}:{port}/{topic}")
        assert b"to mqtt://" in r.stderr
        # the same stream written to stdout: what must arrive
        expected = cli(*args, "--format", "msgpack", "--quiet").stdout
        file_events = [e for p in msgpack.Unpacker(io.BytesIO(expected), raw=False)
                       for e in p["events"]]
        want = sorted(e["id"] for e in file_events if isinstance(e, dict))
        broken = sum(1 for e in file_events if not isinstance(e, dict))
        assert broken > 0
        deadline = time.monotonic() + 30
        while len(received) < len(want) // 500 + broken and time.monotonic() < deadline:
            time.sleep(0.05)
        got, undecodable = [], 0
        for payload in list(received):
            try:
                batch = msgpack.unpackb(payload, raw=False)
            except (msgpack.ExtraData, msgpack.FormatError, ValueError):
                undecodable += 1
                continue
            got += [e["id"] for e in batch["events"]]
        assert sorted(got) == want
        assert len(set(got)) == n - broken  # every event but the undecodable ones, by id
        assert undecodable == broken        # those arrive as payloads that do not decode


@pytest.mark.integration
def test_mqtt_errors(tmp_path):
    from tests.support.broker import free_port
    r = cli("-n", 10, "-o", f"mqtt://127.0.0.1:{free_port()}/t", "--quiet", check=False)
    assert r.returncode == 2 and b"cannot connect to the MQTT broker" in r.stderr
    r = cli("-n", 10, "-o", "mqtt://127.0.0.1:1883/", check=False)
    assert r.returncode == 2 and b"names no topic" in r.stderr
    r = cli("-n", 10, "-o", "mqtt://127.0.0.1:1883/t", "--format", "jsonl", check=False)
    assert r.returncode == 2 and b"MQTT output is msgpack" in r.stderr


@pytest.mark.integration
def test_scenario_file_and_its_errors(tmp_path):
    sc = tmp_path / "s.toml"
    sc.write_text('profile = "uniform"\nevents = 500\nseed = 3\n[uniform]\ntypes = 2\n'
                  '[imperfections]\nduplicates = 0.5\n')
    out = tmp_path / "e.jsonl"
    r = cli("--scenario", sc, "-o", out, "--events", 400)
    lines = out.read_text().splitlines()
    assert len({json.loads(x)["id"] for x in lines}) == 400 and len(lines) > 500
    assert {json.loads(x)["type"] for x in lines} == {"T0", "T1"}
    assert b"duplicates" in r.stderr
    sc.write_text('profile = "uniform"\n[uniform]\ntypez = 2\n')
    r = cli("--scenario", sc, check=False)
    assert r.returncode == 2 and b"uniform: unknown key(s) typez" in r.stderr
    sc.write_text('[imperfections]\nduplicates = 1.5\n')
    r = cli("--scenario", sc, check=False)
    assert r.returncode == 2 and b"imperfections.duplicates must be a fraction" in r.stderr
    js = tmp_path / "s.json"
    js.write_text('{"profile": "iot", ')
    r = cli("--scenario", js, check=False)
    assert r.returncode == 2 and b"invalid JSON" in r.stderr


@pytest.mark.integration
def test_planting_the_bundled_queries_needs_no_plant_every(tmp_path):
    """The default spacing follows the queries' windows (it was a fixed 10 s, which
    iot.cep's 1-minute negation refused; issue 15, item 5)."""
    import subprocess
    import sys
    root = ROOT
    out, truth = tmp_path / "s.jsonl", tmp_path / "t.jsonl"
    r = subprocess.run([sys.executable, "-m", "dqcep", "generate", "--plant",
                        str(root / "dqcep" / "data" / "iot.cep"), "-n", "20000", "--quiet",
                        "--truth", str(truth), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    planted = [json.loads(x) for x in truth.read_text().splitlines()]
    assert planted and len({p["query"] for p in planted}) > 1
