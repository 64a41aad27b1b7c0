"""What per-device timelines cost (spec section 7, ``--timeline device --skew``).

10^6 readings of 10^4 devices (``device``: "dev-0".."dev-9999", a reading every ms, up
to 80 ms out of order, ``--lateness 100``), one query over them (a device's reading
rising by more than 5 within 2 s). Two paths, each in three configurations,
alternating over ``--repeat`` rounds: ``--lateness 100`` alone; with ``--skew 60000``
(one timeline: the reorder buffer holds 60 s of readings, as any skew makes it); and
with ``--timeline device --skew 60000`` (10^4 timelines):

- ``engine``: ``Engine.process`` over the readings as engine columns, 65,536 a batch
  (the admission kernel, the reorder buffer and the matching; no reading of input);
- ``dqcep run``: the command on a JSON Lines file of the readings, end to end (its
  ingest, the engine, the output file), as a user runs it.

Each prints events/s per round and the median ratios of ``--timeline`` to the other two
(target >= 0.9x: issue 52); the one to the same ``--skew`` is what the timelines cost.

    python3 bench/bench_time.py [--events N] [--devices D] [--repeat R]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUERY = ("QUERY rise PATTERN SEQ(T a, T b) WHERE b.device = a.device AND b.v > a.v + 5 "
         "WITHIN 2 s")
LATENESS, SKEW = 100, 60_000
TARGET = 0.9


def readings(n: int, devices: int, seed: int = 5):
    rng = np.random.default_rng(seed)
    ts = np.arange(n, dtype=np.int64) + 1_000_000 + rng.integers(0, 80, n)
    device = rng.integers(0, devices, n)
    value = rng.normal(20, 4, n).round(1)
    return ts, device, value


def rule_of(config: str):
    from dqcep.core.admission import AdmissionRule
    return {"lateness": AdmissionRule(LATENESS), "skew": AdmissionRule(LATENESS, SKEW),
            "timeline": AdmissionRule(LATENESS, SKEW, "device")}[config]


def options_of(config: str) -> list[str]:
    return ["--lateness", str(LATENESS)] + \
        {"lateness": [], "skew": ["--skew", str(SKEW)],
         "timeline": ["--skew", str(SKEW), "--timeline", "device"]}[config]


def engine_rate(ts, device, value, config: str) -> float:
    from dqcep.lang import parse
    from dqcep.plan import build_plan
    from dqcep.runtime import Engine, EventColumns
    from dqcep.runtime.compile import KIND_NUM, KIND_STR

    engine = Engine(build_plan(parse(QUERY).queries), rule_of(config))
    attrs = engine.attrs
    codes = np.array([engine.dictionary.code(f"dev-{d}") for d in range(device.max() + 1)],
                     np.float64)
    n = len(ts)
    val = np.zeros((n, len(attrs)), np.float64)
    kind = np.zeros((n, len(attrs)), np.int8)
    val[:, attrs.index("device")], kind[:, attrs.index("device")] = codes[device], KIND_STR
    val[:, attrs.index("v")], kind[:, attrs.index("v")] = value, KIND_NUM
    cols = EventColumns(ts, np.arange(1, n + 1, dtype=np.int64), np.zeros(n, np.int32), val,
                        kind)
    started = time.perf_counter()
    matches = 0
    for a in range(0, n, 65_536):
        matches += len(engine.process(cols.take(slice(a, a + 65_536))))
    matches += len(engine.flush())
    elapsed = time.perf_counter() - started
    assert engine.late == 0 and matches > 0, (engine.late, matches)
    return n / elapsed


def run_rate(path: Path, out: Path, n: int, config: str) -> float:
    options = options_of(config)
    started = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "dqcep", "run", str(path.parent / "q.cep"),
                        "--input", str(path), "-o", str(out), *options],
                       capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if r.returncode != 0 or r.stderr:
        raise SystemExit(f"dqcep run failed: {r.stderr}")
    return n / elapsed


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    ts, device, value = readings(args.events, args.devices)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "q.cep").write_text(QUERY + "\n")
        path = tmp / "readings.jsonl"
        with open(path, "w") as f:
            for i, (t, d, v) in enumerate(zip(ts.tolist(), device.tolist(), value.tolist())):
                f.write(f'{{"id": {i + 1}, "type": "T", "ts": {t}, "device": "dev-{d}", '
                        f'"v": {v}}}\n')
        rates: dict[str, list[float]] = {}
        for r in range(args.repeat):
            for config in ("lateness", "skew", "timeline"):  # alternating: the load falls
                rates.setdefault(f"engine {config}", []).append(      # on all of them
                    engine_rate(ts, device, value, config))
                rates.setdefault(f"dqcep run {config}", []).append(
                    run_rate(path, tmp / "out.jsonl", args.events, config))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items()),
                  flush=True)
    print(f"{args.events:,} readings of {args.devices:,} devices; events/s, median of "
          f"{args.repeat} rounds:")
    for path in ("engine", "dqcep run"):
        many = rates[f"{path} timeline"]
        line = f"  {path:<10}"
        for config in ("lateness", "skew"):
            line += f" {' '.join(options_of(config)):<28} {statistics.median(rates[f'{path} {config}']):>11,.0f}"
        line += f"  --timeline device {statistics.median(many):>11,.0f}"
        print(line)
        for config in ("lateness", "skew"):
            ratio = statistics.median(a / b for a, b in zip(many, rates[f"{path} {config}"]))
            print(f"    --timeline device --skew {SKEW} / {' '.join(options_of(config))}: "
                  f"{ratio:.2f}x (target >= {TARGET}x: {'met' if ratio >= TARGET else 'NOT met'})")


if __name__ == "__main__":
    main()
