"""``dqcep run``: queries over an event file (or, with MQTT inputs, the streaming
service: ``dqcep.cli.serve``)."""
from __future__ import annotations

import sys

from dqcep.cli.common import (RUN_ADAPT, RUN_MATERIALIZE, adapt_of, admission_rule_of, byte_size,
                              load_queries, load_rates, materialize_of, planner_options,
                              warn_plan)
from dqcep.core.admission import LATE_REASONS, TICK_MS
from dqcep.core.errors import UserError
from dqcep.core.events import MAX_FUTURE_MS, RECENT_IDS, STATE_BUDGET
from dqcep.core.limits import (ANY, COUNT, MILLISECONDS, NON_NEGATIVE, NON_NEGATIVE_COUNT,
                           POSITIVE)


def add_parser(sub) -> None:
    """``dqcep run`` and the streaming service's options."""
    run = sub.add_parser("run", help="run queries over an event file",
                         description="Run the queries of QUERIES over the events of "
                         "--input and print one JSON line per match (docs/cli.md).")
    run.add_argument("queries", metavar="QUERIES.cep", help="query file")
    run.add_argument("--input", "-i", required=True, metavar="EVENTS", action="append",
                     help="event file (.jsonl, .msgpack, .csv), - for stdin, or "
                     "mqtt://host:port/topic (repeatable) to run as a streaming service")
    run.add_argument("--format", choices=("jsonl", "msgpack", "csv", "parquet", "json"),
                     help="event format (default: from the file extension; jsonl for -; "
                     "MQTT payloads: msgpack or json, omitted: each payload read as what it is)")
    run.add_argument("--output", "-o", metavar="OUT",
                     help="match file, mqtt://host:port/topic, a webhook (https://..., or "
                     "http:// on loopback: a POST per match with its key, retried until "
                     "taken), or a database table: "
                     "sqlite:///FILE.db or postgresql://USER@HOST:PORT/DB, with "
                     "?table=NAME (default matches); one transaction per batch, exactly "
                     "once from the MQTT service; password from DQCEP_DB_PASSWORD "
                     "(default: stdout)")
    run.add_argument("--output-token-file", metavar="FILE",
                     help="a webhook output's bearer token (one line), sent as "
                     "Authorization: Bearer")
    run.add_argument("--output-format", choices=("json", "msgpack"), default="json",
                     help="payload encoding of matches published to MQTT (default json)")
    run.add_argument("--engine", choices=("native", "sase", "reference"), default="native",
                     help="execution engine: the compiled runtime (native, default), the "
                     "SASE-style baseline (NFA with active instance stacks; SEQ queries "
                     "only), or the reference matcher (simple and exact, holds the whole "
                     "input)")
    planner_options(run, "native: ", f"default {RUN_MATERIALIZE}")
    run.add_argument("--adapt", choices=("on", "off"), default=None,
                     help="native: measure each query's time while it runs and move a "
                     "skip-till-any-match SEQ between joins and one chain where the other "
                     f"measures faster (default {RUN_ADAPT}; same matches "
                     "either way; docs/planner.md)")
    run.add_argument("--lateness", type=MILLISECONDS.option, default=0, metavar="MS",
                     help="events may arrive up to MS ms out of event-time order on their "
                     "timeline (a K-slack buffer); later ones are counted and left out, by "
                     "every engine (default 0; spec section 7)")
    run.add_argument("--skew", type=MILLISECONDS.option, metavar="MS",
                     help="how far timelines (device clocks, arrival-timed sources, a "
                     "backlog) may trail the most advanced one before their events are "
                     "late; also how long a silent stream waits before an absence is "
                     "final (default: --lateness)")
    run.add_argument("--timeline", metavar="ATTR",
                     help="events with the same value of ATTR share a timeline (events "
                     "without it share one more), each with its own --lateness; needs "
                     "--skew above --lateness (docs/streaming.md)")
    run.add_argument("--chunk-size", type=COUNT.option, default=65_536, metavar="N",
                     help="native, sase: events read and processed per step (default 65536)")
    run.add_argument("--max-partial-matches", type=NON_NEGATIVE_COUNT.option, default=STATE_BUDGET,
                     metavar="N",
                     help="native: the partial matches one buffer of a query may hold (a "
                     "join queue, a Kleene item's lists, a batch's new records; rounded up "
                     f"to a power of two; default {STATE_BUDGET}, 0: no limit). A query over it is "
                     "stopped with one line (under --adapt on, one that can run as joins "
                     "or as a chain first moves to the other); the other queries go on "
                     "(docs/runtime.md)")
    run.add_argument("--stats", action="store_true",
                     help="native: print per-vertex inputs, outputs, queue high-water marks "
                     "and evictions; sase: per query, instances pushed, matches, peak live "
                     "instances and instances pruned; both: events/s and peak state bytes, "
                     "to stderr")
    run.add_argument("--on-bad-event", choices=("fail", "skip"), default="fail",
                     help="a malformed event record stops the run with exit code 2 "
                     "(fail, default) or is reported on stderr, counted and skipped. A "
                     "repeated event id is not malformed: the later copy is always dropped "
                     f"and counted (the last {RECENT_IDS:,} ids are remembered)")
    service = run.add_argument_group("streaming service (MQTT input; docs/streaming.md)")
    service.add_argument("--state", metavar="DIR",
                         help="where the service keeps the four below (default: beside the "
                         "output file, matches.jsonl -> matches.state/; required with "
                         "--output mqtt://...)")
    service.add_argument("--journal", metavar="DIR",
                         help="durable journal of received payloads, acked once on disk "
                         "(default STATE/journal)")
    service.add_argument("--checkpoint", metavar="FILE",
                         help="engine state, journal offset and sink lengths, for restarts "
                         "(default STATE/checkpoint.bin)")
    service.add_argument("--dead-letter", metavar="FILE",
                         help="bad payloads and events with their reason "
                         "(default STATE/dead-letter.jsonl)")
    service.add_argument("--late", metavar="FILE",
                         help="events later than --lateness (default STATE/late.jsonl)")
    service.add_argument("--map", dest="topic_map", metavar="FILE",
                         help="read topics and payloads as devices send them: [[topic]] "
                         "rules in TOML (which topics, which levels are attributes or the "
                         "type, payload format, time field and unit, renames); events without "
                         "an id or a time get them from the journal (docs/streaming.md)")
    service.add_argument("--max-future", type=MILLISECONDS.option, metavar="MS",
                         help="an event whose ts is ahead of its arrival by more than MS ms "
                         "is dead-lettered and never moves the watermark (a device clock "
                         f"that runs ahead; default {MAX_FUTURE_MS:,}: 5 minutes; 0: off)")
    service.add_argument("--queries", dest="queries_hosted", metavar="NAME,...",
                         help="run only these queries of QUERIES (default: all of them)")
    service.add_argument("--workers", type=int, metavar="N",
                         help="run the queries as N worker processes, each query a journal "
                         "consumer of its own, placed round robin (docs/capacity.md)")
    service.add_argument("--target", action="append", metavar="QUERY=MS",
                         help="a query's mean response-time target (*=MS for every query): "
                         "re-plan the workers to meet it; needs --calibration")
    service.add_argument("--calibration", metavar="FILE",
                         help="written by dqcep calibrate: the costs --target places by")
    service.add_argument("--lw", type=ANY.option, default=-0.5,
                         help="with --target: scale down only when every query's deviation "
                         "(W - T) / T is below this (default -0.5)")
    service.add_argument("--hw", type=ANY.option, default=0.0,
                         help="with --target: a query above this deviation gets one worker "
                         "more than the model says (default 0)")
    service.add_argument("--replan-every", type=POSITIVE.option, default=2.0, metavar="S",
                         help="with --target: re-plan every S seconds (default 2)")
    service.add_argument("--client-id", default="dqcep-engine", metavar="ID",
                         help="MQTT client id of the persistent session (default "
                         "dqcep-engine); every service on a broker needs its own")
    service.add_argument("--tick", type=MILLISECONDS.option, metavar="MS",
                         help="journal a tick (the service clock's time) after MS ms with "
                         "no message, and every MS ms while none comes: time passes in a "
                         "silent stream, so an absence alert comes out once final "
                         f"(default {TICK_MS}; 0: off; a busy stream writes none)")
    service.add_argument("--until-idle", type=NON_NEGATIVE.option, metavar="S",
                         help="end the stream after S seconds without input: release the "
                         "matches held for a trailing NOT, checkpoint, exit 0 (SIGUSR1 does "
                         "the same at once; SIGTERM/SIGINT only pause: held matches stay in "
                         "the checkpoint for the next run)")
    service.add_argument("--journal-retention", type=byte_size, default=0, metavar="BYTES",
                         help="closed journal segments the service has checkpointed past "
                         "are deleted, but the newest BYTES of them (e.g. 500M, 2G) are kept "
                         "for replay (default 0)")
    service.add_argument("--journal-segment", type=byte_size, default=64 << 20,
                         metavar="BYTES", help="a journal segment is closed once it holds "
                         "BYTES (default 64M); retention deletes whole closed segments")
    service.add_argument("--http", metavar="HOST:PORT",
                         help="serve a live page (/), the stats (/status) and Prometheus "
                         "metrics (/metrics) on HOST:PORT (HOST default 127.0.0.1; port 0: "
                         "any free one, said at start); off unless given "
                         "(docs/operations.md)")
    service.add_argument("--http-token-file", metavar="FILE",
                         help="a file holding the token every change (and, off loopback, "
                         "every request) must carry as Authorization: Bearer TOKEN; "
                         "required to bind --http to a non-loopback address; only its "
                         "owner may read it (chmod 600)")
    service.add_argument("--http-host", action="append", metavar="NAME",
                         help="a host name the service is reached by (the Host header of "
                         "a request); besides its IP addresses, localhost and this "
                         "machine's name, which are always its own; repeat for more. A "
                         "request that names another host is refused (421)")
    service.add_argument("--stats-file", metavar="FILE", help="stats as JSON, rewritten with each stats line")
    service.add_argument("--stats-every", type=POSITIVE.option, default=10.0, metavar="S",
                         help="seconds between stats lines on stderr (default 10)")
    run.add_argument("--returns", action="store_true",
                     help="add each match's RETURN values as a \"return\" object (the "
                     "streaming service too: it keeps the events its windows reach, in the "
                     "checkpoint; its msgpack payloads are then read in Python)")
    run.set_defaults(func=command)


