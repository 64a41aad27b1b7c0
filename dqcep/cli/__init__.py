"""The ``dqcep`` command line (also ``python -m dqcep``).

A module per command (``dqcep.cli.run``, ``dqcep.cli.explain``, ...), each with its
``add_parser(sub)`` and its ``command(args)``; what they share is in
``dqcep.cli.common``. The commands only read options and print: the work is the
library's (``dqcep.runtime.pipeline`` for a run, ``dqcep.service`` for the service).

Exit codes: 0 success, 2 a user error (bad query, bad event file, bad option),
1 an internal error. User errors print a positioned message, never a traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from dqcep import __version__
from dqcep.cli import (calibrate, capacity, demo, experiment, explain, generate, publish,
                       queries, run, status)
from dqcep.cli.common import EXIT_USER_ERROR, Parser
from dqcep.errors import UserError

__all__ = ["EXIT_USER_ERROR", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="dqcep", description="Complex event processing over IoT streams: "
               "pattern queries (SEQ, AND, OR, NOT, WHERE, WITHIN) over events.")
    p.add_argument("--version", action="version", version=f"dqcep {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=Parser)
    for command in (explain, calibrate, capacity, demo):
        command.add_parser(sub)
    from dqcep.spark.cli import add_spark_parser
    add_spark_parser(sub, Parser)
    for command in (generate, publish, run, status, queries, experiment):
        command.add_parser(sub)
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
