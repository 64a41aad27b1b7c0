"""Matches into a database table (the Insert operator of a CEP system's database
operators): ``--output sqlite:///alerts.db`` or ``--output postgresql://user@host/db``.

The table (``matches`` unless the URL says ``?table=NAME``) is created if absent,
with the columns ``query TEXT, detected_at BIGINT, events TEXT`` (the spec's JSON
object of the match's events, as the JSON output's ``"events"``) and, with
``--returns``, ``returns TEXT`` (the RETURN values' JSON object). Each engine batch
is one transaction: a reader sees a batch's matches all or none.

Exactly once for the streaming service: a batch written with ``through=`` also sets
the table's row in ``dqcep_progress`` (the journal offset its matches cover, and
whether the stream's end was flushed) in the same transaction. After a crash the
service restores its checkpoint and replays the journal up to that offset without
writing (``claim`` says how far): the rows of a batch and the offset they cover are
committed together or not at all, so no row is written twice and none is lost.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
from decimal import Decimal
from itertools import repeat
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

from dqcep.core.errors import UserError
from dqcep.core.events import Match
from dqcep.io.match_text import formatted_parts

DEFAULT_TABLE = "matches"
PROGRESS_TABLE = "dqcep_progress"
PASSWORD_ENV = "DQCEP_DB_PASSWORD"
POSTGRES_NAME_BYTES = 63
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class DatabaseUnavailable(OSError):
    """The database cannot be reached or written now (a server down, a lost connection,
    a locked file): an I/O failure, which the streaming service waits out from its
    last checkpoint, as it does a full disk."""

    def __init__(self, target: str, reason):
        super().__init__(None, str(reason).strip().splitlines()[0] if str(reason).strip()
                         else type(reason).__name__, target)


class Progress(NamedTuple):
    """How far a service's matches are in a table: the journal offset they cover, and
    whether the matches held for the end of the stream were written too."""
    offset: int
    flushed: bool


def is_database(target: str | None) -> bool:
    return bool(target) and target.lower().startswith(("sqlite:", "postgresql:", "postgres:"))


def _table_param(target: str, query: str, default: str = DEFAULT_TABLE) -> str:
    params = parse_qs(query, keep_blank_values=True)
    unknown = set(params) - {"table"}
    if unknown:
        raise UserError(f"{target}: unknown parameter(s) {', '.join(sorted(unknown))}; "
                        "a database URL takes ?table=NAME")
    table = params.get("table", [default])[-1]
    if not _TABLE_NAME.match(table) or table.lower() == PROGRESS_TABLE:
        raise UserError(f"{target}: table name {table!r} must be a plain identifier "
                        f"([A-Za-z_][A-Za-z0-9_]*) other than {PROGRESS_TABLE}")
    return table


def _sqlite_target(target: str, default: str = DEFAULT_TABLE) -> tuple[Path, str]:
    """(database file, table) of ``sqlite:///relative.db`` or ``sqlite:////abs.db``,
    with an optional ``?table=NAME``."""
    url = urlsplit(target)
    if url.netloc or not url.path.startswith("/") or url.path == "/":
        raise UserError(f"{target}: a SQLite URL names a file: sqlite:///relative/path.db "
                        "or sqlite:////absolute/path.db")
    return Path(url.path[1:]), _table_param(target, url.query, default)


def postgres_target(target: str, default: str = DEFAULT_TABLE) -> tuple[dict, str]:
    """(psycopg connection parameters, table) of ``postgresql://user@host:port/db``
    with an optional ``?table=NAME``; the password comes from DQCEP_DB_PASSWORD."""
    url = urlsplit(target)
    if url.password is not None:
        raise UserError(f"{target.split('@')[-1]}: put no password in a database URL; "
                        f"set {PASSWORD_ENV} instead")
    try:
        port = url.port
    except ValueError:
        raise UserError(f"{target}: the port is not a number") from None
    database = unquote(url.path.lstrip("/"))
    if not url.hostname or not database:
        raise UserError(f"{target}: a PostgreSQL URL names a server and a database: "
                        "postgresql://user@host:port/database")
    params = {"host": url.hostname, "port": port or 5432, "dbname": database,
              "user": unquote(url.username) if url.username else None,
              "password": os.environ.get(PASSWORD_ENV) or None, "connect_timeout": 10}
    return ({k: v for k, v in params.items() if v is not None},
            _table_param(target, url.query, default))


def _connect_postgres(target: str):
    """A psycopg connection (autocommit: every transaction is an explicit
    ``transaction()`` block) to a ``postgresql://`` URL; the params and table too."""
    import psycopg
    params, table = postgres_target(target)
    try:
        return psycopg.connect(**params, autocommit=True), params, table
    except psycopg.Error as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
        if "password" in reason:
            reason += f" (the password is read from {PASSWORD_ENV})"
        raise DatabaseUnavailable(target, reason) from None