def command(args) -> int:
    import time

    if any(i.startswith(("mqtt://", "mqtts://")) for i in args.input):
        from dqcep.cli.serve import start_service
        return start_service(args)
    if len(args.input) != 1:
        raise UserError("give one event file (--input), or MQTT URLs")
    if args.http or args.http_token_file or args.http_host:
        given = "--http" if args.http else \
            "--http-token-file" if args.http_token_file else "--http-host"
        raise UserError(f"{given} is for the "
                        "streaming service (an MQTT --input)")
    if args.topic_map or args.max_future is not None:
        raise UserError(f"{'--map' if args.topic_map else '--max-future'} is for MQTT input "
                        "(an event file holds events with their ids and times)")
    if args.tick is not None:
        raise UserError("--tick is for the streaming service (an MQTT --input): an event "
                        "file has no ticks")
    args.input = args.input[0]
    rule = admission_rule_of(args)
    query_file = load_queries(args.queries)
    queries = query_file.queries
    if args.chunk_size < 1:
        raise UserError("--chunk-size must be >= 1")
    if args.engine == "native":
        warn_plan(query_file, load_rates(args.rates))
    if args.engine != "native" and (args.materialize or args.rates or args.adapt):
        raise UserError("--materialize, --rates and --adapt plan the native engine's joins; "
                        f"--engine {args.engine} has none")
    from dqcep.io.sinks import BackgroundSink, is_mqtt, open_match_sink
    from dqcep.runtime.pipeline import BadEvents, Pipeline

    sink = open_match_sink(args.output, args.output_format, with_returns=args.returns,
                           token_file=args.output_token_file)
    if not args.returns and args.engine != "reference" and not is_mqtt(args.output):
        sink = BackgroundSink(sink)  # a file's output overlaps matching
    bad = BadEvents(args.on_bad_event)
    view = _RunView(args.input, sys.stderr.isatty())
    late = stopped = 0
    tables = _open_tables(query_file)
    pipeline = None
    try:
        if args.engine == "reference":
            import numpy as np

            from dqcep.baseline.reference import ReferenceMatcher

            pipeline = Pipeline(None)  # its repeated-id rule: the matcher takes the whole input
            events = []
            for chunk in _event_chunks(args, bad, 1 << 20, None, view, query_file.schemas):
                fresh = pipeline.fresh(np.fromiter((e.id for e in chunk), np.int64, len(chunk)))
                events += chunk if fresh is None else [e for e, f in zip(chunk, fresh) if f]
            view.processed(len(events))
            matcher = ReferenceMatcher(queries, query_file.schemas, query_file.tables, tables,
                                       lateness=rule)
            found = matcher.run(events)
            _report_rejected(matcher.rejected, bad, args.input)
            late = len(matcher.late_ids)
            _report_late({r: matcher.late_why.count(r) for r in LATE_REASONS}, rule)
            for m in found:
                view.matches[m.query] = view.matches.get(m.query, 0) + 1
            sink.write_matches(found)  # one batch: the whole input
            seen = ({e.type for e in events}, {a for e in events for a in e.attrs})
        else:
            if args.engine == "sase":
                from dqcep.baseline import SaseEngine

                engine = SaseEngine(queries, rule, source=query_file.source,
                                    schemas=query_file.schemas, tables=query_file.tables,
                                    lookup_source=tables)
            else:
                rates = load_rates(args.rates)
                materialize = materialize_of(args, running=True)
                if not rates and materialize == "auto":  # measured on the input
                    from dqcep.io.readers import sample_rates
                    rates = sample_rates(args.input, args.format)
                if adapt_of(args):
                    from dqcep.runtime.adapt import AdaptiveEngine

                    engine = AdaptiveEngine(queries, rates=rates, materialize=materialize,
                                            schemas=query_file.schemas,
                                            tables=query_file.tables, lateness=rule,
                                            lookup_source=tables,
                                            budget=args.max_partial_matches)
                else:
                    from dqcep.plan import build_plan
                    from dqcep.runtime import Engine

                    engine = Engine(build_plan(queries, rates, materialize=materialize,
                                               schemas=query_file.schemas,
                                               tables=query_file.tables),
                                    lateness=rule, lookup_source=tables,
                                    budget=args.max_partial_matches)
            from dqcep.runtime import ReturnValues
            returns = ReturnValues(queries, engine, query_file.tables, tables) \
                if args.returns else None

            def report(out) -> None:  # before the batch's matches are written
                nonlocal stopped
                stopped += _report_stopped(out.stopped)
                _report_rejected(out.refused, bad, args.input)

            pipeline = Pipeline(engine, sink, returns=returns, tables=tables, report=report)
            started = time.perf_counter()
            fast = None if returns is not None else engine  # --returns reads Events
            for chunk in _event_chunks(args, bad, args.chunk_size, fast, view,
                                       query_file.schemas):
                if isinstance(chunk, list):  # read in Python: to columns here, at ingest
                    out = pipeline.process(engine.columns(chunk),
                                           records=chunk if returns is not None else None)
                else:
                    out = pipeline.process(chunk)
                view.processed(len(out.events.ts))
                if out.matches is not None:
                    view.count(out.matches)
            view.count(pipeline.end().matches)
            elapsed = time.perf_counter() - started
            late = engine.late
            _report_late(engine.late_counts(), rule)
            if args.stats:
                _print_stats(engine, elapsed)
            seen = engine.seen()
    finally:
        sink.close()
        view.close_bar()
        if tables is not None:
            tables.close()
    if bad.skipped:
        print(f"dqcep run: skipped {bad.skipped} bad event record(s)", file=sys.stderr)
    repeats = pipeline.counts["duplicates"]
    if repeats:
        print(f"dqcep run: dropped {repeats} event(s) repeating the id of an earlier event "
              "(the first copy is kept)", file=sys.stderr)
    _report_never_seen(query_file, *seen)
    view.summary(late, bad.skipped, repeats)
    return 1 if stopped else 0  # the matches of a stopped query are not all there


