"""Checkpoint files: a state written atomically, checked when read, the previous one kept.

A checkpoint file is ``MAGIC (8 bytes) | u32 format version | u32 crc32 of the
body | body`` (little-endian), the body a msgpack map. ``write_checkpoint``
writes a temporary file, fsyncs it, moves the current checkpoint to
``PATH.prev`` and the new one into place, and fsyncs the directory: a crash
leaves the new checkpoint, or the old one (as ``PATH`` or, between the two
renames, only as ``PATH.prev``), never a mixture. ``read_checkpoint`` refuses
a damaged file (wrong magic, version or checksum, or a body that is no map)
with one line that says how to recover; it never returns half a state.
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import msgpack

from dqcep.core.errors import UserError

MAGIC = b"DQCEPCK\x00"
HEADER = struct.Struct("<8sII")


class CheckpointError(UserError):
    """A checkpoint that cannot be used; the message says how to recover."""


def previous(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".prev")


def write_checkpoint(path: str | Path, version: int, state: dict) -> None:
    path = Path(path)
    body = msgpack.packb(state, use_bin_type=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(HEADER.pack(MAGIC, version, zlib.crc32(body)))
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        os.replace(path, previous(path))
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def recovery_hint(path: str | Path) -> str:
    prev = previous(path)
    if not prev.exists():
        return f"to rebuild everything from the journal, delete {path}"
    # without FILE the service resumes from FILE.prev (read_checkpoint): a rebuild
    # deletes both (the hint said FILE alone, which resumed from FILE.prev)
    return (f"to resume from the previous checkpoint, move {prev} to {path}; to rebuild "
            f"everything from the journal, delete {path} and {prev}")


def read_checkpoint(path: str | Path, version: int) -> dict | None:
    """The state of a checkpoint file (``PATH.prev`` when only it exists), or None."""
    path = Path(path)
    if not path.exists():
        if not previous(path).exists():
            return None
        path = previous(path)  # a crash between the two renames of write_checkpoint
    data = path.read_bytes()

    def damaged(why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path} is damaged ({why}); {recovery_hint(path)}")

    if len(data) < HEADER.size:
        raise damaged(f"{len(data)} bytes, shorter than its header")
    magic, found, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise damaged("not a dqcep checkpoint")
    if found != version:
        raise CheckpointError(f"checkpoint {path} has format version {found}; this dqcep "
                              f"reads version {version}; {recovery_hint(path)}")
    body = data[HEADER.size:]
    if zlib.crc32(body) != crc:
        raise damaged("checksum mismatch")
    try:
        state = msgpack.unpackb(body, raw=False)
    except Exception as err:  # the checksum matched, so this was written so: still refuse
        raise damaged(f"unreadable body: {err}") from None
    if not isinstance(state, dict):
        raise damaged("the body is not a map")
    return state