def _sqlite_columns(db, table: str) -> list[str]:
    """A SQLite table's columns in order (none: no such table). Read from the schema:
    a quoted unknown name in a SELECT would read as a string literal."""
    return [row[1] for row in db.execute(f'PRAGMA table_info("{table}")')]


_POSTGRES_COLUMNS = ("SELECT column_name FROM information_schema.columns WHERE "
                     "table_schema = current_schema() AND table_name = %s "
                     "ORDER BY ordinal_position")


class _TableSink:
    """Matches as rows of a table, one transaction per batch; the SQL every database
    shares. A subclass opens the connection and says how rows are sent."""

    columns_sql = "query TEXT NOT NULL, detected_at BIGINT NOT NULL, events TEXT NOT NULL"
    errors: tuple = ()  # the driver's exceptions

    @property
    def key(self) -> str:
        """The table's name as the database compares names: its row in the progress
        table (two spellings of one table are one service's table)."""
        return self.table

    def __init__(self, target: str, table: str, with_returns: bool):
        self.target, self.table, self.with_returns = target, table, with_returns
        self.columns = ["query", "detected_at", "events"] + (["returns"] if with_returns else [])
        self.stream: str | None = None
        existing = self._existing_columns(self.table)
        if not existing:
            self._execute(f'CREATE TABLE IF NOT EXISTS "{self.table}" ({self.columns_sql}'
                          f'{", returns TEXT" if with_returns else ""})')
        elif existing != self.columns:
            raise UserError(f"{target}: table {self.table!r} has the columns "
                            f"{', '.join(existing)}; matches need "
                            f"{', '.join(self.columns)} (another table: ?table=NAME)")

    # -- what a database says differently
    def _existing_columns(self, table: str) -> list[str]:
        raise NotImplementedError

    def _execute(self, sql: str, args: tuple = ()) -> list[tuple]:
        """One statement in a transaction of its own; the rows it returns."""
        raise NotImplementedError

    def _commit(self, rows: list[tuple], progress: tuple | None) -> None:
        """Insert the rows and, if given, upsert (table, stream, offset, flushed) into
        the progress table: one transaction."""
        raise NotImplementedError

    # -- shared
    def _upsert_progress_sql(self, mark: str) -> str:
        return (f"INSERT INTO {PROGRESS_TABLE} (output_table, stream, journal_offset, "
                f"flushed) VALUES ({', '.join([mark] * 4)}) ON CONFLICT (output_table) DO "
                "UPDATE SET stream = excluded.stream, journal_offset = "
                "excluded.journal_offset, flushed = excluded.flushed")

    def claim(self, stream: str) -> Progress | None:
        """The table's progress for the service whose checkpoint names ``stream``
        (None: nothing written yet). Refused when another stream wrote the table: its
        rows do not come from this service's journal."""
        try:
            rows = self._read_progress()
        except self.errors as err:
            raise DatabaseUnavailable(self.target, err) from None
        if rows and rows[0][0] != stream:
            raise UserError(
                f"{self.target}: table {self.table!r} holds the matches of another "
                f"service (stream {rows[0][0]} in {PROGRESS_TABLE}, this one is {stream}); "
                "give this service a table of its own (?table=NAME), or delete that "
                f"{PROGRESS_TABLE} row to let it start the table over")
        self.stream = stream
        return Progress(int(rows[0][1]), bool(rows[0][2])) if rows else None

    def _read_progress(self) -> list[tuple]:
        self._execute(f"CREATE TABLE IF NOT EXISTS {PROGRESS_TABLE} (output_table TEXT "
                      "PRIMARY KEY, stream TEXT NOT NULL, journal_offset BIGINT NOT NULL, "
                      "flushed BOOLEAN NOT NULL)")
        return self._execute(f"SELECT stream, journal_offset, flushed FROM {PROGRESS_TABLE} "
                             f"WHERE output_table = {self.mark}", (self.key,))

    def _row(self, m: Match) -> tuple:
        row = (m.query, m.detected_at, json.dumps(dict(m.events), ensure_ascii=False))
        if self.with_returns:
            row += (json.dumps(dict(m.returns), ensure_ascii=False),)
        return row

    def _insert(self, rows: list[tuple], through: Progress | None = None) -> None:
        if through is not None and self.stream is None:
            raise ValueError("claim the table before writing progress")
        progress = None if through is None else \
            (self.key, self.stream, through.offset, through.flushed)
        try:
            self._commit(rows, progress)
        except self.errors as err:
            raise DatabaseUnavailable(self.target, err) from None

    def write(self, m: Match) -> None:
        self._insert([self._row(m)])

    def write_matches(self, matches: list[Match], through: Progress | None = None) -> int:
        """Matches with their RETURN values (``--returns``), in one transaction (with
        the progress row when ``through`` is given)."""
        self._insert([self._row(m) for m in matches], through)
        return len(matches)

    def write_batch(self, batch, through: Progress | None = None) -> int:
        """Every match of a MatchBatch in one transaction (with the progress row when
        ``through`` is given); returns how many."""
        if self.with_returns:
            raise ValueError("a sink with RETURN values writes Match objects (write_matches)")
        self._insert(self._batch_rows(batch), through)
        return len(batch)

    def _batch_rows(self, batch) -> list[tuple]:
        """(query, detected_at, events) per match, the events objects written by the
        match-format kernel (the JSON output's ``"events"``, byte for byte)."""
        rows = []
        for name, detected, text in formatted_parts(batch, lambda _: b"", mid=b"{",
                                                    tail=b"}\n", with_detected=False):
            events = text.decode().split("\n")
            rows += zip(repeat(name), detected.tolist(), events[:-1])
        return rows

    def sync(self) -> None:
        return None  # every batch is committed as it is written