class _RunView:
    """What a person sees of a run on a terminal: a progress bar of the input's bytes
    with events/s, and at the end one summary line (events, matches per query, late,
    bad, duplicates, events/s). Off when stderr is no terminal (scripts, pipes)."""

    def __init__(self, path: str, enabled: bool):
        import os
        import time
        self.bar, self.started, self.events = None, time.perf_counter(), 0
        self.matches: dict[str, int] = {}
        if not enabled:
            return
        from tqdm import tqdm
        size = os.path.getsize(path) if path != "-" and os.path.isfile(path) else None
        self.bar = tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, leave=False,
                        file=sys.stderr, desc=os.path.basename(path) if path != "-" else "stdin")

    def read(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.bar.n)

    def processed(self, events: int) -> None:
        import time
        self.events += events
        if self.bar is not None:
            rate = self.events / max(time.perf_counter() - self.started, 1e-9)
            self.bar.set_postfix_str(f"{rate:,.0f} events/s", refresh=False)

    def count(self, batch) -> None:
        for q, detected, _, _ in batch.parts:
            name = batch.queries[q][0]
            self.matches[name] = self.matches.get(name, 0) + len(detected)

    def close_bar(self) -> None:
        """Clear the bar (before any message, an error's too)."""
        if self.bar is not None:
            self.bar.close()

    def summary(self, late: int, bad: int, duplicates: int) -> None:
        import time
        if self.bar is None:
            return
        seconds = time.perf_counter() - self.started
        per_query = ", ".join(f"{q} {n:,}" for q, n in self.matches.items())
        print(f"dqcep run: {self.events:,} events, {sum(self.matches.values()):,} matches"
              f"{f' ({per_query})' if per_query else ''}, {late:,} late, {bad:,} bad, "
              f"{duplicates:,} duplicates in {seconds:.2f} s "
              f"({self.events / max(seconds, 1e-9):,.0f} events/s)", file=sys.stderr)


