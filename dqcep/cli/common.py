"""What every command of the CLI shares: the parser class, the exit code of a user
error, option types and the loaders of the files options name."""
from __future__ import annotations

import argparse
import sys

from dqcep.core.errors import UserError
from dqcep.core.limits import POSITIVE


EXIT_USER_ERROR = 2
MAX_WORKERS = 1024  # --workers of dqcep run and dqcep capacity, at most


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors also exit with 2
        self.print_usage(sys.stderr)
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}\n")


def byte_size(text: str) -> int:
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


def admission_rule_of(args):
    """The run's ``AdmissionRule`` (spec section 7) from --lateness, --skew, --timeline."""
    from dqcep.core.admission import AdmissionRule
    return AdmissionRule(args.lateness, args.skew, args.timeline)


def load_queries(path: str):
    from dqcep.lang import parse_file
    return parse_file(path)


def load_rates(path: str | None) -> dict[str, float]:
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


# The plans when --materialize and --adapt are not given: dqcep run (on an event file
# and as the streaming service) chooses by the cost model (with rates measured on an
# event file's input, or --rates) and moves queries between joins and a chain as it
# measures them; explain shows the plan that keeps every join's records.
RUN_MATERIALIZE, MATERIALIZE = "auto", "always"
RUN_ADAPT = "on"


def materialize_of(args, running: bool = False) -> str:
    """``--materialize`` as given, else the default (``RUN_MATERIALIZE`` for dqcep run,
    ``MATERIALIZE`` otherwise)."""
    return args.materialize or (RUN_MATERIALIZE if running else MATERIALIZE)


def adapt_of(args) -> bool:
    """``--adapt`` as given (on/off), else ``RUN_ADAPT``."""
    return (args.adapt or RUN_ADAPT) == "on"


def planner_options(parser, only: str = "", default: str = f"default {MATERIALIZE}") -> None:
    from dqcep.plan.joins import MATERIALIZE_MODES

    parser.add_argument("--materialize", choices=MATERIALIZE_MODES, default=None,
                        help=only + "SEQ joins keep their partial matches as records "
                        "(always), build them on demand from their inputs when their parent "
                        "needs them (on-demand, where the plan allows it), every flat "
                        "skip-till-any-match SEQ runs as one chain built when its last event "
                        "comes (chain), or the cost model chooses per query (auto); "
                        f"{default}; same matches either way (docs/planner.md)")
    parser.add_argument("--rates", metavar="FILE",
                        help=only + "JSON object {event type: events per second} for the "
                        "cost model (default: 1 event/s for every type; with --materialize "
                        "auto, dqcep run measures them on the input's first 10000 events)")


def warn_plan(query_file, rates: dict[str, float]) -> None:
    """What the queries as written may cost (``dqcep.plan.warnings``) and the negated
    events their ``[attr]`` does not reach (``dqcep.lang.check.untied_negations``), on
    stderr."""
    from dqcep.lang.check import untied_negations
    from dqcep.plan.warnings import kleene_warnings
    found = kleene_warnings(query_file.queries, rates)
    schemas = {s.type: s for s in query_file.schemas}
    found += [w for q in query_file.queries for w in untied_negations(q, schemas)]
    for message, pos in sorted(found, key=lambda w: (w[1].line, w[1].col)):
        print(f"{query_file.source}:{pos.line}:{pos.col}: {message}", file=sys.stderr)


def check_water_marks(args) -> None:
    if args.lw > args.hw:
        raise UserError(f"--lw {args.lw:g} must not exceed --hw {args.hw:g} (the low "
                        "water-mark is below the high one)")


def named_values(items: list[str], what: str, names: list[str]) -> dict[str, float]:
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
