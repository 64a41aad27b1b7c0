"""``dqcep spark ...``: the Spark jobs on the command line (pyspark imported on use)."""
from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from pathlib import Path

from dqcep.core.errors import UserError
from dqcep.core.events import MAX_FUTURE_MS, STATE_BUDGET
from dqcep.io.readers import FORMATS
from dqcep.core.limits import COUNT, MILLISECONDS, POSITIVE, Number

SLICE_MS = Number(integer=True, low=1, high=2**61)   # a time slice's length, ms
WORKERS = Number(integer=True, low=1, high=1024)     # a local cluster's workers, cores
BUDGET = Number(integer=True, low=0, high=2**62)    # --max-partial-matches (0: no limit)
# the masters Spark takes (its SparkMasterRegex and URL schemes), checked before the
# JVM starts: a typo was a Spark error after the JVM's start
_MASTER = re.compile(r"(local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn|"
                     r"(spark|k8s|mesos)://\S+)\Z")


def master_url(text: str) -> str:
    """An argparse ``type``: a Spark master URL of a form Spark takes."""
    import argparse
    if not _MASTER.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Spark master: local, local[N], local[*], "
            "local-cluster[N,CORES,MB], spark://HOST:PORT, yarn or k8s://URL")
    return text


def _require_spark() -> None:
    """PySpark and a Java runtime, checked before anything starts (a missing Java is
    otherwise a Py4J traceback from deep inside the session)."""
    import os
    import shutil
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise UserError("the Spark jobs need PySpark: pip install 'dqcep[spark]'") from None
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH"
        raise UserError(f"Spark needs Java 17 ({where}): install it (Debian: sh "
                        "scripts/system-deps.sh, or apt-get install openjdk-17-jre-headless) "
                        "or set JAVA_HOME")


@contextmanager
def _executor_errors():
    """A UserError raised in an executor comes back wrapped in Spark's exception:
    unwrap it, so the user reads one line instead of two stack traces."""
    from pyspark.errors import PySparkException
    try:
        yield
    except PySparkException as err:
        # the class's own path, as the worker's traceback prints it (it moved once)
        name = re.escape(f"{UserError.__module__}.{UserError.__qualname__}")
        found = re.findall(rf"{name}: (.*)", str(err))
        if found:
            raise UserError(found[-1]) from None
        raise


def _native_queries(parsed) -> None:
    """The queries the executors' engines will run, planned and compiled on the driver
    (a query the native engine cannot run fails here, with its position)."""
    from dqcep.plan import build_plan
    from dqcep.runtime.program import Program

    Program(build_plan(parsed.queries, tables=parsed.tables, schemas=parsed.schemas))


def cmd_spark_run(args) -> int:
    from dqcep.lang import parse_file
    from dqcep.spark.paths import check_batch_paths

    _native_queries(parse_file(args.queries))  # positioned errors, missing inputs, a full
    check_batch_paths(args.input, args.output, args.overwrite)  # all before Spark starts
    rule = _admission(args)
    _require_spark()
    from dqcep.spark.batch import run_batch
    from dqcep.spark.session import spark_session

    text = Path(args.queries).read_text(encoding="utf-8")
    say = _progress("run")
    say(f"starting Spark ({args.master or 'master from spark-submit or local[*]'})")
    spark = spark_session(args.master, "dqcep spark run", args.partitions,
                          archive_conf(args.archive))
    # one partition per core by default: more partitions than cores wait for each other
    # (local-cluster[1,2,2048]: 10^6 IoT events 16 s with 4 partitions, 18 s for 2x10^6
    # with 2, where 4 took 31 s)
    partitions = args.partitions or spark.sparkContext.defaultParallelism
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    try:
        with _executor_errors():
            stats = run_batch(spark, text, args.input, args.output, fmt=args.format,
                              partitions=partitions, lateness=rule,
                              output_format=args.output_format, strategy=args.partitioning,
                              slice_ms=args.slice_ms, overwrite=args.overwrite, say=say,
                              budget=args.max_partial_matches)
    finally:
        spark.stop()
    _summary("run", stats, args.output)
    return 0


