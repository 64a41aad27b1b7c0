"""Repeated event ids: one rule for every path that reads events.

Event ids are unique (spec §1), so an event whose id was already read is a
second copy of that event: an MQTT message redelivered after its
acknowledgement was lost, a file concatenated twice, the generator's
``--duplicates``. Every path drops it and counts it as a duplicate; the first
copy wins; it is never a bad event (``--on-bad-event`` does not apply).

The streaming paths (``dqcep run`` on a file, the service, ``dqcep spark
stream``) remember the last ``RECENT_IDS`` distinct ids, in bounded memory; a
copy that comes later than that is processed again. ``dqcep spark run`` sees
the whole input at once and drops every repeat (docs/runtime.md).
"""
from __future__ import annotations

from dqcep.core.events import RECENT_IDS

__all__ = ["RECENT_IDS", "recent_ids", "recent_to_bytes", "admit_bytes"]


def recent_ids():
    """An empty memory of the last ``RECENT_IDS`` ids (the ``RecentIds`` kernel):
    ``admit(ids)`` is True for a first copy, False for a repeat."""
    from dqcep._kernels.recent_ids import RecentIds
    return RecentIds(RECENT_IDS)


def recent_to_bytes(recent) -> bytes:
    """The ids a ``RecentIds`` remembers, oldest first, as little-endian int64s: how a
    checkpoint or a worker's admission record stores them (``admit_bytes`` reads them)."""
    return recent.ids().astype("<i8").tobytes()


def admit_bytes(recent, data: bytes) -> None:
    """Remember again the ids ``recent_to_bytes`` wrote, in their order."""
    import numpy as np
    recent.admit(np.frombuffer(data, dtype="<i8").astype(np.int64))
