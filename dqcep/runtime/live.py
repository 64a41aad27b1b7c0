"""Queries added to and removed from a running engine (the service's live queries).

``change_queries(engine, queries, epochs)`` plans the new query set on top of the
running engine and hands its state over, with no event processed again
(``dqcep.runtime.handover``: the one re-plan and hand-over, shared with the adaptive
moves), under any materialization:

- a query that stays loses nothing: it keeps its construction (joins or chain), its
  vertices' state, held matches, after-match policy state and budget stop; a vertex
  of it that the new plan builds otherwise (a shared join no longer shared, built on
  demand now) is rebuilt from the stored events;
- a vertex no query reads any more is let go (its state with it), and a removed
  query's own attribute columns leave the stored events;
- a query added here matches only events that arrive from now on (spec of the live
  queries: a match is its iff all its events arrived at or after its addition). Its
  NOT and RUN vertices are its own (the planner salts them with its epoch): no
  earlier event negates or runs there; and a match of it that holds an event the
  engine held now (in its store or its reorder buffer) is dropped
  (``EngineState.fresh_since``), until those events are gone.
"""
from __future__ import annotations

from dqcep.runtime.engine import Engine
from dqcep.runtime.handover import hand_over, replan


def change_queries(engine: Engine, queries, epochs: dict[str, int], *, schemas=(),
                   tables=(), rates=None, materialize: str = "always",
                   lookup_source=None, budget: int | None = None) -> Engine:
    """A new engine running ``queries`` (ASTs) that goes on from ``engine``.
    ``epochs``: per live-added query (those already running included) the epoch it
    was added at; a query of ``queries`` the engine does not run is added now (it
    must have an epoch). The old engine must not be used afterwards. An
    ``AdaptiveEngine`` changes in place (``AdaptiveEngine.change_queries``: planned
    with its own rates and materialization) and is returned."""
    from dqcep.runtime.adapt import AdaptiveEngine  # (adapt builds on this module's rules)

    if isinstance(engine, AdaptiveEngine):
        engine.change_queries(queries, epochs, schemas=schemas, tables=tables)
        return engine
    running = {q.name for q in engine.program.queries}
    program, _ = replan(engine, queries, rates=rates, materialize=materialize,
                     schemas=schemas, tables=tables, epochs=epochs)
    added = [q.name for q in program.queries if q.name not in running]
    missing = [n for n in added if n not in epochs]
    if missing:
        raise ValueError(f"queries added without an epoch: {missing}")
    handed = hand_over(engine, program, added)
    return Engine(program, state=handed.state, lookup_source=lookup_source,
                  budget=engine.budget if budget is None else budget,
                  stop_over_budget=engine.stop_over_budget)