def _progress(command: str):
    """A step of a long job on stderr as it starts, with the time since the first (a
    run was 50-66 s of Spark's own warnings only)."""
    import time
    started = time.monotonic()

    def say(line: str) -> None:
        print(f"dqcep spark {command} [{time.monotonic() - started:5.1f} s]: {line}",
              file=sys.stderr, flush=True)
    return say


def _admission_options(parser) -> None:
    """--skew, --timeline and --lateness (spec section 7), as for dqcep run; both jobs."""
    parser.add_argument("--skew", type=MILLISECONDS.option, metavar="MS",
                        help="how far a timeline may trail the most advanced one (default "
                        "--lateness; as for dqcep run)")
    parser.add_argument("--timeline", metavar="ATTR",
                        help="events with the same value of ATTR share a timeline; needs "
                        "--skew above --lateness (as for dqcep run; docs/spark.md)")
    parser.add_argument("--lateness", type=MILLISECONDS.option, default=0, metavar="MS",
                        help="allowed out-of-orderness in arrival order (default 0)")


def _admission(args):
    """The job's ``AdmissionRule`` (spec section 7), checked before Spark starts."""
    from dqcep.core.admission import AdmissionRule
    return AdmissionRule(args.lateness, args.skew, args.timeline)


def _summary(command: str, stats, output: str) -> None:
    """The last line of ``dqcep spark run`` and ``dqcep spark stream``."""
    print(f"dqcep spark {command}: {stats.records} records, {stats.dead_letter} dead-lettered, "
          f"{stats.duplicates} duplicates, {stats.late} late, {stats.after_pushdown} after "
          f"pushdown; {stats.matches} matches -> {output}", file=sys.stderr)


def cmd_spark_stream(args) -> int:
    from dqcep.lang import parse_file

    _native_queries(parse_file(args.queries))  # positioned errors and a missing journal
    # before Spark starts
    rule = _admission(args)
    if not Path(args.input).is_dir():
        raise UserError(f"no journal directory at {args.input}")
    from dqcep.io.mapping import TopicMap
    # parsed once: a bad rule is refused before Spark starts, and the job reads with it
    topic_map = TopicMap.load(args.topic_map) if args.topic_map else None
    _require_spark()
    from dqcep.spark.session import spark_session
    from dqcep.spark.stream import run_stream, stream_stats

    text = Path(args.queries).read_text(encoding="utf-8")
    spark = spark_session(args.master, "dqcep spark stream", args.partitions,
                          archive_conf(args.archive))
    try:
        with _executor_errors():
            query = run_stream(spark, text, args.input, args.output, args.checkpoint,
                               partitions=args.partitions, lateness=rule,
                               fmt=args.format, strategy=args.partitioning,
                               topic_map=topic_map, max_future=args.max_future,
                               slice_ms=args.slice_ms, trigger_seconds=args.trigger,
                               until_idle=args.until_idle, budget=args.max_partial_matches)
            if not args.until_idle:
                print(f"dqcep spark stream: running on {args.input}; Ctrl-C stops it",
                      file=sys.stderr)
                try:
                    query.awaitTermination()
                except KeyboardInterrupt:
                    query.stop()
    finally:
        spark.stop()
    _summary("stream", stream_stats(args.output), args.output)
    return 0


def archive_conf(archive: str | None) -> dict[str, str] | None:
    """Session settings for ``--archive ENV.tar.gz`` (checked before Spark starts)."""
    if archive is None:
        return None
    from dqcep.spark.pack import spark_conf
    return spark_conf(archive)


def cmd_spark_pack(args) -> int:
    from dqcep.spark.pack import ENV_NAME, pack_environment
    print("dqcep spark pack: building a venv with dqcep and packing it (a minute or two)",
          file=sys.stderr)
    out = pack_environment(args.output, args.source, args.compress_level)
    size = out.stat().st_size / 2**20
    print(f"dqcep spark pack: {out} ({size:,.0f} MiB); pass it as --archive {out} (it is "
          f"unpacked as ./{ENV_NAME} on each executor)", file=sys.stderr)
    return 0


