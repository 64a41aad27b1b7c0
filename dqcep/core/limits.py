"""The numbers a user gives — command-line options and fields of the files they
write — each checked by the rule of its kind, at the edge: before any service, worker
or JVM starts, a NaN, an infinity, a negative count or a value past what the engine
holds is one line (exit 2), never a traceback or a NaN in the output.

    parser.add_argument("--rate", type=POSITIVE.option)     # argparse: "argument --rate:
                                                             #  must be a finite number > 0"
    POSITIVE.field(value, "calibration.json: delay")        # a file's field: UserError
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from dqcep.core.errors import UserError
from dqcep.core.events import TS_LIMIT


@dataclass(frozen=True)
class Number:
    """A kind of number: an integer or a finite float, within bounds."""

    integer: bool = False
    low: float | None = None    # the smallest allowed ...
    low_open: bool = False      # ... or, when open, the value everything must exceed
    high: float | None = None   # the largest allowed
    high_open: bool = False

    def describe(self) -> str:
        what = "an integer" if self.integer else "a finite number"
        def num(x):
            return f"{int(x):,}" if self.integer else f"{x:g}"
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.low_open else '>='} {num(self.low)}")
        if self.high is not None:
            bounds.append(f"{'<' if self.high_open else '<='} {num(self.high)}")
        return what + (" " + " and ".join(bounds) if bounds else "")

    def check(self, value) -> int | float:
        """``value`` (a number, or a string to read) when it is of this kind, else
        ValueError saying what is expected."""
        if isinstance(value, bool):
            raise ValueError(f"must be {self.describe()}, got {value!r}")
        try:
            if isinstance(value, str):
                number = int(value, 10) if self.integer else float(value)
            elif self.integer:
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError
                number = int(value)
            else:
                number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"must be {self.describe()}, got {value!r}") from None
        ok = math.isfinite(number) and (
            self.low is None or (number > self.low if self.low_open else number >= self.low)
        ) and (self.high is None or (number < self.high if self.high_open
                                      else number <= self.high))
        if not ok:
            raise ValueError(f"must be {self.describe()}, got {value!r}")
        return number

    def option(self, text: str) -> int | float:
        """An argparse ``type``: the error is argparse's one line (exit 2)."""
        try:
            return self.check(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    def field(self, value, where: str) -> int | float:
        """A field of a file: UserError naming where it is."""
        try:
            return self.check(value)
        except ValueError as err:
            raise UserError(f"{where} {err}") from None


POSITIVE = Number(low=0, low_open=True)              # rates, targets, seconds between
NON_NEGATIVE = Number(low=0)                         # times, delays, second moments
ANY = Number()                                       # water-marks (deviations)
SHARE = Number(low=0, low_open=True, high=1)         # a load bound (--rho-max)
FRACTION = Number(low=0, high=1)                     # a share of events (the generator's)
COUNT = Number(integer=True, low=1, high=2**62)      # workers, partitions, batch sizes
NON_NEGATIVE_COUNT = Number(integer=True, low=0, high=2**62)
MILLISECONDS = Number(integer=True, low=0, high=TS_LIMIT)  # --lateness, a slice length
