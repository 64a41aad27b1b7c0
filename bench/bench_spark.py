"""The Spark batch job against the embedded engine, on one generated stream.

Generates N IoT events (dqcep/data/iot.cep planted) as one msgpack file and the
same bytes split into F files (the Spark source reads one file per task), then
times, each in its own process:

- embedded: ``dqcep run iot.cep -i events.msgpack`` (reader + native engine);
- Spark with 1 executor (``local-cluster[1,1,1024]``) and with 2 executors
  (``local-cluster[2,1,1024]``), keyed partitioning (iot.cep is keyed by room);
- Spark with 2 executors and time slices for every query
  (``--partitioning time``): recall and duplicate rate against the embedded
  engine's matches, and the overlap overhead (event copies / events).

Spark figures time ``run_batch`` only (the session is started before). The
target from the Spark issue: 2 executors / 1 executor >= 1.7.

``--model`` instead measures what decides scale-out and predicts the rest (after
CEPSim, a simulator of cloud CEP): the same job with event logs on local[1],
local[2], one executor with 2 cores and two executors with 1 core; per stage the
task time per event (the work, which more executors must not grow: within
1.2x; compared both on N events and on the N more events of a second run with 2N,
where what each executor pays once cancels), the skew (largest / mean task) and the
tasks; the job's fixed cost; and a
model of the wall time on N executors x C cores, checked against the runs made
here and printed for 4, 8 and 32 executors (see ``predict``).

``--formats`` times the job (one executor with 2 cores) on the same stream as one
file of each input format (msgpack, JSON Lines, CSV, Parquet) and checks each
gives the embedded run's matches.

``--floor`` times what Spark itself does in the job, no Python in it: the shuffle
and sort of the routed rows and the write of the match lines (each minus a read
of the same data), against the budget the marginal-cost target leaves (N events
at 0.25x the engine alone's rate).

``--workers`` times, in this one process and without Spark, the Python work the
job's workers do on one msgpack file (the index's read, read and route, merge
and engines; the rows between them sorted as Spark's shuffle would, untimed)
against ``dqcep run``'s read, engine and match lines on the same file.

    python3 bench/bench_spark.py [--events N] [--files F]
                                 [--model | --marginal | --formats | --floor | --workers]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
QUERIES = ROOT / "dqcep" / "data" / "iot.cep"


def child(args) -> None:
    """One Spark configuration, in this process: prints JSON figures."""
    from dqcep.spark.batch import run_batch
    from dqcep.spark.session import spark_session
    conf = {"spark.executor.memory": "1g"}
    if args.eventlog:
        from eventlog import log_conf
        conf.update(log_conf(args.eventlog))
    spark = spark_session(args.master, "dqcep-bench", args.partitions, conf)
    try:
        started = time.perf_counter()
        stats = run_batch(spark, QUERIES.read_text(), [args.input], args.output,
                          partitions=args.partitions, strategy=args.partitioning,
                          count_copies=args.partitioning == "time")
        seconds = time.perf_counter() - started
    finally:
        spark.stop()
    print(json.dumps({"seconds": seconds, **stats.__dict__}))


def generate(path: Path, events: int, seed: int | None = None) -> None:
    """The IoT stream with iot.cep planted (the generator's default seed unless given)."""
    subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n",
                    str(events), *(["--seed", str(seed)] if seed is not None else []),
                    "--plant", str(QUERIES), "--plant-every", "130000", "--quiet", "-o",
                    str(path)], check=True)


