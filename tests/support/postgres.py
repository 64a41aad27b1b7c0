"""A PostgreSQL server of our own for tests and benchmarks: initdb in a temporary
directory, started with pg_ctl on a free loopback port, stopped and removed after.
Never one left running, never skipped: without PostgreSQL's server programs (Debian's
postgresql, installed by scripts/system-deps.sh) it fails and says so."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from tests.support.broker import free_port

USER = "dqcep"  # the server's superuser (trust authentication on loopback only)
PASSWORD_USER = "alice"  # a role that must give its password (scram-sha-256)


def server_program(name: str) -> str:
    """initdb / pg_ctl: Debian keeps them in /usr/lib/postgresql/VERSION/bin."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or \
        [p for p in [shutil.which(name)] if p]
    assert found, (f"PostgreSQL's {name} is not installed (sh scripts/system-deps.sh, "
                   "or apt-get install -y postgresql)")
    return found[-1]


class PostgresServer:
    """``with PostgresServer() as pg: pg.url(db)``. As root the server runs as the
    ``postgres`` user (PostgreSQL refuses to run as root)."""

    def __init__(self):
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="dqcep-pg-"))
        self.data = self.dir / "data"
        self.as_user = [] if os.geteuid() else ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        r = subprocess.run([*self.as_user, *args], capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(args)} failed: {r.stdout}{r.stderr}"

    def __enter__(self) -> "PostgresServer":
        if self.as_user:
            shutil.chown(self.dir, "postgres")
        self._run(server_program("initdb"), "-D", str(self.data), "-U", USER, "-A", "trust",
                  "-E", "UTF8", "--no-sync")
        hba = self.data / "pg_hba.conf"  # the first matching line wins
        hba.write_text(f"host all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256\n"
                       + hba.read_text())
        self.start()
        return self

    def start(self) -> None:
        self._run(server_program("pg_ctl"), "-D", str(self.data), "-w", "-t", "60",
                  "-l", str(self.dir / "server.log"), "-o",
                  f"-p {self.port} -c listen_addresses=127.0.0.1 "
                  f"-c unix_socket_directories={self.dir}", "start")

    def stop(self, mode: str = "immediate") -> None:
        subprocess.run([*self.as_user, server_program("pg_ctl"), "-D", str(self.data), "-m",
                        mode, "-w", "stop"], capture_output=True)

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def password_user(self, password: str) -> str:
        """The URL of a database as PASSWORD_USER, whose password is ``password``."""
        import psycopg
        url = self.new_database()
        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER,
                             dbname=url.rsplit("/", 1)[1], autocommit=True) as conn:
            # a role is the server's, not the database's: made once, its password set
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                                (PASSWORD_USER,)).fetchone():
                conn.execute(f"CREATE ROLE {PASSWORD_USER} LOGIN")
            conn.execute(f"ALTER ROLE {PASSWORD_USER} PASSWORD '{password}'")
            conn.execute(f"GRANT ALL ON SCHEMA public TO {PASSWORD_USER}")
        return url.replace(f"{USER}@", f"{PASSWORD_USER}@")

    def new_database(self) -> str:
        """A database of its own (one per test): its URL."""
        import psycopg
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)
