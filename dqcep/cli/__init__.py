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
import importlib
import sys
from typing import Sequence

from dqcep import __version__
from dqcep.cli.common import EXIT_USER_ERROR, Parser
from dqcep.core.errors import UserError

__all__ = ["EXIT_USER_ERROR", "build_parser", "main"]

# The commands in the order `dqcep --help` lists them: name -> the module whose
# add_parser(sub) adds it (spark's is the Spark application's own)
COMMANDS = {"explain": "dqcep.cli.explain", "calibrate": "dqcep.cli.calibrate",
            "capacity": "dqcep.cli.capacity", "demo": "dqcep.cli.demo",
            "spark": "dqcep.spark.cli", "generate": "dqcep.cli.generate",
            "publish": "dqcep.cli.publish", "run": "dqcep.cli.run",
            "status": "dqcep.cli.status", "queries": "dqcep.cli.queries",
            "map": "dqcep.cli.map",
            "experiment": "dqcep.cli.experiment"}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``only``: a command's name, whose module alone is
    imported (a command's start-up pays for what it needs, not for every command's
    imports: a `dqcep run` on a small file is mostly start-up)."""
    p = Parser(prog="dqcep", description="Complex event processing over IoT streams: "
               "pattern queries (SEQ, AND, OR, NOT, WHERE, WITHIN) over events.")
    p.add_argument("--version", action="version", version=f"dqcep {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=Parser)
    for name, module in COMMANDS.items():
        if only is not None and name != only:
            continue
        if name == "spark":  # the Spark application's own (an import the layout shows)
            from dqcep.spark.cli import add_spark_parser
            add_spark_parser(sub, Parser)
        else:
            importlib.import_module(module).add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the command named first gets its parser alone; anything else (--help, a
    # misspelt command) the whole one, whose messages list every command
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
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
