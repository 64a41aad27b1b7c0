"""The ``dqcep`` command line (also ``python -m dqcep``).

Exit codes: 0 success, 2 a user error (bad query, bad event file, bad option),
1 an internal error. User errors print a positioned message, never a traceback.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from typing import Sequence

from dqcep import __version__
from dqcep.errors import UserError

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors also exit with 2
        self.print_usage(sys.stderr)
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}\n")


def _load_queries(path: str):
    from dqcep.lang import parse_file
    return parse_file(path)


def _read_all_events(args) -> list:
    """Every event of the input, ids checked for uniqueness; bad records per --on-bad-event."""
    from dqcep.io.readers import EventInputError, read_events

    skipped = 0

    def reject(err: EventInputError) -> None:
        nonlocal skipped
        if args.on_bad_event == "fail":
            raise err
        skipped += 1
        print(f"skipped: {err}", file=sys.stderr)

    events, first_seen = [], {}
    for where, ev in read_events(args.input, args.format, on_error=reject):
        if ev.id in first_seen:
            reject(EventInputError("<stdin>" if args.input == "-" else args.input, where,
                                   f"duplicate event id {ev.id} (first at {first_seen[ev.id]})"))
            continue
        first_seen[ev.id] = where
        events.append(ev)
    if skipped:
        print(f"dqcep run: skipped {skipped} bad event record(s)", file=sys.stderr)
    return events


def cmd_run(args) -> int:
    from dqcep.io.writers import write_matches

    queries = _load_queries(args.queries)
    if args.engine == "native":
        raise UserError("the native engine is not built yet (it comes with the native "
                        "runtime); use --engine reference")
    from dqcep.reference import ReferenceMatcher

    matcher = ReferenceMatcher(queries.queries)
    events = _read_all_events(args)
    matches = matcher.run(events)
    try:
        out_ctx = nullcontext(sys.stdout) if args.output in (None, "-") else \
            open(args.output, "w", encoding="utf-8")
    except OSError as err:
        raise UserError(f"cannot write matches to {args.output}: {err.strerror}") from None
    with out_ctx as out:
        write_matches(matches, out, with_returns=args.returns)
    return 0


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


def cmd_explain(args) -> int:
    from dqcep.plan import build_plan, explain_dot, explain_text

    queries = _load_queries(args.queries)
    plan = build_plan(queries.queries, _load_rates(args.rates))
    sys.stdout.write(explain_dot(plan) if args.dot else explain_text(plan))
    return 0


def cmd_generate(args) -> int:
    from generator.cli import run

    return run(args)


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
    explain.add_argument("--rates", metavar="FILE",
                         help="JSON object {event type: events per second} for the cost "
                         "model (default: 1 event/s for every type)")
    explain.set_defaults(func=cmd_explain)

    from generator.cli import DESCRIPTION, add_arguments

    generate = sub.add_parser("generate", help="write or publish a synthetic event stream",
                              description=DESCRIPTION)
    add_arguments(generate)
    generate.set_defaults(func=cmd_generate)

    run = sub.add_parser("run", help="run queries over an event file",
                         description="Run the queries of QUERIES over the events of "
                         "--input and print one JSON line per match (docs/cli.md).")
    run.add_argument("queries", metavar="QUERIES.cep", help="query file")
    run.add_argument("--input", "-i", required=True, metavar="EVENTS",
                     help="event file (.jsonl, .msgpack, .csv) or - for stdin")
    run.add_argument("--format", choices=("jsonl", "msgpack", "csv"),
                     help="event format (default: from the file extension; jsonl for -)")
    run.add_argument("--output", "-o", metavar="OUT", help="match file (default: stdout)")
    run.add_argument("--engine", choices=("reference", "native"), default="reference",
                     help="execution engine (default: reference)")
    run.add_argument("--on-bad-event", choices=("fail", "skip"), default="fail",
                     help="a malformed event record stops the run with exit code 2 "
                     "(fail, default) or is reported on stderr, counted and skipped")
    run.add_argument("--returns", action="store_true",
                     help="add each match's RETURN values as a \"return\" object")
    run.set_defaults(func=cmd_run)
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
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
