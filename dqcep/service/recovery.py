"""What a service's start and recovery check before it goes on from a checkpoint:
the checkpoint's fields, a fresh start's journal, a database output's rows; and the
files it cuts back to a checkpoint's lengths (``Sink``).

A checkpoint (``dqcep.io.checkpoint``) holds the journal offset consumed, the engine
snapshot, the recent event ids, the counters and the length of every sink file; the
service writes it (``StreamingService.checkpoint``) and goes back to it on a start
or after a failed write (``StreamingService.recover``). Every problem found here is
a ``CheckpointError`` that says what is wrong and how to recover.
"""
from __future__ import annotations

from pathlib import Path

from dqcep.io.checkpoint import CheckpointError, read_checkpoint, recovery_hint
from dqcep.io.database import Progress
from dqcep.io.journal import segments
from dqcep.io.sinks import durable, json_line, naming, open_file

CHECKPOINT_VERSION = 3
SINKS = ("output", "dead_letter", "late")  # the files a checkpoint holds the length of


class Sink:
    """An append-only JSON-lines file that can be cut back to a checkpointed length."""

    def __init__(self, path: str, keep: int):
        self.path = Path(path)
        self.f = open_file(self.path, keep)

    def write(self, obj: dict) -> None:
        with naming(self.path):
            self.f.write(json_line(obj))

    def sync(self) -> int:
        with naming(self.path):
            self.f.flush()
            durable(self.f)
        return self.f.tell()

    def close(self) -> None:
        self.sync()
        self.f.close()


def state_problem(state: dict) -> str | None:
    """What is wrong with the fields of a checkpoint's state, or None."""
    def is_int(x):
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0
    if not is_int(state.get("offset")) or not is_int(state.get("journal_end")):
        return "no journal offset"
    for name in ("ended_at", "db_written"):
        if state.get(name) is not None and not is_int(state[name]):
            return f"no valid {name}"
    if not isinstance(state.get("engine"), bytes):
        return "no engine state"
    if state.get("returns") is not None and not isinstance(state["returns"], bytes):
        return "no valid RETURN events"
    recent = state.get("recent")
    if not isinstance(recent, bytes) or len(recent) % 8:
        return "no recent event ids"
    counts, sinks = state.get("counts"), state.get("sinks")
    if not isinstance(counts, dict) or not all(isinstance(k, str) and is_int(v)
                                               for k, v in counts.items()):
        return "no counters"
    if not isinstance(sinks, dict) or not all(k in sinks and (sinks[k] is None or
                                                              is_int(sinks[k])) for k in SINKS):
        return "no sink lengths"
    return None


def read_state(checkpoint: str) -> dict | None:
    """The state of the checkpoint file ``checkpoint`` (None: there is none), its
    fields checked."""
    state = read_checkpoint(checkpoint, CHECKPOINT_VERSION)
    if state is not None:
        problem = state_problem(state)
        if problem:
            raise CheckpointError(f"checkpoint {checkpoint} is damaged "
                                  f"({problem}); {recovery_hint(checkpoint)}")
    return state


def check_fresh_start(checkpoint: str, journal: str, sinks: tuple[str, ...]) -> None:
    """Without a checkpoint the journal is replayed from offset 0 and the sinks
    are written anew: refused when the journal no longer starts there."""
    names = segments(journal)
    first = int(names[0].stem) if names else 0
    written = [p for p in sinks if Path(p).is_file() and Path(p).stat().st_size]
    if first > 0 and written:
        raise CheckpointError(
            f"there is no checkpoint {checkpoint}, and the journal "
            f"{journal} no longer starts at offset 0 (its first record is "
            f"{first}): a replay cannot rebuild {', '.join(written)}; restore the "
            "checkpoint, or move those files away to start from what the journal holds")


def check_table(output: str, checkpoint: str, written: Progress | None,
                checkpointed: int | None) -> None:
    """A database output must still hold what the checkpoint says was written to
    it, as a file output its length: a table deleted, replaced or restored from an
    older copy would lose those rows silently (120 of 186 were left)."""
    if not checkpointed or (written is not None and written.offset >= checkpointed):
        return
    holds = "no matches of this service" if written is None else \
        f"matches up to journal offset {written.offset}"
    prev = f" and {checkpoint}.prev" if Path(checkpoint + ".prev").exists() else ""
    raise CheckpointError(
        f"{output} holds {holds}, but the checkpoint {checkpoint} says "
        f"matches up to offset {checkpointed} were written there: the database was "
        "deleted, replaced or restored from an older copy; put it back, or drop the "
        f"table and delete {checkpoint}{prev} to write it again from the "
        "journal (which must still start at offset 0: --journal-retention)")
