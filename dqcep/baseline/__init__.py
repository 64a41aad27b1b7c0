"""Baseline engines dqcep is compared against (``dqcep run --engine sase``)."""
from dqcep.baseline.sase import SaseEngine, compile_sase

__all__ = ["SaseEngine", "compile_sase"]