def _event_chunks(args, bad, chunk_size: int, engine=None, view: _RunView | None = None,
                  schemas=()):
    """The input in arrival order, in pieces the engine takes: ``EventColumns`` where the
    format has a fast path and an ``engine`` is given, else lists of ``Event``.
    ``schemas``: the declared event schemas (their STRING attributes are text in CSV)."""
    from dqcep.io.columnar import read_columns
    from dqcep.io.readers import csv_text_attrs
    from dqcep.runtime import EventColumns

    progress = None if view is None else view.read
    for piece in read_columns(args.input, args.format, engine, bad, chunk_size, progress,
                              csv_text_attrs(schemas)):
        yield EventColumns(*piece) if isinstance(piece, tuple) else piece


def _report_late(counts: dict[str, int], rule) -> None:
    """One line for the events left out as late, by reason (spec section 7)."""
    parts = []
    if counts.get("lateness"):
        parts.append(f"{counts['lateness']} more than --lateness {rule.lateness} ms "
                     f"behind {'their timeline' if rule.timeline else 'the stream'}")
    if counts.get("skew"):
        parts.append(f"{counts['skew']} more than --skew {rule.tolerance} ms behind "
                     "the most advanced timeline")
    if parts:
        print(f"dqcep run: {sum(counts.values())} event(s) arrived late and were left "
              f"out: {'; '.join(parts)}", file=sys.stderr)


