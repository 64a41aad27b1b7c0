"""The native runtime: the general processor (router) running a plan on compiled kernels.

``Program`` is a plan compiled once (shared, never changed); ``EngineState`` is what
one engine holds (serializable as whole arrays); ``Engine`` pairs the two.
``AdaptiveEngine`` is an ``Engine`` planned as ``dqcep run`` plans one: it moves its
queries between joins and a chain as it measures them."""
from dqcep.runtime.adapt import AdaptiveEngine
from dqcep.runtime.engine import STATE_BUDGET, Engine, EventColumns, MatchBatch, run_events
from dqcep.runtime.eventtime import late_rule
from dqcep.runtime.program import Program, program_for
from dqcep.runtime.returns import ReturnValues
from dqcep.runtime.state import EngineState

__all__ = ["STATE_BUDGET", "AdaptiveEngine", "Engine", "EngineState", "EventColumns", "MatchBatch", "Program", "ReturnValues",
           "late_rule", "program_for", "run_events"]
