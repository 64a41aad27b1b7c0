"""The native runtime: the general processor (router) running a plan on compiled kernels."""
from dqcep.runtime.engine import Engine, MatchBatch, run_events

__all__ = ["Engine", "MatchBatch", "run_events"]
