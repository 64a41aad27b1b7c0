"""Matches as text: the spec's JSON line (section 3), and the events object of each
match in other framings (a database row, a COPY line), all from one kernel
(``dqcep._kernels.match_format``)."""
from __future__ import annotations

import hashlib
import json

import numpy as np

from dqcep._kernels.match_format import MatchLines
from dqcep.core.events import Match


def match_key(query: str, events: dict) -> str:
    """A match's key: the same query and events give the same key in every process and
    run (what a consumer of an at-least-once output drops repeats by): 128 bits of
    BLAKE2b over the query's name and its events object as canonical JSON, in hex."""
    text = json.dumps([query, events], ensure_ascii=False, sort_keys=True,
                      separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8", "backslashreplace"),
                           digest_size=16).hexdigest()


def readable_time(ms: int) -> str:
    """Milliseconds since the epoch as people read them: ISO 8601 in UTC to the ms
    (``2026-11-26T10:00:00.500Z``); a time beyond the calendar's years as its number."""
    from datetime import datetime, timezone
    try:
        t = datetime.fromtimestamp(ms / 1000, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def match_line(m: Match, with_returns: bool = False) -> str:
    """A match as the spec's one-line JSON object (section 3)."""
    return json.dumps(m.to_json_obj(with_returns), ensure_ascii=False)


LINES_BUFFER = 1 << 20  # bytes a sink formats matches into before each write


def part_lines(batch, head_of, **framing):
    """(query name, detected times, MatchLines) per part of a MatchBatch: each match's
    events object (the spec's ``"events"``: variable -> id, a Kleene list as an
    array) framed by ``MatchLines`` (``head_of(name)``, ``mid``, ``tail``, ...; see
    ``format_matches``), one line per match. A kernel writes them, without a Match
    or a dict per match: what keeps output cheap when queries match often."""
    for q, detected, ids, lists in batch.parts:
        name, variables = batch.queries[q]
        keys = [(json.dumps(v, ensure_ascii=False) + ": ").encode() for v in variables]
        list_args = ()
        if lists is not None:  # Kleene lists: their ids as JSON arrays
            list_of = np.full(len(variables), -1, np.int64)
            list_of[list(lists.columns)] = np.arange(len(lists.columns))
            list_args = (list_of, lists.offsets, lists.values)
        detected = np.ascontiguousarray(detected)
        yield name, detected, MatchLines(head_of(name), keys, detected,
                                         np.ascontiguousarray(ids), *list_args, **framing)


def formatted_parts(batch, head_of, **framing):
    """``part_lines`` with each part's lines as one bytes object."""
    for name, detected, lines in part_lines(batch, head_of, **framing):
        yield name, detected, lines.all()


def json_head(name: str) -> bytes:
    """The start of a match's JSON line, up to its detection time."""
    return f'{{"query": {json.dumps(name, ensure_ascii=False)}, "detected_at": '.encode()


def match_lines(batch) -> bytes:
    """Every match of a MatchBatch as ``match_line`` writes it, one per line, in order."""
    return b"".join(text for _, _, text in formatted_parts(batch, json_head))


def write_match_lines(batch, fd: int, buffer: np.ndarray) -> int:
    """``match_lines(batch)`` written to the file descriptor ``fd``: formatted into
    ``buffer`` (uint8, the caller's, used again and again) and written a buffer at a
    time by the kernel, without the GIL (``MatchLines.write_to``), never the whole
    batch's text at once. Returns the bytes written."""
    return sum(lines.write_to(fd, buffer) for _, _, lines in part_lines(batch, json_head))
