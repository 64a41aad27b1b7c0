"""The Spark tests' streams and what a job must return: a generated IoT stream with
planted matches (and imperfections), the reference's matches on its valid events, and
the lines a job wrote."""
import json
import subprocess
import sys
from pathlib import Path

from dqcep.io.database import DatabaseTables
from dqcep.io.readers import read_events
from dqcep.lang import parse
from dqcep.baseline.reference import ReferenceMatcher
from tests.support.paths import ROOT

QUERIES = ROOT / "dqcep" / "data" / "iot.cep"
IMPERFECT = ("--out-of-order", "0.1", "--slack", "400", "--late", "0.01", "--late-max", "5000",
             "--duplicates", "0.01", "--malformed", "0.005")
LATENESS = 400


def generate(path: Path, n: int, *extra, seed: int = 7) -> Path:
    subprocess.run([sys.executable, "-m", "dqcep", "generate", "--profile", "iot", "-n", str(n),
                    "--seed", str(seed), "--plant", str(QUERIES), "--plant-every", "130000",
                    "--truth", str(path) + ".truth", "--quiet", *extra, "-o", str(path)],
                   check=True)
    return path


def expected(paths, lateness=LATENESS, text=None):
    """What every job must return: the reference's matches on the valid events, first
    occurrence of each id, minus those more than ``lateness`` behind an earlier one."""
    events, errors, seen, latest, late = [], 0, set(), None, []
    for path in paths:
        bad = []
        for _, e in read_events(str(path), on_error=bad.append):
            if e.id in seen:
                continue
            seen.add(e.id)
            if latest is not None and latest - e.ts > lateness:
                late.append(e.id)
            else:
                events.append(e)
            latest = e.ts if latest is None else max(latest, e.ts)
        errors += len(bad)
    parsed = parse(text or QUERIES.read_text())
    tables = DatabaseTables(parsed.tables) if parsed.tables else None
    lines = {json.dumps(m.to_json_obj(), ensure_ascii=False) for m in ReferenceMatcher(
        parsed.queries, (), parsed.tables, tables).run(events)}
    if tables is not None:
        tables.close()
    return lines, errors, late


def job_lines(out: Path, what="matches") -> list[str]:
    return [x for f in sorted((out / what).glob("part-*")) for x in f.read_text().splitlines()]