def split(path: Path, out: Path, files: int) -> None:
    """The msgpack records of one file, cut into ``files`` files (bytes unchanged)."""
    import msgpack
    data = path.read_bytes()
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(data) + 1)
    unpacker.feed(data)
    bounds = [0]
    while True:
        try:
            unpacker.skip()
        except msgpack.OutOfData:
            break
        bounds.append(unpacker.tell())
    per = -(-(len(bounds) - 1) // files)
    out.mkdir()
    for i in range(files):
        lo, hi = bounds[min(i * per, len(bounds) - 1)], bounds[min((i + 1) * per,
                                                                  len(bounds) - 1)]
        (out / f"part-{i:04d}.msgpack").write_bytes(data[lo:hi])


def line_hashes(paths) -> np.ndarray:
    """Sorted 64-bit hashes of the match lines in ``paths``: 10^7 matches are ~2 GB of
    text, too much to hold as sets of strings for every run. Python's string hash is
    the same within this process, which is the only place they are compared."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            out.append(np.fromiter((hash(x) for x in f), dtype=np.int64))
    return np.sort(np.concatenate(out)) if out else np.empty(0, np.int64)


def compare(expected: np.ndarray, got: np.ndarray) -> tuple[int, int, int]:
    """(missing, extra, repeated) of ``got`` against the distinct lines ``expected``."""
    distinct = np.unique(got)
    missing = np.setdiff1d(expected, distinct, assume_unique=True).size
    extra = np.setdiff1d(distinct, expected, assume_unique=True).size
    return missing, extra, got.size - distinct.size


def run_child(tmp: Path, name: str, master: str, partitions: int, strategy: str = "auto",
              eventlog: Path | None = None, parts: str = "parts") -> tuple[dict, Path]:
    """One Spark configuration in a process of its own: (its JSON figures, its output)."""
    out = tmp / name
    cmd = [sys.executable, __file__, "--child", "--master", master, "--partitions",
           str(partitions), "--partitioning", strategy, "--input", str(tmp / parts),
           "--output", str(out)]
    proc = subprocess.run(cmd + (["--eventlog", str(eventlog)] if eventlog else []),
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), out


def spark(tmp: Path, name: str, master: str, partitions: int, strategy: str = "auto") -> dict:
    figures, out = run_child(tmp, name, master, partitions, strategy)
    figures["lines"] = line_hashes(sorted((out / "matches").glob("part-*")))
    shutil.rmtree(out)
    return figures


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--partitions", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--partitioning", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--output", help=argparse.SUPPRESS)
    ap.add_argument("--eventlog", help=argparse.SUPPRESS)
    ap.add_argument("--matches", help=argparse.SUPPRESS)
    ap.add_argument("--model", action="store_true",
                    help="measure task time per event, skew and fixed cost from event logs "
                    "and predict the wall time on more executors")
    ap.add_argument("--marginal", action="store_true",
                    help="the marginal cost per event (N and 2N events, one executor with 2 "
                    "cores) against the engine alone, and the fixed cost of dqcep spark run")
    ap.add_argument("--repeat", type=int, default=3,
                    help="--marginal: runs of each size, the best counts (default 3)")
    ap.add_argument("--formats", action="store_true",
                    help="the job on one file of each input format (one executor with 2 "
                    "cores)")
    ap.add_argument("--floor", action="store_true",
                    help="Spark's own share of the job (shuffle, sort, write) against the "
                    "marginal-cost target's budget")
    ap.add_argument("--floor-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workers", action="store_true",
                    help="the workers' Python work per step, in one process, against "
                    "dqcep run's")
    args = ap.parse_args(argv)
    if args.floor_child:
        return floor_child(args)
    if args.floor:
        return floor(args)
    if args.workers:
        return workers(args)
    if args.child:
        return child(args)
    if args.formats:
        return formats(args)
    if args.model:
        return model(args)
    if args.marginal:
        return marginal(args)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        events = tmp / "events.msgpack"
        generate(events, args.events)
        split(events, tmp / "parts", args.files)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dqcep", "run", str(QUERIES), "-i", str(events),
                        "-o", str(tmp / "embedded.jsonl")], check=True)
        embedded_s = time.perf_counter() - started
        embedded = np.unique(line_hashes([tmp / "embedded.jsonl"]))
        (tmp / "embedded.jsonl").unlink()
        one = spark(tmp, "one", "local-cluster[1,1,1024]", 2)
        two = spark(tmp, "two", "local-cluster[2,1,1024]", 4)
        sliced = spark(tmp, "sliced", "local-cluster[2,1,1024]", 4, "time")

    n = args.events
    print(f"events={n:,} files={args.files} queries=iot.cep matches={embedded.size:,} "
          f"(2 cores)")
    print(f"{'run':<34} {'seconds':>8} {'events/s':>11} {'matches':>9}")
    print(f"{'embedded (dqcep run)':<34} {embedded_s:>8.1f} {n / embedded_s:>11,.0f} "
          f"{embedded.size:>9,}")
    for label, r in (("spark, 1 executor, keyed", one), ("spark, 2 executors, keyed", two),
                     ("spark, 2 executors, time slices", sliced)):
        print(f"{label:<34} {r['seconds']:>8.1f} {n / r['seconds']:>11,.0f} "
              f"{r['lines'].size:>9,}")
    for label, r in (("1 executor", one), ("2 executors", two), ("time slices", sliced)):
        missing, extra, repeated = compare(embedded, r["lines"])
        if missing or extra or repeated:
            print(f"MISMATCH ({label}): {missing} missing, {extra} extra, {repeated} repeated")
    missing, _, repeated = compare(embedded, sliced["lines"])
    recall = (embedded.size - missing) / max(embedded.size, 1)
    dup = repeated / max(sliced["lines"].size, 1)
    print(f"ratio 2 executors / 1 executor: {one['seconds'] / two['seconds']:.2f}x "
          f"(target >= 1.7)")
    print(f"ratio spark 1 executor / embedded: {embedded_s / one['seconds']:.2f}x")
    print(f"time slices: recall {recall:.2%}, duplicate rate {dup:.2%}, slice "
          f"{sliced['slice_ms'] / 1000:.0f} s, overlap overhead "
          f"{sliced['assigned'] / max(sliced['after_pushdown'], 1) - 1:.1%} more event copies")


# ------------------------------------------------------------------ --marginal

MARGINAL_MASTER = "local-cluster[1,2,2048]"


def marginal(args) -> None:
    """Wall time of run_batch on N and 2N events with one executor: the difference is the
    cost of N more events (fixed costs cancel); the fixed cost of the CLI is timed on a
    100-event input, JVM start included."""
    n = args.events
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runs = {}
        for size in (n, 2 * n):
            generate(tmp / f"events-{size}.msgpack", size, seed=3)
            split(tmp / f"events-{size}.msgpack", tmp / f"parts-{size}", args.files)
        # the two sizes in turn, each its best of --repeat (a shared machine's noise is
        # as large as the difference measured)
        for _ in range(args.repeat):
            for size in (n, 2 * n):
                figures, out = run_child(tmp, f"out-{size}", MARGINAL_MASTER, 2,
                                         parts=f"parts-{size}")
                shutil.rmtree(out)
                if size not in runs or figures["seconds"] < runs[size]["seconds"]:
                    runs[size] = figures
        from bench_paths import engine_run  # Engine.process alone, columns decoded before
        alone = engine_run(tmp / f"events-{2 * n}.msgpack")[1]
        generate(tmp / "small.msgpack", 100, seed=3)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dqcep", "spark", "run", str(QUERIES), "-i",
                        str(tmp / "small.msgpack"), "-o", str(tmp / "small-out"), "--master",
                        MARGINAL_MASTER, "--partitions", "2"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cli_s = time.perf_counter() - started
    t1, t2 = runs[n]["seconds"], runs[2 * n]["seconds"]
    rate, engine_rate = n / (t2 - t1), 2 * n / alone
    print(f"events={n:,} and {2 * n:,}, files={args.files}, queries=iot.cep, "
          f"{MARGINAL_MASTER} (one executor, 2 cores)")
    print(f"run_batch, best of {args.repeat}: {t1:.1f} s for {n:,} events, {t2:.1f} s for "
          f"{2 * n:,}")
    print(f"marginal cost: {n:,} more events in {t2 - t1:.2f} s = {rate:,.0f} events/s; "
          f"engine alone {engine_rate:,.0f} events/s; ratio {rate / engine_rate:.2f}x "
          f"(target >= 0.25x)")
    print(f"fixed cost of run_batch (session started): {t1 - n / rate:.1f} s; "
          f"dqcep spark run on 100 events, JVM start included: {cli_s:.1f} s (target <= 20 s)")


# ------------------------------------------------------------------ --formats

FORMATS = ("msgpack", "jsonl", "csv", "parquet")


def formats(args) -> None:
    """run_batch on the same N events as one file in each format, one executor."""
    n = args.events
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for fmt in FORMATS:
            generate(tmp / f"events.{fmt}", n, seed=3)
        subprocess.run([sys.executable, "-m", "dqcep", "run", str(QUERIES), "-i",
                        str(tmp / "events.msgpack"), "-o", str(tmp / "embedded.jsonl")],
                       check=True)
        embedded = np.unique(line_hashes([tmp / "embedded.jsonl"]))
        for fmt in FORMATS:
            figures, out = run_child(tmp, f"out-{fmt}", MARGINAL_MASTER, 2,
                                     parts=f"events.{fmt}")
            got = line_hashes(sorted((out / "matches").glob("part-*")))
            shutil.rmtree(out)
            size = (tmp / f"events.{fmt}").stat().st_size
            rows.append((fmt, size, figures["seconds"], compare(embedded, got)))
    print(f"events={n:,} as one file per format, queries=iot.cep, {MARGINAL_MASTER} "
          f"(one executor, 2 cores), matches={embedded.size:,}")
    print(f"{'format':<8} {'MB':>7} {'seconds':>8} {'events/s':>10} {'/ msgpack':>9}  matches")
    base = rows[0][2]
    for fmt, size, seconds, (missing, extra, repeated) in rows:
        ok = "exact" if not (missing or extra or repeated) else \
            f"MISMATCH {missing} missing, {extra} extra, {repeated} repeated"
        print(f"{fmt:<8} {size / 1e6:>7.1f} {seconds:>8.1f} {n / seconds:>10,.0f} "
              f"{base / seconds:>8.2f}x  {ok}")


# ------------------------------------------------------------------ --floor


def floor_child(args) -> None:
    """In one Spark session: the routed rows saved as Parquet (untimed), then the
    JVM-only steps of the main job, each timed twice (the second counts)."""
    from dqcep.lang import parse
    from dqcep.spark.batch import job_index
    from dqcep.spark.executor import JobSpec, Router
    from dqcep.spark.partitioning import plan_partitioning
    from dqcep.spark.session import spark_session
    from dqcep.spark.source import load_events
    text = QUERIES.read_text()
    spark = spark_session(MARGINAL_MASTER, "dqcep-floor", 2, {"spark.executor.memory": "1g"})
    out = Path(args.output)
    try:
        index = job_index(spark, [args.input], None)
        spec = JobSpec(text, plan_partitioning(parse(text).queries, "auto"), 2)
        router = Router(spec, 0, index.earlier, index.repeated, index.first_file,
                        index.first_seq)
        load_events(spark, [args.input], mode="route", router=router) \
            .write.parquet(str(out / "routed"))
        routed = lambda: spark.read.parquet(str(out / "routed"))  # noqa: E731
        lines = lambda: spark.read.text(args.matches)  # noqa: E731
        noop = lambda df: df.write.format("noop").mode("overwrite").save()  # noqa: E731
        steps = {
            "read routed rows": lambda: noop(routed()),
            "read, shuffle, sort routed rows": lambda: noop(
                routed().repartition(2, "group", "part")
                .sortWithinPartitions("group", "part", "ts", "file_index", "seq")),
            "... then through Python (identity)": lambda: noop(
                routed().repartition(2, "group", "part")
                .sortWithinPartitions("group", "part", "ts", "file_index", "seq")
                .mapInArrow(_identity, routed().schema)),
            "read match lines": lambda: noop(lines()),
            "... through Python (identity), write": lambda: lines()
            .mapInArrow(_identity, "value string").write.mode("overwrite")
            .text(str(out / "written")),
            "read, write match lines": lambda: lines().write.mode("overwrite")
            .text(str(out / "written")),
        }
        figures = {"rows": routed().count(), "lines": lines().count()}
        for name, step in steps.items():
            for _ in range(2):
                started = time.perf_counter()
                step()
                figures[name] = time.perf_counter() - started
    finally:
        spark.stop()
    print(json.dumps(figures))


def floor(args) -> None:
    n = args.events
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        events = tmp / "events.msgpack"
        generate(events, n, seed=3)
        split(events, tmp / "parts", args.files)
        subprocess.run([sys.executable, "-m", "dqcep", "run", str(QUERIES), "-i", str(events),
                        "-o", str(tmp / "matches.jsonl")], check=True)
        from bench_paths import engine_run
        alone = engine_run(events)[1]
        proc = subprocess.run([sys.executable, __file__, "--floor-child", "--input",
                               str(tmp / "parts"), "--output", str(tmp / "floor"),
                               "--matches", str(tmp / "matches.jsonl")],
                              capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"floor failed:\n{proc.stderr[-4000:]}")
        f = json.loads(proc.stdout.strip().splitlines()[-1])
    budget = alone / 0.25  # N events at a quarter of the engine alone's rate
    shuffle = f["read, shuffle, sort routed rows"] - f["read routed rows"]
    write = f["read, write match lines"] - f["read match lines"]
    exchange = f["... then through Python (identity)"] - f["read, shuffle, sort routed rows"] \
        + f["... through Python (identity), write"] - f["read, write match lines"]
    print(f"events={n:,} files={args.files} queries=iot.cep, {MARGINAL_MASTER} "
          f"(one executor, 2 cores)")
    print(f"engine alone: {alone:.2f} s ({n / alone:,.0f} events/s); the marginal-cost "
          f"target (0.25x) leaves {budget:.2f} s for the whole job's work on {n:,} events")
    for name in ("read routed rows", "read, shuffle, sort routed rows",
                 "... then through Python (identity)", "read match lines",
                 "read, write match lines", "... through Python (identity), write"):
        print(f"  {name:<34} {f[name]:6.2f} s")
    print(f"Spark alone: shuffle and sort of {f['rows']:,} routed rows {shuffle:.2f} s, write "
          f"of {f['lines']:,} match lines {write:.2f} s: {shuffle + write:.2f} s = "
          f"{(shuffle + write) / budget:.2f}x the budget")
    print(f"the routed rows into a Python worker and the match lines out of one (Arrow, "
          f"nothing done there): {exchange:.2f} s; with Spark's share: "
          f"{shuffle + write + exchange:.2f} s = {(shuffle + write + exchange) / budget:.2f}x "
          f"the budget")


def _identity(batches):
    yield from batches


# ------------------------------------------------------------------ --workers


def workers(args) -> None:
    """The batch job's Python steps on one file, each timed alone, in this process."""
    import pyarrow as pa

    from bench_paths import split as run_path
    from dqcep.lang import parse
    from dqcep.spark.executor import (JobSpec, Router, engine_batches, routed_arrow_schema)
    from dqcep.spark.partitioning import plan_partitioning
    from dqcep.spark.source import ColumnPiece, IdsAndTs, file_index_row, read_file
    n, text = args.events, QUERIES.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.msgpack"
        generate(path, n)
        read, run, written, _ = run_path(path, Path(tmp) / "matches.jsonl")
        started = time.perf_counter()
        row = file_index_row(0, read_file(0, str(path), "msgpack", positions=False,
                                          engine=IdsAndTs)).to_pylist()[0]
        index_s = time.perf_counter() - started
        spec = JobSpec(text, plan_partitioning(parse(text).queries, "auto"), 2)
        repeated = np.array(row["repeated"], np.int64)
        order = np.argsort(repeated)
        router = Router(spec, 0, {}, repeated[order], np.zeros(len(order), np.int64),
                        np.array(row["first_seq"], np.int64)[order])
        started = time.perf_counter()
        routed = [router.route_piece(b) if isinstance(b, ColumnPiece) else router.route(b)
                  for b in read_file(0, str(path), "msgpack", engine=router.assigner.engine)]
        route_s = time.perf_counter() - started
        table = pa.Table.from_batches(routed, schema=routed_arrow_schema())
        table = table.take(np.lexsort([table.column(c).to_numpy() for c in
                                       ("seq", "file_index", "ts", "part", "group")]))
        started = time.perf_counter()
        for _ in engine_batches(spec, iter(table.to_batches(10_000))):
            pass
        engines_s = time.perf_counter() - started
    total = index_s + route_s + engines_s
    print(f"events={n:,}, one msgpack file, queries=iot.cep, one process, no Spark")
    print(f"batch job's workers: index read {index_s:.2f} s, read and route {route_s:.2f} s, "
          f"merge and engines {engines_s:.2f} s: {total:.2f} s")
    print(f"dqcep run: read {read:.2f} s, engine {run:.2f} s, match lines {written:.2f} s: "
          f"{read + run + written:.2f} s; ratio {total / (read + run + written):.1f}x")


# ------------------------------------------------------------------ --model

MODEL_PARTITIONS = 2
# (label, master, executors, cores per executor); the machine has 2 cores
MODEL_RUNS = [("local[1]", "local[1]", 1, 1), ("local[2]", "local[2]", 1, 2),
              ("1 executor x 2 cores", "local-cluster[1,2,2048]", 1, 2),
              ("2 executors x 1 core", "local-cluster[2,1,1024]", 2, 1)]
MACHINE_CORES = 2


def measured(tmp: Path, label: str, master: str, partitions: int,
             parts: str = "parts") -> dict:
    """Run the job once with an event log; the log's summary plus the job's wall time."""
    from eventlog import log_files, read, summarize
    logs = tmp / f"log-{label.replace(' ', '_')}-{parts}"
    logs.mkdir()
    figures, out = run_child(tmp, "model-out", master, partitions, eventlog=logs, parts=parts)
    shutil.rmtree(out)
    (log,) = log_files(logs)
    return {**summarize(read(log)), "seconds": figures["seconds"]}


def stage_time(stage: dict, slots: int, cores: int, tasks: int | None = None) -> float:
    """Seconds a stage takes with ``slots`` task slots on ``cores`` cores.

    ``task_ms`` is the stage's work measured alone (local[1]: one task at a time, so
    no task waits for a core) and ``demand`` the cores one task keeps busy (its JVM
    thread and its Python worker run side by side: the slowdown of the stage's tasks
    when two share two cores, local[2] against local[1]). k tasks run at once; each
    is slowed by max(1, k x demand / cores); the stage never ends before its longest
    task (mean task x skew)."""
    n = tasks or stage["tasks"]
    k = min(n, slots)
    slowdown = max(1.0, k * stage["demand"] / cores)
    work = stage["task_ms"] / 1000
    return max(work / k, work / n * stage["skew"]) * slowdown


def calibrate(alone: dict, pair: dict) -> list[dict]:
    """Per stage of the local[1] run: its work, skew, tasks and core demand (local[2])."""
    two = {s["id"]: s for s in pair["stages"]}
    out = []
    for s in alone["stages"]:
        t = two.get(s["id"])
        demand = t["task_ms"] / s["task_ms"] if t and s["task_ms"] else 1.0
        out.append({**s, "demand": min(max(demand, 1.0), 4.0)})
    return out


def predict(stages: list[dict], fixed_s: float, executors: int, cores: int,
            partitions: int | None = None) -> float:
    """Wall seconds of the job on ``executors`` x ``cores`` (one slot per core, as many
    cores as slots): the fixed cost plus each stage's time. ``partitions``: the
    shuffled stages get that many tasks (a user scaling out sets ``--partitions``
    to the slots); input stages keep one task per file."""
    slots = executors * cores
    total = fixed_s
    for s in stages:
        scaled = partitions if partitions and s["tasks"] == MODEL_PARTITIONS else None
        total += stage_time(s, slots, slots, scaled)
    return total


def marginal_stages(small: dict, large: dict) -> dict[int, float]:
    """Per stage id: task ms of the larger run minus the smaller's (the work of the events
    added; what each executor pays once, its JVM's warm-up and its Python workers'
    start, cancels)."""
    before = {s["id"]: s["task_ms"] for s in small["stages"]}
    return {s["id"]: s["task_ms"] - before[s["id"]] for s in large["stages"]
            if s["id"] in before}


def model(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        events = tmp / "events.msgpack"
        generate(events, args.events)
        split(events, tmp / "parts", args.files)
        runs = []
        for label, master, executors, cores in MODEL_RUNS:
            r = measured(tmp, label, master, MODEL_PARTITIONS)
            r.update(label=label, master=master, executors=executors, cores=cores)
            runs.append(r)
        # the executor runs again on twice the events: the task time the added events cost
        generate(tmp / "events-2n.msgpack", 2 * args.events)
        split(tmp / "events-2n.msgpack", tmp / "parts-2n", args.files)
        doubled = [measured(tmp, label, master, MODEL_PARTITIONS, parts="parts-2n")
                   for label, master, _, _ in MODEL_RUNS[2:]]
    n = args.events
    alone, pair, one, two = runs
    stages = calibrate(alone, pair)
    on_machine = [sum(stage_time(s, r["executors"] * r["cores"], MACHINE_CORES)
                      for s in stages) for r in runs]
    fixed_local = alone["seconds"] - on_machine[0]
    fixed_cluster = one["seconds"] - on_machine[2]   # executor JVMs, shipping, scheduling
    print(f"events={n:,} files={args.files} queries=iot.cep ({MACHINE_CORES} cores, "
          f"--partitions {MODEL_PARTITIONS}); from the event logs")
    print(f"{'':<26}" + "".join(f"{r['label']:>22}" for r in runs))
    print(f"{'job wall s':<26}" + "".join(f"{r['seconds']:>22.1f}" for r in runs))
    print(f"{'jobs / stages run':<26}"
          + "".join(f"{str(r['jobs']) + ' / ' + str(r['stages_run']):>22}" for r in runs))
    print(f"{'task s per 10^6 events':<26}"
          + "".join(f"{r['task_ms'] / n * 1e3:>22.2f}" for r in runs))
    print("\nper stage (>= 2% of the work): work alone, core demand, skew, tasks; task s per "
          "10^6 events with 1 executor x 2 cores and 2 executors x 1 core")
    by_one = {s["id"]: s for s in one["stages"]}
    by_two = {s["id"]: s for s in two["stages"]}
    worst = 0.0
    for s in stages:
        a, b = by_one.get(s["id"]), by_two.get(s["id"])
        if a is None or b is None or s["task_ms"] < 0.02 * alone["task_ms"]:
            continue
        ratio = b["task_ms"] / max(a["task_ms"], 1)
        worst = max(worst, ratio)
        print(f"  stage {s['id']:>3} {s['name'][:40]:<40} {s['task_ms'] / n * 1e3:>6.2f} s  "
              f"x{s['demand']:.2f}  skew {s['skew']:.2f}  tasks {s['tasks']:>2}   "
              f"{a['task_ms'] / n * 1e3:>6.2f} {b['task_ms'] / n * 1e3:>6.2f}  x{ratio:.2f}")
    print(f"task time, 2 executors / 1 executor: x{two['task_ms'] / max(one['task_ms'], 1):.2f}"
          f" overall, worst stage x{worst:.2f} ({n:,} events, fixed costs included)")
    extra_one, extra_two = (marginal_stages(r, d) for r, d in zip((one, two), doubled))
    print(f"task time of {n:,} more events ({n:,} -> {2 * n:,}), per 10^6 events: 1 executor "
          f"x 2 cores / 2 executors x 1 core")
    worst = 0.0
    for s in stages:
        a, b = extra_one.get(s["id"]), extra_two.get(s["id"])
        if a is None or b is None or s["task_ms"] < 0.02 * alone["task_ms"]:
            continue
        ratio = b / max(a, 1)
        worst = max(worst, ratio)
        print(f"  stage {s['id']:>3} {s['name'][:40]:<40} {a / n * 1e3:>6.2f} {b / n * 1e3:>6.2f}"
              f"  x{ratio:.2f}")
    total_one, total_two = sum(extra_one.values()), sum(extra_two.values())
    print(f"marginal task time, 2 executors / 1 executor: x{total_two / max(total_one, 1):.2f} "
          f"overall, worst stage x{worst:.2f} (target: within 1.2x)")
    print(f"fixed cost: {fixed_local:.1f} s in one process (local[1]), {fixed_cluster:.1f} s "
          f"with executor processes (1 executor x 2 cores)")
    print("\nmodel against the runs made here (stage work and demand from local[1] and "
          "local[2]):")
    for r, busy in zip(runs, on_machine):
        fixed = fixed_local if r["master"].startswith("local[") else fixed_cluster
        p = fixed + busy
        print(f"  {r['label']:<24} measured {r['seconds']:>6.1f} s  predicted {p:>6.1f} s "
              f"({p / r['seconds'] - 1:+.0%})")
    print(f"predicted on a cluster (fixed cost {fixed_cluster:.1f} s; 2 cores per executor, "
          f"--partitions = slots):")
    base = predict(stages, fixed_cluster, 1, 2)
    for executors in (1, 4, 8, 32):
        p = predict(stages, fixed_cluster, executors, 2, executors * 2)
        print(f"  {executors:>2} executors x 2 cores  {p:>6.1f} s  {n / p:>11,.0f} events/s "
              f"(x{base / p:.2f} of 1 executor)")
    print(f"(the input stages have {args.files} tasks, one per file: more slots than files do "
          f"not help them; the fixed cost does not shrink with executors)")


if __name__ == "__main__":
    main()
