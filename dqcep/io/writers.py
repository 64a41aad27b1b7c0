"""Matches -> JSON lines (spec section 3)."""
from __future__ import annotations

import json
from typing import IO, Iterable

from dqcep.events import Match


def match_line(m: Match, with_returns: bool = False) -> str:
    return json.dumps(m.to_json_obj(with_returns), ensure_ascii=False)


def write_matches(matches: Iterable[Match], out: IO[str], with_returns: bool = False) -> int:
    n = 0
    for m in matches:
        out.write(match_line(m, with_returns))
        out.write("\n")
        n += 1
    return n
