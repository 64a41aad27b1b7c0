"""The state budget in the native engine: a query whose state would grow past it stops.

Every buffer of a query's state (queues, NOT stores, growing lists, the scratch
rings) holds at most ``Engine.budget`` partial matches. When one would hold more
(``StateBudgetExceeded`` from a kernel), every query reading that vertex is
stopped (``BudgetStage._stop``): its matches end, its vertices' state is let go,
the other queries go on; ``take_stopped`` tells the host, once, with the line
``budget_line`` writes. ``BudgetStage`` is a part of
``dqcep.runtime.engine.Engine``, apart for reading.
"""
from __future__ import annotations

from dqcep._kernels.ring import KeyedQueue, RingBuffer, StateBudgetExceeded
from dqcep.core.errors import UserError
from dqcep.runtime.state import Records, run_state


def budget_line(queries: list[str], where: str, budget: int) -> str:
    """The one line that says a query was stopped by its budget, and what bounds it."""
    which = f"query {queries[0]}" if len(queries) == 1 else \
        f"queries {', '.join(queries)} (sharing it)"
    return (f"{which} stopped: {where} would hold over {budget:,} partial matches, the "
            "budget of a query's buffer (--max-partial-matches); the other queries go on. "
            "A selection strategy (USING skip-till-next-match, strict-contiguity or "
            "partition-contiguity) or a shorter window bounds it")


class BudgetStage:
    """The budget of ``Engine`` (see the module docstring)."""

    def _budget_state(self) -> None:
        """Every buffer of the state (and the scratch rings) limited to the budget; the
        vertices of stopped queries known (after a restore too)."""
        state = self.state
        for queues in (state.left_q, state.right_q, state.growing):
            for q in queues.values():
                q.records.limit = self.budget
        for ring in (*state.not_store.values(), *self._out_rings.values()):
            ring.limit = self.budget
        readers = self.program.readers
        self._dead = {v for v, qs in readers.items()
                      if qs and all(q in state.stopped for q in qs)}

    def _stop(self, v: int, err: StateBudgetExceeded) -> None:
        """Vertex v's buffer would exceed the budget: every query reading v stops (its
        matches end here, its vertices' state is let go); the others go on."""
        prog, state = self.program, self.state
        names = [prog.queries[qi].name for qi in prog.readers[v]]
        why = budget_line(names, f"{self.plan.label(v)} (vertex {v})", self.budget)
        if not self.stop_over_budget:
            raise UserError(why) from None
        for qi in prog.readers[v]:
            if qi in state.stopped:
                continue
            state.stopped[qi] = why
            state.pending[qi] = Records.empty(prog.queries[qi].n_slots)
            self._stopped_news.append((prog.queries[qi].name, why))
        self._budget_state()
        for u in self._dead:  # their state goes: fresh, empty buffers
            for queues in (state.left_q, state.right_q, state.growing):
                if u in queues:
                    queues[u] = KeyedQueue(queues[u].n_ids)
            if u in state.not_store:
                state.not_store[u] = RingBuffer(state.not_store[u].n_ids)
            if u in state.runs:
                state.runs[u] = run_state(self.plan.run[u])
            self._new_inputs.pop(u, None)
        self._budget_state()

    def _stop_for_pipeline(self, v: int, err: StateBudgetExceeded) -> set[int]:
        """``_stop``, and the vertices stopped now (``JoinPipeline.run`` passes over them)."""
        self._stop(v, err)
        return self._dead

    def take_stopped(self) -> list[tuple[str, str]]:
        """The queries stopped by their budget since the last call: (name, why)."""
        out, self._stopped_news = self._stopped_news, []
        return out

    @property
    def stopped(self) -> dict[str, str]:
        """Every query stopped by its budget (kept in snapshots): name -> why."""
        return {self.program.queries[q].name: why for q, why in self.state.stopped.items()}
