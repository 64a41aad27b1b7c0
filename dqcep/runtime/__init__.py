"""The native runtime: the general processor (router) running a plan on compiled kernels."""
from dqcep.runtime.engine import Engine, EventColumns, MatchBatch, run_events

__all__ = ["Engine", "EventColumns", "MatchBatch", "run_events"]
