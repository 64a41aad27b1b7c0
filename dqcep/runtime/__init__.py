"""The native runtime: the general processor (router) running a plan on compiled kernels."""
from dqcep.runtime.engine import Engine, EventColumns, MatchBatch, run_events
from dqcep.runtime.eventtime import late_rule
from dqcep.runtime.returns import ReturnValues

__all__ = ["Engine", "EventColumns", "MatchBatch", "ReturnValues", "late_rule", "run_events"]
