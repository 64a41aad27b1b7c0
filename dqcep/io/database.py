"""Matches into a database table (the Insert operator of a CEP system's database
operators): ``--output sqlite:///alerts.db``.

The table (``matches`` unless the URL says ``?table=NAME``) is created if absent,
with the columns ``query TEXT, detected_at BIGINT, events TEXT`` (the spec's JSON
object of the match's events, as the JSON output's ``"events"``) and, with
``--returns``, ``returns TEXT`` (the RETURN values' JSON object). Each engine batch
is one transaction: a reader sees a batch's matches all or none.
"""
from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from dqcep.errors import UserError
from dqcep.events import Match

DEFAULT_TABLE = "matches"
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def is_database(target: str | None) -> bool:
    return bool(target) and target.lower().startswith(("sqlite:", "postgresql:", "postgres:"))


def _sqlite_target(target: str) -> tuple[Path, str]:
    """(database file, table) of ``sqlite:///relative.db`` or ``sqlite:////abs.db``,
    with an optional ``?table=NAME``."""
    url = urlsplit(target)
    if url.netloc or not url.path.startswith("/") or url.path == "/":
        raise UserError(f"{target}: a SQLite URL names a file: sqlite:///relative/path.db "
                        "or sqlite:////absolute/path.db")
    params = parse_qs(url.query, keep_blank_values=True)
    unknown = set(params) - {"table"}
    if unknown:
        raise UserError(f"{target}: unknown parameter(s) {', '.join(sorted(unknown))}; "
                        "a SQLite output takes ?table=NAME")
    table = params.get("table", [DEFAULT_TABLE])[-1]
    if not _TABLE_NAME.match(table):
        raise UserError(f"{target}: table name {table!r} must be a plain identifier "
                        "([A-Za-z_][A-Za-z0-9_]*)")
    return Path(url.path[1:]), table


class SqliteMatchSink:
    """Matches as rows of a SQLite table, one transaction per batch."""

    def __init__(self, target: str, with_returns: bool = False):
        path, self.table = _sqlite_target(target)
        self.target, self.with_returns = target, with_returns
        columns = ["query", "detected_at", "events"] + (["returns"] if with_returns else [])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # written by the run's output thread (BackgroundSink), one at a time
            self.db = sqlite3.connect(path, check_same_thread=False)
            existing = [row[1] for row in self.db.execute(
                f'PRAGMA table_info("{self.table}")')]
            if not existing:
                with self.db:
                    self.db.execute(
                        f'CREATE TABLE "{self.table}" (query TEXT NOT NULL, detected_at '
                        f'BIGINT NOT NULL, events TEXT NOT NULL'
                        f'{", returns TEXT" if with_returns else ""})')
            elif existing != columns:
                raise UserError(f"{target}: table {self.table!r} has the columns "
                                f"{', '.join(existing)}; matches need "
                                f"{', '.join(columns)} (another table: ?table=NAME)")
        except (sqlite3.Error, OSError) as err:
            raise UserError(f"{target}: cannot open the database: {err}") from None
        self.insert = (f'INSERT INTO "{self.table}" VALUES '
                       f'({", ".join("?" * len(columns))})')

    def _row(self, m: Match) -> tuple:
        row = (m.query, m.detected_at, json.dumps(dict(m.events), ensure_ascii=False))
        if self.with_returns:
            row += (json.dumps(dict(m.returns), ensure_ascii=False),)
        return row

    def _insert(self, rows: list[tuple]) -> None:
        try:
            with self.db:  # one transaction: committed, or rolled back on failure
                self.db.executemany(self.insert, rows)
        except sqlite3.Error as err:
            raise UserError(f"{self.target}: cannot write matches: {err}") from None

    def write(self, m: Match) -> None:
        self._insert([self._row(m)])

    def write_matches(self, matches: list[Match]) -> int:
        """Matches with their RETURN values (``--returns``), in one transaction."""
        self._insert([self._row(m) for m in matches])
        return len(matches)

    def write_batch(self, batch) -> int:
        """Every match of a MatchBatch, in one transaction; returns how many."""
        if self.with_returns:
            raise ValueError("a sink with RETURN values writes Match objects (write_matches)")
        matches = batch.to_matches()
        self._insert([self._row(m) for m in matches])
        return len(matches)

    def sync(self) -> None:
        return None  # every batch is committed as it is written

    def close(self) -> None:
        self.db.close()


def open_database_sink(target: str, with_returns: bool = False):
    scheme = target.split(":", 1)[0].lower()
    if scheme == "sqlite":
        return SqliteMatchSink(target, with_returns)
    raise UserError(f"{target}: {scheme} outputs are not supported yet; matches go to a "
                    "file, stdout, mqtt://... or sqlite:///FILE.db")
