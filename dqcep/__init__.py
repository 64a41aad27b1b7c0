"""dqcep: distributed complex event processing over IoT streams.

Pipeline: ``dqcep.lang`` parses query text into an AST, ``dqcep.plan`` turns the
queries of a file into one shared operator DAG (an orthogonal list), and the
engines run it. ``dqcep.baseline.reference`` is the readable oracle every engine is
tested against.
"""
__version__ = "0.1.0"
