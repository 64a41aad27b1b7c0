"""The ``dqcep`` command line (also ``python -m dqcep``).

Exit codes: 0 success, 2 a user error (bad query, bad event file, bad option),
1 an internal error. User errors print a positioned message, never a traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from dqcep import __version__
from dqcep.errors import UserError
from dqcep.events import (  # light: no numpy, --help stays fast
    MAX_FUTURE_MS, RECENT_IDS, STATE_BUDGET)
from dqcep.numbers import (ANY, COUNT, MILLISECONDS, NON_NEGATIVE, NON_NEGATIVE_COUNT,
                           POSITIVE, SHARE)

EXIT_USER_ERROR = 2
MAX_WORKERS = 1024  # --workers of dqcep run and dqcep capacity, at most


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors also exit with 2
        self.print_usage(sys.stderr)
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}\n")


def _byte_size(text: str) -> int:
    """``500M`` -> 524288000: a size with an optional K, M, G or T (powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.rstrip("KMGTkmgtBb"), text[len(text.rstrip("KMGTkmgtBb")):]
    unit = unit.upper().rstrip("B")
    try:
        value = float(number) * units[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 0, 500M, 2G)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a size cannot be negative: {text!r}")
    return int(value)


def _load_queries(path: str):
    from dqcep.lang import parse_file
    return parse_file(path)


class _BadEvents:
    """Applies --on-bad-event: raise, or report on stderr and count."""

    def __init__(self, policy: str):
        self.policy, self.skipped = policy, 0

    def __call__(self, err) -> None:
        if self.policy == "fail":
            raise err
        self.skipped += 1
        print(f"skipped: {err}", file=sys.stderr)

    def summary(self) -> None:
        if self.skipped:
            print(f"dqcep run: skipped {self.skipped} bad event record(s)", file=sys.stderr)


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


def _event_chunks(args, bad: _BadEvents, chunk_size: int, repeats: list[int], engine=None,
                  view: _RunView | None = None, schemas=()):
    """The input in arrival order, in pieces the engine takes: ``EventColumns`` where the
    format has a fast path and an ``engine`` is given, else lists of ``Event``; repeated
    ids dropped (dqcep.runtime.duplicates), counted in ``repeats[0]``. ``schemas``:
    the declared event schemas (their STRING attributes are text in CSV)."""
    import numpy as np

    from dqcep.io.columnar import read_columns
    from dqcep.io.readers import csv_text_attrs
    from dqcep.runtime import EventColumns
    from dqcep.runtime.duplicates import recent_ids

    recent = recent_ids()
    progress = None if view is None else view.read
    for piece in read_columns(args.input, args.format, engine, bad, chunk_size, progress,
                              csv_text_attrs(schemas)):
        columns = isinstance(piece, tuple)
        if columns:
            piece = EventColumns(*piece)
        ids = piece.id if columns else np.fromiter((e.id for e in piece), np.int64, len(piece))
        fresh = recent.admit(ids)
        if not fresh.all():
            repeats[0] += len(ids) - int(fresh.sum())
            piece = piece.take(fresh) if columns else [e for e, k in zip(piece, fresh) if k]
        yield piece


def _report_rejected(rejected: list[tuple[int, str]], bad: _BadEvents, source: str) -> None:
    """Events a declared schema refused (``EVENT Type(...)``), as bad events."""
    for event_id, why in rejected:
        bad(UserError(f"{source}: event {event_id}: {why}"))


def _print_stats(engine, seconds: float) -> None:
    out = sys.stderr
    print(f"{'vertex':<7} {'operator':<24} {'inputs':>10} {'outputs':>10} "
          f"{'queue-hw':>9} {'evictions':>10}", file=out)
    for r in engine.vertex_stats():
        print(f"v{r['vertex']:<6} {r['operator'][:24]:<24} {r['inputs']:>10} "
              f"{r['outputs']:>10} {r['queue_high_water']:>9} {r['evictions']:>10}", file=out)
    rate = engine.events_in / seconds if seconds > 0 else 0.0
    print(f"events: {engine.events_in} in {seconds:.3f} s ({rate:,.0f} events/s); late "
          f"{engine.late}; peak state {engine.peak_state_bytes} bytes", file=out)


def _write(batch, sink, returns) -> None:
    if returns is None:
        sink.write_batch(batch)
        return
    sink.write_matches([returns.fill(m) for m in batch.to_matches()])


def _state_dir(args):
    """Where the service keeps its journal, checkpoint, dead letters and late events
    unless each is named: ``--state DIR``, else beside a file output
    (``matches.jsonl`` -> ``matches.state``); None when all four are named."""
    from pathlib import Path

    from dqcep.io.database import is_database
    from dqcep.io.sinks import is_mqtt
    if args.state:
        return Path(args.state)
    if args.journal and args.checkpoint and args.dead_letter and args.late:
        return None
    if is_mqtt(args.output) or is_database(args.output):
        raise UserError(f"with --output {args.output.split(':', 1)[0]}://..., say where the "
                        "service keeps its state: --state DIR")
    out = Path(args.output)
    return out.with_name(out.stem + ".state")


def _serve(args) -> int:
    from pathlib import Path

    from dqcep.service import ServiceConfig, serve

    if not all(i.startswith(("mqtt://", "mqtts://")) for i in args.input):
        raise UserError("MQTT inputs cannot be mixed with files")
    if args.engine != "native":
        raise UserError("the streaming service runs the native engine")
    if not args.output or args.output == "-":
        raise UserError("an MQTT input needs --output FILE or mqtt://... (not stdout: a restart "
                        "cuts a file back to the checkpoint)")
    state = _state_dir(args)
    named = Path(".") if state is None else state  # every path named: nothing derived
    from dqcep.io.mapping import TopicMap
    if args.topic_map:
        TopicMap.load(args.topic_map)  # a bad rule is refused before anything starts
    fmt = args.format
    if fmt not in (None, "msgpack", "json"):
        raise UserError("MQTT payloads are msgpack or json (--format; omitted: each "
                        "payload's own)")
    query_file = _load_queries(args.queries)  # positioned errors before anything starts
    _warn_plan(query_file, _load_rates(args.rates))
    cfg = ServiceConfig(
        queries=args.queries, inputs=args.input,
        journal=args.journal or str(named / "journal"),
        checkpoint=args.checkpoint or str(named / "checkpoint.bin"), output=args.output,
        dead_letter=args.dead_letter or str(named / "dead-letter.jsonl"),
        late=args.late or str(named / "late.jsonl"), state=state and str(state),
        fmt=fmt, lateness=args.lateness, topic_map=args.topic_map,
        max_future=MAX_FUTURE_MS if args.max_future is None else args.max_future,
        output_format=args.output_format, client_id=args.client_id,
        stats_every=args.stats_every, stats_file=args.stats_file,
        until_idle=args.until_idle, journal_retention=args.journal_retention,
        journal_segment_bytes=args.journal_segment, materialize=args.materialize,
        rates=_load_rates(args.rates), budget=args.max_partial_matches,
        returns=args.returns,
        hosted=args.queries_hosted.split(",") if args.queries_hosted else None)
    if args.workers is None and not args.target:
        return serve(cfg)
    return _serve_workers(args, cfg, [q.name for q in query_file.queries])


def _serve_workers(args, cfg, names: list[str]) -> int:
    """--workers N and/or --target Q=MS --calibration FILE: the service as workers."""
    from dqcep.io.database import is_database
    from dqcep.workers import Scaling, round_robin, serve_workers

    if is_database(cfg.output):
        raise UserError("--workers and --target write a file or a topic (--output); a "
                        "database output takes one service")
    if cfg.hosted is not None:
        raise UserError("--queries runs one service; with --workers every query of the "
                        "file is placed")
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise UserError(f"--workers must be >= 1 and <= {MAX_WORKERS}")
    _check_water_marks(args)
    if bool(args.target) != bool(args.calibration):
        raise UserError("--target needs --calibration FILE (dqcep calibrate) to place the "
                        "queries by" if args.target else
                        "--calibration is what --target places by; give --target QUERY=MS")
    scaling = None
    if args.target:
        targets = {q: ms / 1000 for q, ms in _named_values(args.target, "target",
                                                           names).items()}
        scaling = Scaling({n: targets.get(n, float("inf")) for n in names},
                          _read_calibration(args.calibration), lw=args.lw, hw=args.hw,
                          replan_every=args.replan_every)
    workers = args.workers or 1
    return serve_workers(cfg, round_robin(names, min(workers, len(names))), scaling)


def _read_calibration(path: str):
    import json

    from dqcep.capacity import Calibration
    try:
        with open(path, encoding="utf-8") as f:
            return Calibration.from_json(json.load(f), path)
    except OSError as err:
        raise UserError(f"cannot read calibration {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None


def cmd_run(args) -> int:
    import time

    if any(i.startswith(("mqtt://", "mqtts://")) for i in args.input):
        return _serve(args)
    if len(args.input) != 1:
        raise UserError("give one event file (--input), or MQTT URLs")
    if args.topic_map or args.max_future is not None:
        raise UserError(f"{'--map' if args.topic_map else '--max-future'} is for MQTT input "
                        "(an event file holds events with their ids and times)")
    args.input = args.input[0]
    query_file = _load_queries(args.queries)
    queries = query_file.queries
    if args.chunk_size < 1:
        raise UserError("--chunk-size must be >= 1")
    if args.engine == "native":
        _warn_plan(query_file, _load_rates(args.rates))
    if args.engine != "native" and (args.materialize != "always" or args.rates):
        raise UserError("--materialize and --rates plan the native engine's joins; "
                        f"--engine {args.engine} has none")
    from dqcep.io.sinks import BackgroundSink, is_mqtt, open_match_sink

    sink = open_match_sink(args.output, args.output_format, with_returns=args.returns)
    if not args.returns and args.engine != "reference" and not is_mqtt(args.output):
        sink = BackgroundSink(sink)  # a file's output overlaps matching
    bad, repeats = _BadEvents(args.on_bad_event), [0]
    view = _RunView(args.input, sys.stderr.isatty())
    late = stopped = 0
    tables = _open_tables(query_file)
    try:
        if args.engine == "reference":
            from dqcep.reference import ReferenceMatcher

            events = [e for chunk in _event_chunks(args, bad, 1 << 20, repeats, None, view,
                                                   query_file.schemas)
                      for e in chunk]
            view.processed(len(events))
            matcher = ReferenceMatcher(queries, query_file.schemas, query_file.tables, tables)
            found = matcher.run(events)
            _report_rejected(matcher.rejected, bad, args.input)
            for m in found:
                view.matches[m.query] = view.matches.get(m.query, 0) + 1
            sink.write_matches(found)  # one batch: the whole input
            seen = ({e.type for e in events}, {a for e in events for a in e.attrs})
        else:
            if args.engine == "sase":
                from dqcep.baseline import SaseEngine

                engine = SaseEngine(queries, args.lateness, source=query_file.source,
                                    schemas=query_file.schemas, tables=query_file.tables,
                                    lookup_source=tables)
            else:
                from dqcep.plan import build_plan
                from dqcep.runtime import Engine

                engine = Engine(build_plan(queries, _load_rates(args.rates),
                                           materialize=args.materialize,
                                           schemas=query_file.schemas,
                                           tables=query_file.tables),
                                lateness=args.lateness, lookup_source=tables,
                                budget=args.max_partial_matches)
            from dqcep.runtime import ReturnValues
            returns = ReturnValues(queries, engine, query_file.tables, tables) \
                if args.returns else None
            started = time.perf_counter()
            fast = None if returns is not None else engine  # --returns reads Events
            for chunk in _event_chunks(args, bad, args.chunk_size, repeats, fast, view,
                                       query_file.schemas):
                if tables is not None:  # one snapshot per batch, read again when due
                    _refresh(tables)
                if returns is not None:
                    returns.remember(chunk)
                matches = engine.process(chunk)
                stopped += _report_stopped(engine)
                _report_rejected(engine.take_rejected(), bad, args.input)
                view.processed(len(chunk.ts) if isinstance(chunk, tuple) else len(chunk))
                view.count(matches)
                _write(matches, sink, returns)
            matches = engine.flush()
            stopped += _report_stopped(engine)
            view.count(matches)
            _write(matches, sink, returns)
            elapsed = time.perf_counter() - started
            late = engine.late
            if engine.late:
                print(f"dqcep run: {engine.late} event(s) arrived more than --lateness "
                      f"{args.lateness} ms late and were left out", file=sys.stderr)
            if args.stats:
                _print_stats(engine, elapsed)
            seen = engine.seen()
    finally:
        sink.close()
        view.close_bar()
        if tables is not None:
            tables.close()
    bad.summary()
    if repeats[0]:
        print(f"dqcep run: dropped {repeats[0]} event(s) repeating the id of an earlier event "
              "(the first copy is kept)", file=sys.stderr)
    _report_never_seen(query_file, *seen)
    view.summary(late, bad.skipped, repeats[0])
    return 1 if stopped else 0  # the matches of a stopped query are not all there


def _report_stopped(engine) -> int:
    """The queries the engine stopped by their budget since the last call, a line
    each on stderr; how many."""
    stopped = engine.take_stopped() if hasattr(engine, "take_stopped") else []
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


def _refresh(tables) -> None:
    """Read the lookup tables again where due; a failed read keeps the last snapshot
    and is said once."""
    stale = tables.refresh()
    if stale:
        print(f"dqcep: cannot read lookup {stale}; going on with the last snapshot",
              file=sys.stderr)


def _report_never_seen(query_file, types: set[str], attrs: set[str]) -> None:
    """Warnings for the types and attributes of the queries no input event held."""
    from dqcep.lang.check import never_seen
    for q in query_file.queries:
        for message, pos in never_seen(q, types, attrs):
            print(f"{query_file.source}:{pos.line}:{pos.col}: {message}", file=sys.stderr)



def _load_rates(path: str | None) -> dict[str, float]:
    if path is None:
        return {}
    import json

    try:
        with open(path, encoding="utf-8") as f:
            rates = json.load(f)
    except OSError as err:
        raise UserError(f"cannot read rates file {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    if not isinstance(rates, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
            and v >= 0 for k, v in rates.items()):
        raise UserError(f"{path}: rates must be a JSON object of event type -> events per "
                        "second (a number >= 0)")
    return rates


def _planner_options(parser, only: str = "") -> None:
    from dqcep.plan.joins import MATERIALIZE_MODES

    parser.add_argument("--materialize", choices=MATERIALIZE_MODES, default="always",
                        help=only + "which SEQ joins keep their partial matches as records "
                        "(always, default), build them on demand from their inputs when "
                        "their parent needs them (on-demand, where the plan allows it), or "
                        "choose per join by the cost model (auto); same matches either way "
                        "(docs/planner.md)")
    parser.add_argument("--rates", metavar="FILE",
                        help=only + "JSON object {event type: events per second} for the "
                        "cost model (default: 1 event/s for every type)")


def cmd_calibrate(args) -> int:
    import json
    from pathlib import Path

    from dqcep.calibration import calibrate, payloads_of
    from dqcep.io.readers import read_events

    _load_queries(args.queries)  # its errors, with positions, before any work
    if args.batch_size < 1:
        raise UserError("--batch-size must be >= 1")
    if args.broker and not args.broker.startswith(("mqtt://", "mqtts://")):
        raise UserError(f"--broker {args.broker}: give mqtt://host:port/topic")
    if args.gap < 0:
        raise UserError("--gap must be >= 0")
    if args.workers < 1 or args.workers > 1 and not args.broker:
        raise UserError("--workers N (>= 1) is for the live calibration, with --broker")
    if args.loads is not None and not args.broker:
        raise UserError("--loads is for the live calibration, with --broker")
    if args.repeat is not None and (args.repeat < 1 or not args.broker):
        raise UserError("--repeat N (>= 1) is for the live calibration, with --broker")
    try:
        loads = [float(x) for x in (args.loads if args.loads is not None else
                                    "0.4,0.8" if args.broker else "").split(",") if x]
    except ValueError:
        raise UserError(f"--loads {args.loads}: give shares such as 0.4,0.8") from None
    if any(not 0 < x < 1.5 for x in loads):
        raise UserError(f"--loads {args.loads}: each share must be above 0 and below 1.5")
    bad = _BadEvents("skip")
    events = [e.as_mapping() for _, e in read_events(args.input, args.format, bad)]
    if not events:
        raise UserError(f"{args.input} holds no event to calibrate with")
    journal_dir = args.journal or str(Path(args.output).resolve().parent)
    result = calibrate(args.queries, payloads_of(events, args.batch_size), args.batch_size,
                       journal_dir, broker=args.broker, gap=args.gap / 1000,
                       workers=args.workers, loads=loads,
                       repeats=args.repeat or (3 if args.broker else 1))
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(result.to_json(), f, indent=2)
        f.write("\n")

    def sd(c):
        return max(c.m2 - c.b * c.b, 0.0) ** 0.5 * 1e3
    print(f"{'per payload (ms)':<20} {'alone':>9} {'sd':>9} {'charged shared':>15}")
    for name, c in result.alone.items():
        print(f"{name:<20} {c.b * 1e3:>9.4f} {sd(c):>9.4f} {result.shared[name].b * 1e3:>15.4f}")
    print(f"{'own work (overhead)':<20} {result.overhead.b * 1e3:>9.4f} "
          f"{sd(result.overhead):>9.4f}")
    print(f"{'delay':<20} {result.delay * 1e3:>9.4f}")
    print(f"{'checkpoint':<20} {result.checkpoint.b * 1e3:>9.4f} {sd(result.checkpoint):>9.4f}"
          f"  every {result.checkpoint_every:g} s")
    for p in result.points:  # the same at a higher rate
        print(f"at {p.rate * args.batch_size:,.0f} events/s: shared plan "
              f"{p.shared_b * 1e3:.4f} ms per payload; alone "
              + ", ".join(f"{q} {c.b * 1e3:.4f}" for q, c in p.alone.items()))
    total = sum(c.b for c in result.alone.values())
    plan = sum(c.b for c in result.shared.values())
    print(f"shared plan {result.shared_b * 1e3:.4f} ms per payload with the overhead "
          f"({plan / total if total else 1:.2f}x the queries alone without it); "
          f"{result.payloads:,} payloads of {args.batch_size} events; written to "
          f"{args.output}", file=sys.stderr)
    return 0


def _check_water_marks(args) -> None:
    if args.lw > args.hw:
        raise UserError(f"--lw {args.lw:g} must not exceed --hw {args.hw:g} (the low "
                        "water-mark is below the high one)")


def _named_values(items: list[str], what: str, names: list[str]) -> dict[str, float]:
    """``NAME=VALUE`` options (``*=VALUE``: every query) as {query: value}."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        try:
            number = POSITIVE.check(value)
        except ValueError:
            number = None
        if not sep or number is None:
            raise UserError(f"--{what} {item}: give QUERY=NUMBER (a finite number > 0; "
                            "*=NUMBER for every query)")
        if name != "*" and name not in names:
            raise UserError(f"--{what} {item}: no query {name!r} (the queries: "
                            f"{', '.join(names)})")
        for q in (names if name == "*" else [name]):
            out[q] = number
    return out


def cmd_capacity(args) -> int:
    import json
    import math

    from dqcep.capacity import deviation, place

    _check_water_marks(args)
    query_file = _load_queries(args.queries)
    names = [q.name for q in query_file.queries]
    calibration = _read_calibration(args.calibration)
    if args.consumers and (args.separate or args.spark):
        raise UserError("--consumers is how dqcep run --workers runs the queries; it "
                        "takes neither --separate nor --spark")
    missing = [n for n in names if n not in calibration.alone]
    if missing:
        raise UserError(f"{args.calibration} has no calibration of {', '.join(missing)} "
                        f"(run dqcep calibrate {args.queries} ...)")
    # --rate N (or *=N): the one stream the service reads, for every query without a
    # rate of its own; --rate Q=N: Q reads a stream of its own
    items = [("*=" + r if "=" not in r else r) for r in args.rate or []]
    common = [r for r in items if r.startswith("*=")]
    if len(common) > 1:
        raise UserError("--rate N (the stream every query reads) was given twice")
    stream = _named_values(common, "rate", names)
    own = _named_values([r for r in items if not r.startswith("*=")], "rate", names)
    rates = {**stream, **own}
    if set(rates) != set(names):
        raise UserError("give the stream's arrival rate in events/s (--rate N), or each "
                        "query's: --rate " + " ".join(f"{n}=N" for n in names
                                                     if n not in rates))
    if args.consumers and own:
        raise UserError("with --consumers every query reads the one journal: give the "
                        "stream's rate (--rate N), not a query's own")
    stream_of = {n: "the stream" for n in names if n not in own}
    targets = {q: ms / 1000 for q, ms in _named_values(args.target, "target", names).items()}
    targets = {n: targets.get(n, math.inf) for n in names}
    if args.spark:
        return _spark_bounds(args, calibration, stream, own, targets)
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise UserError(f"--workers must be >= 1 and <= {MAX_WORKERS}")
    # the model's customer is a payload of the calibration's batch_events events; the
    # costs are those at that rate (measured at several: the time per payload falls)
    payload_rates = {n: r / calibration.batch_events for n, r in rates.items()}
    costs = calibration.consumer_costs(payload_rates[names[0]]) if args.consumers else \
        calibration.costs(not args.separate, payload_rates)
    placement = place([costs[n] for n in names], payload_rates, targets,
                      workers=args.workers, lw=args.lw, hw=args.hw, rho_max=args.rho_max,
                      model=calibration.consumer_model(names) if args.consumers
                      else calibration.model(stream_of))
    report = {"met": placement.met, "below_lw": placement.below_lw, "workers": [
        {"load": w.load, "saturated": w.load >= 1, "queries": [
            {"name": c.name, "rate": rates[c.name],
             "stream": stream_of.get(c.name, "its own"), "b_ms": c.b * 1e3,
             "predicted_ms": w.response[c.name] * 1e3,
             "target_ms": None if math.isinf(targets[c.name]) else targets[c.name] * 1e3,
             "deviation": None if math.isinf(targets[c.name])
             else deviation(w.response[c.name], targets[c.name])}
            for c in w.queries]} for w in placement.workers]}
    model = calibration.consumer_model(names) if args.consumers else \
        calibration.model(stream_of)
    report["missed"] = _missed_targets(report, costs, targets, model, args)
    if args.json:  # a saturated worker's queries never answer: null, not JSON's missing inf
        for q in (q for w in report["workers"] for q in w["queries"]):
            q.update({k: None for k in ("predicted_ms", "deviation")
                      if q[k] is not None and math.isinf(q[k])})
        print(json.dumps(report, indent=2, allow_nan=False, default=str))
        return 0 if placement.met else 1
    how = (f"on {args.workers} worker(s)" if args.workers is not None else
           f"on {len(placement.workers)} worker(s), the fewest that meet every target")
    if args.consumers:
        how += ", a consumer per query, served in the order listed"
    print(f"{len(names)} queries {how} (load <= {args.rho_max}, deviation <= {args.hw}); "
          f"{'every target met' if placement.met else 'NOT every target met'}")
    for i, w in enumerate(report["workers"], 1):
        print(f"worker {i}: load {w['load']:.3f}")
        for q in w["queries"]:
            target = "no target" if q["target_ms"] is None else \
                f"target {q['target_ms']:g} ms, deviation {q['deviation']:+.2f}"
            print(f"  {q['name']:<20} {q['rate']:>10,.0f} events/s  predicted "
                  f"{q['predicted_ms']:.3f} ms  ({target})")
    if placement.below_lw:
        print(f"further below their targets than --lw {args.lw}: "
              f"{', '.join(placement.below_lw)}")
    for why in report["missed"]:
        print(f"missed: {why}")
    return 0 if placement.met else 1


def _missed_targets(report: dict, costs: dict, targets: dict, model, args) -> list[str]:
    """Why a placement does not meet every target, one line per worker over --rho-max
    and per query above its target (what its response is made of)."""
    from dqcep.capacity import deviation, response_times
    out = []
    for i, w in enumerate(report["workers"], 1):
        if w["load"] >= 1:
            out.append(f"worker {i} is saturated (load {w['load']:.3f} >= 1): its queries "
                       "never catch up; more workers (--workers) or a lower rate")
        elif w["load"] > args.rho_max:
            out.append(f"worker {i}'s load {w['load']:.3f} exceeds --rho-max {args.rho_max}")
        for q in w["queries"]:
            if q["deviation"] is None or q["deviation"] <= args.hw or w["load"] >= 1:
                continue
            name = q["name"]
            # what the query takes alone on an idle worker: the calibrated delay and its
            # own processing; no placement answers sooner
            idle = response_times([costs[name]], {name: 0.0}, model)[name] * 1e3
            why = (f"alone on an idle worker it answers in {idle:.3f} ms (the calibrated "
                   f"delay {model.delay * 1e3:.3f} ms and its processing "
                   f"{costs[name].b * 1e3:.3f} ms): no placement meets the target"
                   if deviation(idle, q["target_ms"]) > args.hw else
                   f"waiting behind worker {i}'s other work (load {w['load']:.3f}) adds "
                   f"{q['predicted_ms'] - idle:.3f} ms: more workers (--workers) or a "
                   "looser target")
            out.append(f"{name}: predicted {q['predicted_ms']:.3f} ms, target "
                       f"{q['target_ms']:g} ms (deviation {q['deviation']:+.2f} > --hw "
                       f"{args.hw}); {why}")
    return out


def _spark_bounds(args, calibration, stream: dict, own: dict, targets: dict) -> int:
    """dqcep capacity --spark: spark.dynamicAllocation's bounds for the tightest target,
    the stream divided evenly among executors of one core (docs/capacity.md)."""
    import json
    import math

    from dqcep.capacity import executors

    if own or not stream:
        raise UserError("--spark sizes the one stream the Spark jobs read: give --rate N "
                        "(events/s at the peak), not a rate per query")
    target = min(targets.values())
    if math.isinf(target):
        raise UserError("--spark needs a response-time target: --target QUERY=MS")
    peak = next(iter(stream.values()))
    if args.rate_low is not None and not 0 < args.rate_low <= peak:
        raise UserError("--rate-low must be > 0 and at most --rate")
    most = executors(calibration, peak, target, args.hw, args.rho_max)
    if most is None:
        raise UserError(f"no number of executors meets {target * 1000:g} ms: one payload "
                        f"of {calibration.batch_events} events takes "
                        f"{calibration.shared_b * 1000:.3f} ms after a delay of "
                        f"{calibration.delay * 1000:.3f} ms")
    least = executors(calibration, args.rate_low, target, args.hw, args.rho_max) \
        if args.rate_low is not None else 1
    conf = {"spark.dynamicAllocation.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.minExecutors": str(least),
            "spark.dynamicAllocation.maxExecutors": str(most),
            "spark.executor.cores": "1"}
    if args.json:
        print(json.dumps({"target_ms": target * 1000, "rate": peak,
                          "rate_low": args.rate_low, "conf": conf}, indent=2))
        return 0
    low = f"{args.rate_low:,.0f}" if args.rate_low is not None else "none given"
    print(f"Spark executors of one core for {target * 1000:g} ms (the tightest target): "
          f"{most} at {peak:,.0f} events/s, {least} at the low rate ({low})")
    print(" ".join(f"--conf {k}={v}" for k, v in conf.items()))
    return 0


def cmd_explain(args) -> int:
    from dqcep.plan import build_plan, explain_dot, explain_text

    queries = _load_queries(args.queries)
    rates = _load_rates(args.rates)
    plan = build_plan(queries.queries, rates, materialize=args.materialize,
                      schemas=queries.schemas, tables=queries.tables)
    _warn_plan(queries, rates)
    sys.stdout.write(explain_dot(plan) if args.dot else explain_text(plan))
    return 0


def _warn_plan(query_file, rates: dict[str, float]) -> None:
    """What the queries as written may cost (``dqcep.plan.warnings``), on stderr."""
    from dqcep.plan.warnings import kleene_warnings
    for message, pos in kleene_warnings(query_file.queries, rates):
        print(f"{query_file.source}:{pos.line}:{pos.col}: {message}", file=sys.stderr)


def cmd_publish(args) -> int:
    """Publish an event file to MQTT, one message per event, as devices send them."""
    from dqcep.io.mqtt import MqttPublisher, MqttUrl
    from dqcep.io.publish import Pacer, TopicTemplate, messages, shape_from_args
    from dqcep.io.readers import read_events

    url = MqttUrl.parse(args.url)
    template = TopicTemplate(url.topic)
    shape = shape_from_args(args, template)
    pacer = Pacer(args.rate)
    events = read_events(args.input, args.format)  # a bad record stops it, with its place
    progress = None
    if not args.quiet:
        from tqdm import tqdm
        progress = tqdm(unit="msg", unit_scale=True, file=sys.stderr, leave=False,
                        desc=f"publish {args.input}")
    publisher = MqttPublisher(url, client_id=args.client_id or "")
    sent = 0
    try:
        for topic, payload in messages(events, template, shape):
            pacer.wait(1)
            publisher.publish(payload, topic=topic)
            sent += 1
            if progress is not None and sent % 256 == 0:
                progress.update(256)
    finally:
        if progress is not None:
            progress.close()
        publisher.close()  # waits for every acknowledgement
    if not args.quiet:
        print(f"dqcep publish: {sent} messages to {url.host}:{url.port} ({args.payload} "
              "payloads), all acknowledged", file=sys.stderr)
    return 0


def cmd_generate(args) -> int:
    from dqcep.generator.cli import run

    return run(args)


def cmd_experiment(args) -> int:
    from dqcep.experiments.run import run_experiments

    sizes = None
    if args.sizes:
        try:
            sizes = [int(float(x)) for x in args.sizes.split(",")]
        except ValueError:
            raise UserError(f"--sizes: expected comma-separated event counts, got "
                            f"{args.sizes!r}") from None
    command = "dqcep experiment " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["experiment"] \
        else f"dqcep experiment {args.name} --out {args.out}"
    for path in run_experiments(args.name, args.out, args.quick, args.seed, sizes, command):
        print(path)
    return 0


def cmd_demo(args) -> int:
    from dqcep.demo import run_demo, run_demo_mqtt

    if args.events is None:
        args.events = 50_000 if args.mqtt else 200_000
    if args.events < 1:
        raise UserError("--events must be >= 1")
    if args.mqtt:
        return run_demo_mqtt(args.events, args.seed, args.show, args.broker)
    if args.broker:
        raise UserError("--broker goes with --mqtt")
    return run_demo(args.events, args.seed, args.show)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dqcep", description="Complex event processing over IoT streams: "
                "pattern queries (SEQ, AND, OR, NOT, WHERE, WITHIN) over events.")
    p.add_argument("--version", action="version", version=f"dqcep {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=_Parser)

    explain = sub.add_parser(
        "explain", help="show the decomposed, shared query plan",
        description="Plan the queries of QUERIES into one DAG of simplest sub-queries and "
        "print it: vertices in topological order with their slots, windows, partition keys, "
        "cost estimates, predicates and NOT guards; shared vertices are marked; then each "
        "query's output and the filters that can be pushed down to preprocessing.")
    explain.add_argument("queries", metavar="QUERIES.cep", help="query file")
    explain.add_argument("--dot", action="store_true", help="print Graphviz DOT instead")
    _planner_options(explain)
    explain.set_defaults(func=cmd_explain)

    cal = sub.add_parser(
        "calibrate", help="measure each query's processing time per payload (for capacity)",
        description="Cut EVENTS into payloads of --batch-size events, as MQTT delivers "
        "them, and run the streaming service's own path over them (journal read, decoding, "
        "repeated ids, engine, match output) hosting each query of QUERIES alone, then all "
        "of them (the shared plan), timed payload by payload; time the service's own work "
        "per payload without an engine and the journal's commit (fsync) in --journal. "
        "Writes each query's mean time per payload and its second moment (alone, and "
        "charged from the shared plan in proportion to its time alone), the own work and "
        "the commit to --output. docs/capacity.md says what is measured and assumed.")
    cal.add_argument("queries", metavar="QUERIES.cep", help="query file")
    cal.add_argument("--input", "-i", required=True, metavar="EVENTS", help="event file")
    cal.add_argument("--format", choices=("jsonl", "msgpack", "csv", "parquet"),
                     help="input format (default: from the extension)")
    cal.add_argument("--batch-size", type=COUNT.option, default=200, metavar="N",
                     help="events per payload (default 200)")
    cal.add_argument("--broker", metavar="mqtt://HOST:PORT/TOPIC",
                     help="calibrate live: run each service as dqcep run against this broker "
                     "and publish the payloads below TOPIC (default: in this process, no "
                     "broker)")
    cal.add_argument("--workers", type=int, default=1, metavar="N",
                     help="with --broker: measure the queries alone as dqcep run --workers N "
                     "would run them (default 1; a consumer's cost grows with the processes "
                     "beside it)")
    cal.add_argument("--gap", type=NON_NEGATIVE.option, default=2.0, metavar="MS",
                     help="idle time before each payload (default 2 ms: low load)")
    cal.add_argument("--loads", metavar="SHARES",
                     help="with --broker: measure again with Poisson arrivals at these shares "
                     "of the shared plan's capacity (default 0.4,0.8; '' for none): the time "
                     "per payload falls as the rate rises (batching)")
    cal.add_argument("--repeat", type=int, metavar="N",
                     help="with --broker: every run N times, the median kept (default 3: a "
                     "shared machine's interference comes and goes)")
    cal.add_argument("--journal", metavar="DIR",
                     help="where the service's journal will live, for the commit time "
                     "(default: the directory of --output)")
    cal.add_argument("--output", "-o", default="calibration.json", metavar="FILE",
                     help="where the calibration goes (default calibration.json)")
    cal.set_defaults(func=cmd_calibrate)

    cap = sub.add_parser(
        "capacity", help="predict response times and place queries on workers",
        description="From a calibration (dqcep calibrate), the stream's arrival rate (or "
        "each query's) and the response-time targets: the payloads each worker reads as a "
        "multi-class M/G/1 queue (Pollaczek-Khinchine), its queries placed by first-fit "
        "decreasing on the fewest workers that keep every query's deviation (W - T) / T <= --hw and every worker's load <= "
        "--rho-max, or on --workers N; prints each worker's queries, load and predicted "
        "mean response times (docs/capacity.md).")
    cap.add_argument("queries", metavar="QUERIES.cep", help="query file")
    cap.add_argument("--calibration", required=True, metavar="FILE",
                     help="written by dqcep calibrate")
    cap.add_argument("--rate", action="append", metavar="[QUERY=]EVENTS_PER_S",
                     help="events/s of the stream every query reads (N or *=N); QUERY=N: "
                     "that query reads a stream of its own at N")
    cap.add_argument("--target", action="append", metavar="QUERY=MS",
                     help="a query's mean response-time target (*=MS for every query)")
    cap.add_argument("--workers", type=int, metavar="N",
                     help="place on N workers (default: the fewest that meet every target)")
    cap.add_argument("--separate", action="store_true",
                     help="cost each query as if alone (default: charged from the shared plan)")
    cap.add_argument("--consumers", action="store_true",
                     help="as dqcep run --workers / --target runs the queries: a journal "
                     "consumer per query, a worker's consumers served in turn, the tightest "
                     "target first (default: each worker runs its queries as one plan)")
    cap.add_argument("--lw", type=ANY.option, default=-0.5, help="low water-mark (default -0.5)")
    cap.add_argument("--hw", type=ANY.option, default=0.0, help="high water-mark (default 0)")
    cap.add_argument("--rho-max", type=SHARE.option, default=0.8,
                     help="load threshold per worker (default 0.8)")
    cap.add_argument("--spark", action="store_true",
                     help="print spark.dynamicAllocation's bounds instead: executors of one "
                     "core for the tightest --target, --rate the peak, the stream divided "
                     "evenly among them (docs/capacity.md)")
    cap.add_argument("--rate-low", type=POSITIVE.option, metavar="EVENTS_PER_S",
                     help="with --spark: the lowest rate, for minExecutors (default: 1)")
    cap.add_argument("--json", action="store_true", help="print JSON instead of text")
    cap.set_defaults(func=cmd_capacity)

    demo = sub.add_parser(
        "demo", help="run example queries over a generated IoT stream (no services needed)",
        description="Generate an IoT sensor stream with planted occurrences of the demo "
        "queries (dqcep/data/iot.cep), run it through the native engine and print matches, "
        "recall of the planted occurrences and the engine's figures.")
    demo.add_argument("--events", "-n", type=COUNT.option, default=None,
                      help="events to generate (default 200000; 50000 with --mqtt)")
    demo.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    demo.add_argument("--show", type=NON_NEGATIVE_COUNT.option, default=10, help="matches to print (default 10)")
    demo.add_argument("--mqtt", action="store_true",
                      help="go through a real MQTT broker and the streaming service: the one "
                      "at --broker, else localhost:1883, else a Mosquitto started for the demo")
    demo.add_argument("--broker", metavar="HOST:PORT", help="the MQTT broker for --mqtt")
    demo.set_defaults(func=cmd_demo)

    from dqcep.spark.cli import add_spark_parser
    add_spark_parser(sub, _Parser)

    from dqcep.generator.cli import DESCRIPTION, add_arguments

    generate = sub.add_parser("generate", help="write or publish a synthetic event stream",
                              description=DESCRIPTION)
    add_arguments(generate)
    generate.set_defaults(func=cmd_generate)

    pub = sub.add_parser(
        "publish", help="publish an event file to MQTT as devices send it",
        description="Send the events of a file (JSON Lines, msgpack, CSV, Parquet) to an "
        "MQTT broker with QoS 1, one message per event, its topic from a template "
        "(mqtt://host:port/sensors/{room}/{type}: {type}, {id}, {ts} or any attribute) and "
        "its payload of a shape (--payload): what a feed of real devices looks like, for "
        "the service's --map (docs/streaming.md). Waits until the broker has acknowledged "
        "every message.")
    pub.add_argument("input", metavar="EVENTS", help="event file, or - for stdin (JSON Lines)")
    pub.add_argument("url", metavar="mqtt://HOST:PORT/TOPIC-TEMPLATE",
                     help="the broker and the topic of each event (a template)")
    pub.add_argument("--format", choices=("jsonl", "msgpack", "csv", "parquet", "json"),
                     help="event format (default: from the file extension)")
    from dqcep.io.publish import add_shape_arguments
    add_shape_arguments(pub, ("event", "object", "value"), "event")
    pub.add_argument("--rate", type=POSITIVE.option, metavar="N",
                     help="messages per second (default: as fast as the broker acknowledges)")
    pub.add_argument("--client-id", metavar="ID", help="MQTT client id (default: the broker's)")
    pub.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    pub.set_defaults(func=cmd_publish)

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
                     help="match file, mqtt://host:port/topic, or a database table: "
                     "sqlite:///FILE.db or postgresql://USER@HOST:PORT/DB, with "
                     "?table=NAME (default matches); one transaction per batch, exactly "
                     "once from the MQTT service; password from DQCEP_DB_PASSWORD "
                     "(default: stdout)")
    run.add_argument("--output-format", choices=("json", "msgpack"), default="json",
                     help="payload encoding of matches published to MQTT (default json)")
    run.add_argument("--engine", choices=("native", "sase", "reference"), default="native",
                     help="execution engine: the compiled runtime (native, default), the "
                     "SASE-style baseline (NFA with active instance stacks; SEQ queries "
                     "only), or the reference matcher (simple and exact, holds the whole "
                     "input)")
    _planner_options(run, "native: ")
    run.add_argument("--lateness", type=MILLISECONDS.option, default=0, metavar="MS",
                     help="native, sase: events may arrive up to MS ms out of event-time order "
                     "(a K-slack buffer); later ones are counted and left out (default 0)")
    run.add_argument("--chunk-size", type=COUNT.option, default=65_536, metavar="N",
                     help="native, sase: events read and processed per step (default 65536)")
    run.add_argument("--max-partial-matches", type=NON_NEGATIVE_COUNT.option, default=STATE_BUDGET,
                     metavar="N",
                     help="native: the partial matches one buffer of a query may hold (a "
                     "join queue, a Kleene item's lists, a batch's new records; rounded up "
                     f"to a power of two; default {STATE_BUDGET}, 0: no limit). A query over it is "
                     "stopped with one line; the other queries go on (docs/runtime.md)")
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
    service.add_argument("--until-idle", type=NON_NEGATIVE.option, metavar="S",
                         help="end the stream after S seconds without input: release the "
                         "matches held for a trailing NOT, checkpoint, exit 0 (SIGUSR1 does "
                         "the same at once; SIGTERM/SIGINT only pause: held matches stay in "
                         "the checkpoint for the next run)")
    service.add_argument("--journal-retention", type=_byte_size, default=0, metavar="BYTES",
                         help="closed journal segments the service has checkpointed past "
                         "are deleted, but the newest BYTES of them (e.g. 500M, 2G) are kept "
                         "for replay (default 0)")
    service.add_argument("--journal-segment", type=_byte_size, default=64 << 20,
                         metavar="BYTES", help="a journal segment is closed once it holds "
                         "BYTES (default 64M); retention deletes whole closed segments")
    service.add_argument("--stats-file", metavar="FILE", help="stats as JSON, rewritten with each stats line")
    service.add_argument("--stats-every", type=POSITIVE.option, default=10.0, metavar="S",
                         help="seconds between stats lines on stderr (default 10)")
    run.add_argument("--returns", action="store_true",
                     help="add each match's RETURN values as a \"return\" object (the "
                     "streaming service too: it keeps the events its windows reach, in the "
                     "checkpoint; its msgpack payloads are then read in Python)")
    run.set_defaults(func=cmd_run)

    exp = sub.add_parser(
        "experiment", help="reproduce the DQCEP paper's experiments (dqcep vs SASE)",
        description="Run the experiments of docs/experiments.md on generated workloads: "
        "fig3 (memory vs number of basic events), fig4 (execution time vs number of basic "
        "events), sharing (1..100 queries with a common sub-pattern), latency (detection "
        "latency p50/p99 and throughput), or all. Each point runs in a fresh process; each "
        "experiment writes NAME.csv, NAME.png and NAME.md under --out.")
    exp.add_argument("name", choices=("fig3", "fig4", "sharing", "latency", "all"))
    exp.add_argument("--out", required=True, metavar="DIR", help="directory for the results")
    exp.add_argument("--quick", action="store_true",
                     help="small sizes (10^4 and 3x10^4 events; a few minutes in all)")
    exp.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    exp.add_argument("--sizes", metavar="N,N,...",
                     help="fig3/fig4 event counts instead of the default "
                     "(10^4, 10^5, 10^6, 3x10^6, 10^7; with --quick 10^4, 3x10^4)")
    exp.set_defaults(func=cmd_experiment)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError as err:
        print(str(err), file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # `dqcep run ... | head`
        sys.stderr.close()
        return 0
    except OSError as err:  # a full disk, a file that vanished: one line, not a traceback
        where = f" {err.filename}" if err.filename else ""
        print(f"dqcep: cannot read or write{where}: {err.strerror or err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
