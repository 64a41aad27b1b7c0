"""dqcep experiment: the quick run end to end (a process per point, CSV, PNG,
markdown), determinism of the non-measured columns, and bad options."""
from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from dqcep.experiments import point

# Each test here starts processes: the quick run leaves them out. The tests of the
# quick run share one process: its fixture (20 s of experiments) runs once per test
# process under pytest-xdist.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("experiments")]

MEASURED = {"seconds_median", "seconds_min", "seconds_max", "events_per_s", "p50_ms",
            "p99_ms", "rss_base_bytes", "rss_peak_bytes", "rss_growth_bytes"}


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fixed(rows_):
    return [{k: v for k, v in r.items() if k not in MEASURED} for r in rows_]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("experiments")
    proc = subprocess.run([sys.executable, "-m", "dqcep", "experiment", "all", "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_a_point_that_fails_says_why():
    """A point's process sends back the traceback of what stopped it (in a process of its
    own here: the fork server lives as long as the process that started it)."""
    failing = ("from dqcep.experiments.run import _point, _points; "
               "_point(_points(), {'engine': 'nope', 'workload': 'iot', 'events': 10, "
               "'seed': 1})")
    proc = subprocess.run([sys.executable, "-c", failing], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert "RuntimeError: experiment point {'engine': 'nope'" in proc.stderr, proc.stderr
    assert "ValueError: unknown engine 'nope'" in proc.stderr, proc.stderr


def test_all_quick_writes_every_result(quick):
    out, proc = quick
    for name in ("fig3", "fig4", "sharing", "latency"):
        for ext in ("csv", "png", "md"):
            assert (out / f"{name}.{ext}").stat().st_size > 0
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "fig3" in proc.stderr and "point" in proc.stderr  # the progress bar
    fig4 = rows(out / "fig4.csv")
    assert {r["engine"] for r in fig4} == {"native", "on-demand", "sase", "reference"}
    assert {r["query"] for r in fig4 if r["workload"] == "uniform"} == \
        {"all", "u2_key", "u3_key_pred", "u3_eq", "u4_neg"}  # each query alone, too
    assert "every engine found the same number of matches" in (out / "fig4.md").read_text()
    assert "same matches" in (out / "sharing.md").read_text()
    sharing = {(r["queries"], r["engine"]): r for r in rows(out / "sharing.csv")}
    assert int(sharing[("20", "native")]["vertices"]) < int(sharing[("20", "separate")]["vertices"])
    for r in rows(out / "fig3.csv"):
        assert int(r["peak_state_bytes"]) > 0 and int(r["rss_peak_bytes"]) >= int(r["rss_base_bytes"])
    for r in rows(out / "latency.csv"):
        assert 0 < float(r["p50_ms"]) <= float(r["p99_ms"]) and int(r["matches"]) > 0


def test_same_seed_same_csv_apart_from_measurements(quick, tmp_path):
    out, _ = quick
    subprocess.run([sys.executable, "-m", "dqcep", "experiment", "fig3", "--quick", "--out",
                    str(tmp_path)], check=True, capture_output=True, timeout=300)
    assert fixed(rows(tmp_path / "fig3.csv")) == fixed(rows(out / "fig3.csv"))
    other = tmp_path / "seed2"
    subprocess.run([sys.executable, "-m", "dqcep", "experiment", "fig3", "--quick", "--seed",
                    "2", "--out", str(other)], check=True, capture_output=True, timeout=300)
    assert fixed(rows(other / "fig3.csv")) != fixed(rows(out / "fig3.csv"))


def test_latency_counts_from_the_event_that_completes_the_match():
    """A trailing NOT holds a match until an event after start + W arrives: the
    latency point must find that chunk, so latencies stay small and positive."""
    from dqcep.experiments.workloads import WORKLOADS
    from dqcep.lang import parse
    w = WORKLOADS["iot"]
    queries = [q for q in parse(w.queries).queries if q.name == "site_walk"]
    assert point._holds_back(queries).tolist() == [True]
    r = point._latency("native", w, queries, 5000, 1, 500)
    # no match is emitted before its last needed event arrived
    assert r["matches"] > 0 and 0 <= r["min_ms"] <= r["p50_ms"] <= r["p99_ms"]


def test_bad_options(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "dqcep", "experiment", "fig3", "--sizes",
                          "ten", "--out", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "--sizes" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "dqcep", "experiment", "fig9", "--out",
                          str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