def cmd_spark_cluster(args) -> int:
    _require_spark()
    from dqcep.spark.cluster import start_cluster, stop_cluster
    if args.action == "start":
        state = start_cluster(args.dir, args.workers, args.cores, args.memory)
        print(state["master"])
        print(f"dqcep spark cluster: master and {state['workers']} workers running "
              f"(state and logs in {args.dir}); stop with: dqcep spark cluster stop "
              f"--dir {args.dir}", file=sys.stderr)
    else:
        state = stop_cluster(args.dir)
        print(f"dqcep spark cluster: stopped {state['master']}", file=sys.stderr)
    return 0


def add_spark_parser(sub, parser_class) -> None:
    spark = sub.add_parser("spark", help="run the queries on Spark (batch files, journal stream)",
                           description="The Spark jobs (PySpark 4; docs/spark.md).")
    jobs = spark.add_subparsers(dest="job", required=True, metavar="JOB",
                                parser_class=parser_class)
    run = jobs.add_parser(
        "run", help="batch: event files -> matches, dead letters, late events",
        description="Read JSON Lines, msgpack or Parquet event files (or directories of "
        "them), validate, drop repeated ids, divert late events, push the plan's filters "
        "down, partition (by the queries' key, else time slices with an overlap of one "
        "window) and run the native engine in the executors. Writes DIR/matches (the "
        "spec's match lines, or Parquet), DIR/dead-letter, DIR/late and DIR/_stats.json.")
    run.add_argument("queries", metavar="QUERIES.cep", help="query file")
    run.add_argument("--input", "-i", nargs="+", required=True, metavar="PATH",
                     help="event files or directories, in arrival order")
    run.add_argument("--output", "-o", required=True, metavar="DIR", help="output directory")
    run.add_argument("--master", default=None, type=master_url,
                     help="Spark master: local[N], local-cluster[N,C,MB], spark://host:port "
                     "(default: spark-submit's, else local[*])")
    run.add_argument("--partitions", type=COUNT.option, default=None, metavar="N",
                     help="key partitions and shuffle partitions (default: the cluster's "
                     "cores, Spark's default parallelism)")
    run.add_argument("--max-partial-matches", type=BUDGET.option, default=STATE_BUDGET,
                     metavar="N", help="the partial matches one buffer of a query may hold "
                     f"in a task's engine (default {STATE_BUDGET}, 0: no limit); a task over it "
                     "fails with the query's name (docs/spark.md)")
    run.add_argument("--format", choices=FORMATS,
                     help="input format (default: from each file's extension)")
    _admission_options(run)
    run.add_argument("--output-format", choices=("json", "parquet"), default="json",
                     help="matches as JSON Lines (default) or Parquet")
    run.add_argument("--partitioning", choices=("auto", "time"), default="auto",
                     help="auto: by each query's key where it has one, else time slices; "
                     "time: time slices for every query")
    run.add_argument("--slice-ms", type=SLICE_MS.option, default=None, metavar="MS",
                     help="time-slice length (default: a few slices per partition, at least "
                     "the window)")
    run.add_argument("--overwrite", action="store_true", help="replace DIR's contents")
    run.add_argument("--archive", metavar="ENV.tar.gz",
                     help="a packed environment (from 'dqcep spark pack') for the executors: "
                     "shipped with spark.archives, its Python runs the executors' work, so the "
                     "cluster's nodes need no dqcep installed")
    run.set_defaults(func=cmd_spark_run)

    stream = jobs.add_parser(
        "stream", help="streaming: the MQTT ingest journal -> matches, dead letters, late",
        description="Structured Streaming over the closed segments of a journal written by "
        "'dqcep run --input mqtt://... --journal DIR' (one segment per micro-batch), "
        "stateful per partition with transformWithStateInPandas: each partition's engine "
        "lives in Spark's state store, event-time timers release matches held by a trailing "
        "or AND negation. Writes DIR/matches, DIR/dead-letter and DIR/late, one directory per "
        "micro-batch; restarted from --checkpoint it loses and repeats nothing.")
    stream.add_argument("queries", metavar="QUERIES.cep", help="query file")
    stream.add_argument("--input", "-i", required=True, metavar="JOURNAL", help="journal directory")
    stream.add_argument("--output", "-o", required=True, metavar="DIR", help="output directory")
    stream.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="Spark checkpoint (offsets, state) and the journal index")
    stream.add_argument("--master", default=None, type=master_url, help="Spark master (as for 'spark run')")
    stream.add_argument("--partitions", type=COUNT.option, default=4, metavar="N",
                        help="key partitions and shuffle partitions (default 4; fixed by the "
                        "first run of a checkpoint)")
    stream.add_argument("--max-partial-matches", type=BUDGET.option, default=STATE_BUDGET,
                        metavar="N", help="as for 'spark run'")
    stream.add_argument("--format", choices=("msgpack", "json"), default=None,
                        help="payload encoding (default: each payload read as what it is)")
    stream.add_argument("--map", dest="topic_map", metavar="FILE",
                        help="the service's --map: topics and payloads read as devices send "
                        "them (docs/streaming.md)")
    stream.add_argument("--max-future", type=MILLISECONDS.option, default=MAX_FUTURE_MS,
                        metavar="MS", help="as for the service: events ahead of their "
                        f"arrival by more than MS ms are dead-lettered (default {MAX_FUTURE_MS:,}; "
                        "0: off)")
    _admission_options(stream)
    stream.add_argument("--partitioning", choices=("auto", "time"), default="auto")
    stream.add_argument("--slice-ms", type=SLICE_MS.option, default=None, metavar="MS",
                        help="time-slice length (default 10 windows, at least 1 s)")
    stream.add_argument("--trigger", type=POSITIVE.option, default=1.0, metavar="S",
                        help="seconds between micro-batches (default 1)")
    stream.add_argument("--until-idle", action="store_true",
                        help="stop when every closed segment is processed (and timers fired)")
    stream.add_argument("--archive", metavar="ENV.tar.gz",
                        help="a packed environment for the executors (as for 'spark run')")
    stream.set_defaults(func=cmd_spark_stream)

    pack = jobs.add_parser(
        "pack", help="pack a Python environment with dqcep for the executors",
        description="Build a fresh virtual environment holding dqcep, its dependencies and "
        "pandas, and pack it with venv-pack into a .tar.gz that 'spark run' and 'spark "
        "stream' ship to the executors with --archive (spark.archives): the cluster's nodes "
        "need no dqcep. PySpark is not packed (the executors take the cluster's). The "
        "nodes need the same Python at the same path as this machine (a venv links to its "
        "interpreter).")
    pack.add_argument("--output", "-o", required=True, metavar="ENV.tar.gz",
                      help="the archive to write")
    pack.add_argument("--source", default=None, metavar="SPEC",
                      help="what to install as dqcep: a wheel, a source tree or a requirement "
                      "(default: this checkout when dqcep runs from one, else dqcep==VERSION)")
    pack.add_argument("--compress-level", type=int, default=4, choices=range(10),
                      metavar="0-9", help="gzip level (default 4)")
    pack.set_defaults(func=cmd_spark_pack)

    cluster = jobs.add_parser(
        "cluster", help="start or stop a local standalone cluster (master + workers)",
        description="Start a Spark standalone master and workers on free loopback ports from "
        "the pip-installed pyspark (bin/spark-class), or stop them. 'start' prints the "
        "master URL for --master.")
    cluster.add_argument("action", choices=("start", "stop"))
    cluster.add_argument("--dir", default=".dqcep-spark", metavar="DIR",
                         help="state and logs (default .dqcep-spark)")
    cluster.add_argument("--workers", type=WORKERS.option, default=2, help="workers (default 2)")
    cluster.add_argument("--cores", type=WORKERS.option, default=1, help="cores per worker (default 1)")
    cluster.add_argument("--memory", default="1g", help="memory per worker (default 1g)")
    cluster.set_defaults(func=cmd_spark_cluster)
