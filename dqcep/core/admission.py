"""Which events a run admits (spec section 7): the lateness, the skew and the timelines.

``AdmissionRule(lateness=L, skew=D, timeline=K)`` is parsed from the options once and handed
to every engine, the reference matcher, the service and the Spark jobs. An event on
timeline ``k`` is late iff ``ts < T(k) - L`` (reason ``lateness``: behind its own
timeline) or ``ts < G - D`` (reason ``skew``: behind every timeline by more than the
skew tolerance), the first test first. ``T(k)``: the largest ts admitted before on its
timeline; ``G``: the largest ts admitted before on any, and the time of every tick taken.
"""
from __future__ import annotations

from dataclasses import dataclass

from dqcep.core.errors import UserError

# A streaming service's default tick interval (--tick): an absence alert comes out
# within about this long of becoming final in a silent stream.
TICK_MS = 1000

# Why an event was late, by code (0: admitted): the option that would have admitted it.
LATE_REASONS = ("lateness", "skew")
ADMITTED, LATE_ON_TIMELINE, LATE_BY_SKEW = 0, 1, 2


@dataclass(frozen=True)
class Tick:
    """A stream's tick: no message came for a while; time ``at`` ms of the service's
    clock has passed (G = max(G, at)). Never late, never matched, never output."""

    at: int


@dataclass(frozen=True)
class AdmissionRule:
    """``lateness`` L ms; ``skew`` D ms (None: D = L); ``timeline`` K, an attribute
    (None: every event on one timeline)."""

    lateness: int = 0
    skew: int | None = None
    timeline: str | None = None

    def __post_init__(self):
        if self.lateness < 0:
            raise UserError(f"lateness must be >= 0 ms, got {self.lateness}")
        if self.skew is not None and self.skew < self.lateness:
            raise UserError(f"--skew {self.skew} is below --lateness {self.lateness}: the "
                            "skew tolerance across timelines is at least the lateness of "
                            "one (spec section 7)")
        if self.timeline is not None and self.skew is None:
            raise UserError(f"--timeline {self.timeline} needs --skew MS above --lateness "
                            f"({self.lateness} ms): with the skew equal to the lateness "
                            "every timeline's test is implied by the global one "
                            "(spec section 7)")
        if self.timeline is not None and self.skew == self.lateness:
            raise UserError(f"--timeline {self.timeline} needs --skew above --lateness "
                            f"({self.lateness} ms), got --skew {self.skew}: with the two "
                            "equal every timeline's test is implied by the global one "
                            "(spec section 7)")
        if self.timeline is not None and (not self.timeline or
                                          self.timeline in ("ts", "id", "type")):
            raise UserError(f"--timeline names an attribute of the events, not "
                            f"{self.timeline!r}")

    @property
    def tolerance(self) -> int:
        """D: how far behind G an event may be and still be admitted."""
        return self.lateness if self.skew is None else self.skew

    @classmethod
    def of(cls, value: "AdmissionRule | int | None") -> "AdmissionRule":
        """An ``AdmissionRule``, or one of lateness ``value`` ms (None: 0)."""
        if isinstance(value, AdmissionRule):
            return value
        return cls(int(value or 0))

    def describe(self) -> str:
        """The options as a user gives them."""
        out = f"--lateness {self.lateness}"
        if self.skew is not None:
            out += f" --skew {self.skew}"
        if self.timeline is not None:
            out += f" --timeline {self.timeline}"
        return out