def _report_rejected(rejected: list[tuple[int, str]], bad, source: str) -> None:
    """Events a declared schema refused (``EVENT Type(...)``), as bad events."""
    for event_id, why in rejected:
        bad(UserError(f"{source}: event {event_id}: {why}"))


def _print_stats(engine, seconds: float) -> None:
    out = sys.stderr
    print(f"{'vertex':<7} {'operator':<24} {'inputs':>10} {'outputs':>10} "
          f"{'queue-hw':>9} {'evictions':>10} {'ms':>9}", file=out)
    for r in engine.vertex_stats():
        ms = f"{r['ms']:.1f}" if "ms" in r else "-"  # the native engine's vertices' time
        print(f"v{r['vertex']:<6} {r['operator'][:24]:<24} {r['inputs']:>10} "
              f"{r['outputs']:>10} {r['queue_high_water']:>9} {r['evictions']:>10} "
              f"{ms:>9}", file=out)
    rate = engine.events_in / seconds if seconds > 0 else 0.0
    print(f"events: {engine.events_in} in {seconds:.3f} s ({rate:,.0f} events/s); late "
          f"{engine.late}; peak state {engine.peak_state_bytes} bytes", file=out)
    for move in getattr(engine, "moves", ()):  # --adapt on
        print(f"adapt: {move}", file=out)


def _report_stopped(stopped: list[tuple[str, str]]) -> int:
    """The queries the engine stopped by their budget in a batch, a line each on
    stderr; how many."""
    for _, why in stopped:
        print(f"dqcep run: {why}", file=sys.stderr)
    return len(stopped)


def _open_tables(query_file):
    """The query file's lookup tables, read from their databases (None: it has none)."""
    if not query_file.tables:
        return None
    from dqcep.io.database import DatabaseTables
    tables = DatabaseTables(query_file.tables)
    for name, snap in tables.snapshots.items():
        if snap.bad_cells:
            print(f"dqcep: table {name}: {snap.bad_cells} cell(s) do not hold their declared "
                  "type and read as missing", file=sys.stderr)
    return tables


def _report_never_seen(query_file, types: set[str], attrs: set[str]) -> None:
    """Warnings for the types and attributes of the queries no input event held."""
    from dqcep.lang.check import never_seen
    for q in query_file.queries:
        for message, pos in never_seen(q, types, attrs):
            print(f"{query_file.source}:{pos.line}:{pos.col}: {message}", file=sys.stderr)
