"""A real, throwaway PostgreSQL server on 127.0.0.1 for the storage tests: initdb into a temporary directory,
start it on a free port, hand out a database URL, stop and delete it afterwards.

PostgreSQL refuses to run as root, so as root the server runs as the `postgres` system user (Debian's
package creates it). `.ci/run` installs the server package when its binaries are missing.
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, List, Optional


def _bin(name: str) -> Optional[str]:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def available() -> Optional[str]:
    """Why no server can be started here, or None when one can."""
    if not (_bin("initdb") and _bin("pg_ctl")):
        return "PostgreSQL server binaries (initdb, pg_ctl) not found"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install -e '.[postgres]')"
    if os.geteuid() == 0 and not shutil.which("runuser"):
        return "running as root without runuser to drop to the postgres user"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="l2c_pg_"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.as_root = os.geteuid() == 0
        self.databases = 0
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
            os.chmod(self.root, 0o700)

    def _run(self, argv: List[str], **kw) -> subprocess.CompletedProcess:
        if self.as_root:
            argv = ["runuser", "-u", "postgres", "--"] + argv
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)

    def start(self) -> "Server":
        out = self._run([_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        if out.returncode:
            raise RuntimeError(f"initdb failed: {out.stderr[-2000:]}")
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
                   "-c fsync=off -c max_connections=100")
        out = self._run([_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.root / "log"),
                         "-w", "-t", "60", "start"])
        if out.returncode:
            log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {out.stderr[-1000:]} {log[-2000:]}")
        return self

    def new_database(self) -> str:
        """A fresh, empty database on this server; returns its SQLAlchemy URL."""
        import psycopg2
        self.databases += 1
        name = f"l2c_{self.databases}"
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        conn.close()
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.data.exists():
            self._run([_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(self.root, ignore_errors=True)


def server() -> Iterator[Server]:
    """Generator for a pytest fixture: yields a started server, stopped and deleted afterwards."""
    s = Server()
    try:
        yield s.start()
    finally:
        s.stop()