class SqliteMatchSink(_TableSink):
    """Matches as rows of a SQLite table (Python's sqlite3)."""

    mark = "?"
    errors = (sqlite3.Error,)

    @property
    def key(self) -> str:
        return self.table.lower()  # SQLite: `matches` and `MATCHES` are one table

    def __init__(self, target: str, with_returns: bool = False):
        path, table = _sqlite_target(target)
        if path.is_dir():
            raise UserError(f"{target}: cannot open the database: {path} is a directory")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # written by the run's output thread (BackgroundSink), one at a time
            self.db = sqlite3.connect(path, check_same_thread=False)
            super().__init__(target, table, with_returns)
        except sqlite3.OperationalError as err:
            # locked by another program, read-only, an I/O error: a failed write, which
            # the service waits out from its checkpoint (it exited 2 on the retry)
            raise DatabaseUnavailable(target, err) from None
        except (sqlite3.Error, OSError) as err:
            raise UserError(f"{target}: cannot open the database: {err}") from None
        self.insert = (f'INSERT INTO "{self.table}" VALUES '
                       f'({", ".join("?" * len(self.columns))})')

    def _existing_columns(self, table: str) -> list[str]:
        return _sqlite_columns(self.db, table)

    def _execute(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self.db:
            return self.db.execute(sql, args).fetchall()

    def _commit(self, rows: list[tuple], progress: tuple | None) -> None:
        with self.db:  # one transaction: committed, or rolled back on failure
            self.db.executemany(self.insert, rows)
            if progress is not None:
                self.db.execute(self._upsert_progress_sql("?"), progress)

    def close(self) -> None:
        self.db.close()


def _copy_text(value: str) -> bytes:
    """A value as a field of COPY's text format (backslash escapes)."""
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace(
        "\n", "\\n").replace("\r", "\\r").encode()


class PostgresMatchSink(_TableSink):
    """Matches as rows of a PostgreSQL table (psycopg 3; rows sent with COPY: a
    batch's rows as COPY text straight from the match-format kernel)."""

    mark = "%s"

    def __init__(self, target: str, with_returns: bool = False):
        import psycopg
        self.errors = (psycopg.Error,)
        self.db, _, table = _connect_postgres(target)
        # PostgreSQL keeps the first 63 bytes of a name (NAMEDATALEN - 1; the names are
        # ASCII): two names sharing them are one table, and that is the name it has
        table = table[:POSTGRES_NAME_BYTES]
        try:
            super().__init__(target, table, with_returns)
        except psycopg.Error as err:
            self.db.close()
            raise DatabaseUnavailable(target, err) from None
        self.copy = f'COPY "{self.table}" ({", ".join(self.columns)}) FROM STDIN'

    def _existing_columns(self, table: str) -> list[str]:
        return [r[0] for r in self._execute(_POSTGRES_COLUMNS, (table,))]

    def _execute(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self.db.transaction(), self.db.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else []

    def _batch_rows(self, batch) -> list[bytes]:
        """COPY text lines (query TAB detected_at TAB events). The events objects hold
        ids and variable names, which the grammar makes identifiers: nothing there
        needs a COPY escape; the query name is escaped."""
        return [text for _, _, text in formatted_parts(
            batch, lambda name: _copy_text(name) + b"\t", mid=b"\t{", tail=b"}\n")]

    def _commit(self, rows: list, progress: tuple | None) -> None:
        with self.db.transaction(), self.db.cursor() as cur:
            if rows:
                with cur.copy(self.copy) as copy:
                    for row in rows:  # tuples, or COPY text from _batch_rows
                        copy.write(row) if isinstance(row, bytes) else copy.write_row(row)
            if progress is not None:
                cur.execute(self._upsert_progress_sql("%s"), progress)

    def close(self) -> None:
        self.db.close()


def open_database_sink(target: str, with_returns: bool = False):
    if target.split(":", 1)[0].lower() == "sqlite":
        return SqliteMatchSink(target, with_returns)
    return PostgresMatchSink(target, with_returns)


# ------------------------------------------------------------------ lookups

DEFAULT_REFRESH_MS = 10_000  # a lookup table is read again this often (REFRESH n unit)
CHANGE_READS_S = 1.0  # a changed SQLite lookup file is read again at most this often


class _TableReader:
    """One declared lookup table (``TABLE name(...) KEY k FROM 'url'``) in its
    database: ``read`` gives a snapshot (one SELECT: one consistent read)."""

    def __init__(self, decl):
        self.decl = decl
        self.target = decl.url
        self.columns = [c.name for c in decl.columns]
        self.where = f"{decl.url} (TABLE {decl.name}, line {decl.pos.line})"
        scheme = decl.url.split(":", 1)[0].lower()
        if scheme == "sqlite":
            path, self.table = _sqlite_target(decl.url, decl.name)
            if not path.is_file():
                raise UserError(f"{self.where}: no database file {path}")
            self.path = path
            try:
                self._open_sqlite()
            except sqlite3.Error as err:
                raise UserError(f"{self.where}: cannot open the database: {err}") from None
            self.errors, self.sqlite = (sqlite3.Error,), True
        elif scheme in ("postgresql", "postgres"):
            import psycopg
            self.table = postgres_target(decl.url, decl.name)[1]
            self.db = _connect_postgres(decl.url)[0]
            self.errors, self.sqlite = (psycopg.Error,), False
        else:
            raise UserError(f"{self.where}: a lookup table is read from sqlite:///FILE.db "
                            "or postgresql://USER@HOST:PORT/DB")
        self.select = (f'SELECT {", ".join(chr(34) + c + chr(34) for c in self.columns)} '
                       f'FROM "{self.table}"')
        self.data_version = None
        try:
            existing = self._existing_columns()
        except self.errors as err:
            self.db.close()
            raise DatabaseUnavailable(self.target, err) from None
        missing = [c for c in self.columns if c not in existing]
        if missing:
            self.db.close()
            there = (f"it has {', '.join(existing)}" if existing else "there is no such table")
            raise UserError(f"{self.where}: table {self.table!r} has no column "
                            f"{', '.join(missing)} ({there})")

    def _open_sqlite(self) -> None:
        """(Re)open the file read-only; the file's identity is kept: a file replaced by
        a rename is another file, which the old connection never sees."""
        stat = os.stat(self.path)
        self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                  check_same_thread=False)
        self.inode = (stat.st_dev, stat.st_ino)

    def _reconnect_postgres(self) -> None:
        """A new connection after the last one broke (a server restarted): the old one
        stays closed for good ("the connection is closed")."""
        try:
            self.db.close()
        except Exception:  # noqa: BLE001 - it is broken already
            pass
        self.db = _connect_postgres(self.decl.url)[0]

    def _select_postgres(self) -> list:
        """The rows, on a new connection when the last one broke (the server restarted:
        the first query after it fails, a second on a new connection goes through)."""
        import psycopg
        for attempt in (0, 1):
            if self.db.closed or self.db.broken:
                self._reconnect_postgres()
            try:
                with self.db.cursor() as cur:
                    return cur.execute(self.select).fetchall()
            except psycopg.OperationalError:
                if attempt or not (self.db.closed or self.db.broken):
                    raise
        raise AssertionError("unreachable")

    def _existing_columns(self) -> list[str]:
        if self.sqlite:
            return _sqlite_columns(self.db, self.table)
        with self.db.cursor() as cur:
            return [r[0] for r in cur.execute(_POSTGRES_COLUMNS, (self.table,)).fetchall()]

    def read(self, version: int):
        from dqcep.core.tables import snapshot_of
        try:
            if self.sqlite:
                self.data_version = self.db.execute("PRAGMA data_version").fetchone()[0]
                rows = self.db.execute(self.select).fetchall()
            else:
                rows = self._select_postgres()
        except self.errors as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
            if "no such" in reason or "does not exist" in reason:  # table or column
                raise UserError(f"{self.where}: cannot read {', '.join(self.columns)} of "
                                f"table {self.table!r}: {reason}") from None
            raise DatabaseUnavailable(self.target, err) from None
        rows = [[float(v) if isinstance(v, Decimal) else v for v in r] for r in rows]
        return snapshot_of(self.decl, rows, version)

    def changed(self) -> bool:
        """SQLite only: has another connection committed to the file since the last
        read? (``PRAGMA data_version``: a local check, no query of the table.)"""
        if not self.sqlite:
            return False
        try:
            stat = os.stat(self.path)
            if (stat.st_dev, stat.st_ino) != self.inode:  # replaced (an atomic rename)
                self.db.close()
                self._open_sqlite()
                return True
            return self.db.execute("PRAGMA data_version").fetchone()[0] != self.data_version
        except (sqlite3.Error, OSError):
            return False  # gone or unreadable now: the next due read says why

    def close(self) -> None:
        self.db.close()


class DatabaseTables:
    """The lookup tables of a query file, read from their databases
    (``dqcep.core.tables.LookupSource``). Each is read once at the start; ``refresh``
    (called by the application once per engine batch, before the batch) reads a
    table again when its REFRESH interval (default 10 s) has passed or, for SQLite,
    when the file has changed (committed to, or replaced by a rename), at most every
    CHANGE_READS_S. A read that fails keeps the last snapshot (``stale`` says why,
    table by table) until a later read of that table succeeds; a PostgreSQL
    connection that broke is opened again."""

    def __init__(self, tables, clock=None):
        import time
        self.clock = clock or time.monotonic
        self.readers = {}
        try:
            for t in tables:
                self.readers[t.name] = _TableReader(t)
            self.snapshots = {name: r.read(0) for name, r in self.readers.items()}
        except BaseException:
            self.close()
            raise
        self.reads = len(self.snapshots)       # queries of a table, all tables
        self.read_at = {name: self.clock() for name in self.readers}
        self.failed: dict[str, str] = {}    # table -> why its last read failed

    def snapshot(self, table: str):
        return self.snapshots[table]

    @property
    def stale(self) -> str | None:
        """Why some tables hold an old snapshot (None: every last read succeeded)."""
        return "; ".join(f"table {t}: {why}" for t, why in sorted(self.failed.items())) \
            or None

    def refresh(self) -> str | None:
        """Read again the tables that are due; returns ``stale`` when it changed to a
        new failure (for the caller to say once), else None."""
        before = self.stale
        now = self.clock()
        for name, reader in self.readers.items():
            refresh = (reader.decl.refresh.ms if reader.decl.refresh
                       else DEFAULT_REFRESH_MS) / 1000
            since = now - self.read_at[name]
            # due; or a SQLite file changed, read again at most every CHANGE_READS_S
            # (REFRESH if shorter): a file committed to constantly was read whole
            # before every batch (40,000 events 12.5 s instead of 0.5 s)
            if since < refresh and not (since >= min(refresh, CHANGE_READS_S)
                                        and reader.changed()):
                continue
            self.read_at[name] = now
            try:
                self.snapshots[name] = reader.read(self.snapshots[name].version + 1)
                self.reads += 1
                self.failed.pop(name, None)
            except (DatabaseUnavailable, UserError) as err:
                self.failed[name] = str(getattr(err, "strerror", None) or err)
        return self.stale if self.stale and self.stale != before else None

    def close(self) -> None:
        for r in self.readers.values():
            r.close()
