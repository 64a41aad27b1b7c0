"""The native runtime: the general processor (router) running a plan on compiled kernels."""
from dqcep.runtime.engine import Engine, EventColumns, MatchBatch, run_events
from dqcep.runtime.returns import ReturnValues

__all__ = ["Engine", "EventColumns", "MatchBatch", "ReturnValues", "run_events"]
