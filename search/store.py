"""The results store: every evaluated (problem, spec, target, GPU, protocol, build) and what came of it.

SQLite in WAL mode with a busy timeout, so any number of worker processes can write one file. One row
per key; a re-measurement replaces the row. The build is `l2c.build.build_id` of what was measured: reads see
only rows of the build the current templates and toolchain make of each spec, so a template, flag or compiler
change retires the old figures by itself (they stay in the file; `results(stale=True)` lists them). The learned policy trains on this table and the tuned
table is exported from it. Optuna's own storage holds the studies; this holds the outcomes in a form
that outlives any one study.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Union

from ..errors import DataFileError

STATUSES = ("ok", "build_failed", "verify_failed", "invalid")
SOURCES = ("tpe", "random", "policy", "llm", "pack", "enqueued", "import")   # import: `l2c import` of `l2c bench` rows


def default_store_path() -> Path:
    from platformdirs import user_data_dir
    return Path(user_data_dir("l2c")) / "results.sqlite"


@dataclass
class Result:
    problem: str               # Problem.key()
    spec: str                  # canonical .l2 text (shape-generic: the kernel that was built)
    target: str
    gpu: str
    protocol: str
    status: str
    tflops: Optional[float] = None
    baseline_tflops: Optional[float] = None
    speedup: Optional[float] = None
    reason: str = ""
    source: str = "tpe"
    params: Dict[str, object] = field(default_factory=dict)   # the search-space point, for the policy
    time: float = 0.0
    confirmed: Optional[float] = None   # when `l2c tune` measured it again as a shape's leader (confirm.confirm)
    build: Optional[str] = None         # build id of what was measured; None: the current build of the spec


def arch_of(problem_key: str) -> str:
    """The architecture a problem key names (its last field, Problem.key())."""
    return problem_key.rsplit(":", 1)[-1]


def current_build(spec: str, target: str, problem_key: str) -> str:
    """The build id the current templates and toolchain make of `spec` for `target` ("" if it has none)."""
    from ..build import build_id_of
    return build_id_of(spec, target, arch_of(problem_key))


_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    problem TEXT NOT NULL, spec TEXT NOT NULL, target TEXT NOT NULL, gpu TEXT NOT NULL,
    protocol TEXT NOT NULL, status TEXT NOT NULL, tflops REAL, baseline_tflops REAL, speedup REAL,
    reason TEXT NOT NULL DEFAULT '', source TEXT NOT NULL, params TEXT NOT NULL, time REAL NOT NULL,
    confirmed REAL, build TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (problem, spec, target, gpu, protocol, build)
);
CREATE INDEX IF NOT EXISTS results_by_problem ON results (problem, gpu, protocol, status);
"""
_COLUMNS = ("problem", "spec", "target", "gpu", "protocol", "status", "tflops", "baseline_tflops", "speedup",
            "reason", "source", "params", "time", "confirmed", "build")
# A store written before results carried their build: its rows are kept under build "unknown", which no current
# build matches (what they measured cannot be told any more).
_ADD_BUILD = """
ALTER TABLE results RENAME TO results_before_builds;
DROP INDEX IF EXISTS results_by_problem;
{schema}
INSERT INTO results ({columns}) SELECT {old}, 'unknown' FROM results_before_builds;
DROP TABLE results_before_builds;
"""


class Store:
    """A results store on one SQLite file (':memory:' for a throwaway one)."""

    def __init__(self, path: Union[str, Path, None] = None, timeout_s: float = 60.0):
        self.path = str(path) if path is not None else str(default_store_path())
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._timeout_s = timeout_s
        self._conn: Optional[sqlite3.Connection] = None
        self._pid = -1
        if self.path != ":memory:":
            check_sqlite_file(self.path)
        with self._guard(), self._db() as db:
            db.executescript(_SCHEMA)
            columns = {row[1] for row in db.execute("PRAGMA table_info(results)")}
            if "confirmed" not in columns:
                db.execute("ALTER TABLE results ADD COLUMN confirmed REAL")   # a store written before it existed
            if "build" not in columns:
                old = ", ".join(c for c in _COLUMNS if c != "build")
                db.executescript("BEGIN;" + _ADD_BUILD.format(schema=_SCHEMA, columns=", ".join(_COLUMNS), old=old)
                                 + "COMMIT;")

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """SQLite's errors (a damaged file, a lock held too long) as one DataFileError naming the store."""
        try:
            yield
        except sqlite3.OperationalError as err:
            if not re.search(r"unable to open|readonly|locked|disk I/O|permission", str(err)):
                raise DataFileError(f"results store {self.path}: {err} (SQLite); restore it from a copy, or move it "
                                    f"away and start a new store") from None
            # the file may be whole: where it lies cannot be written or locked
            raise DataFileError(f"results store {self.path}: {err} (SQLite); check that it and its folder can be "
                                f"written (SQLite keeps -wal and -shm files beside it) and that no process holds it "
                                f"locked") from None
        except sqlite3.DatabaseError as err:
            raise DataFileError(f"results store {self.path}: {err} (SQLite); restore it from a copy, or move it "
                                f"away and start a new store") from None

    def _db(self) -> sqlite3.Connection:
        # A connection must not cross a fork: reopen in a child process.
        if self._conn is None or self._pid != os.getpid():
            conn = sqlite3.connect(self.path, timeout=self._timeout_s, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1000)}")
            if self.path != ":memory:":
                self._use_wal(conn)
                conn.execute("PRAGMA synchronous = NORMAL")
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to write-ahead logging (persistent: once per store). SQLite refuses the switch at once,
        without its busy handler, while another process holds the new file (two tuners starting on one store), so
        it is retried until the timeout; the mode another process set is found on the next try."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    def __getstate__(self):  # picklable for worker processes: reconnect on the other side
        return {"path": self.path, "_timeout_s": self._timeout_s, "_conn": None, "_pid": -1}

    def record(self, r: Result) -> None:
        self.record_many([r])

    def record_many(self, results) -> None:
        """Record results in one transaction (a later result for the same key replaces the earlier one)."""
        rows = []
        for r in results:
            if r.status not in STATUSES:
                raise ValueError(f"unknown status {r.status!r}")
            build = r.build if r.build is not None else current_build(r.spec, r.target, r.problem)
            rows.append((r.problem, r.spec, r.target, r.gpu, r.protocol, r.status, r.tflops, r.baseline_tflops,
                         r.speedup, r.reason, r.source, json.dumps(r.params, sort_keys=True), r.time or time.time(),
                         r.confirmed, build))
        db = self._db()
        with self._guard(), db:  # one transaction, retried by SQLite's busy handler under contention
            db.executemany(f"INSERT OR REPLACE INTO results ({', '.join(_COLUMNS)}) VALUES "
                           f"({', '.join('?' * len(_COLUMNS))})", rows)

    @staticmethod
    def _result(row) -> Result:
        d = dict(zip(_COLUMNS, row))
        d["params"] = json.loads(d["params"])
        return Result(**d)

    def get(self, problem: str, spec: str, target: str, gpu: str, protocol: str) -> Optional[Result]:
        """The result of the spec's current build, if any."""
        with self._guard():
            row = self._db().execute(
                f"SELECT {', '.join(_COLUMNS)} FROM results WHERE problem=? AND spec=? AND target=? AND gpu=? "
                "AND protocol=? AND build=?",
                (problem, spec, target, gpu, protocol, current_build(spec, target, problem))).fetchone()
        return self._result(row) if row else None

    @staticmethod
    def _current(r: Result) -> bool:
        return r.build == current_build(r.spec, r.target, r.problem)

    def results(self, problem: Optional[str] = None, gpu: Optional[str] = None,
                protocol: Optional[str] = None, status: Optional[str] = None, stale: bool = False) -> Iterator[Result]:
        """Results in the order they were recorded: of current builds only, unless `stale`."""
        where, args = [], []
        for col, value in (("problem", problem), ("gpu", gpu), ("protocol", protocol), ("status", status)):
            if value is not None:
                where.append(f"{col}=?")
                args.append(value)
        sql = f"SELECT {', '.join(_COLUMNS)} FROM results"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._guard():
            rows = self._db().execute(sql + " ORDER BY time", args).fetchall()
        for row in rows:
            r = self._result(row)
            if stale or self._current(r):
                yield r

    def best(self, problem: str, gpu: str, protocol: str, confirmed_since: Optional[float] = None) -> Optional[Result]:
        """The fastest verified result for a problem; failures can never win. With `confirmed_since`, only
        results confirmed (measured again as the leader) at or after that time count."""
        fastest = self.top(problem, gpu, protocol, 1, confirmed_since)
        return fastest[0] if fastest else None

    def top(self, problem: str, gpu: str, protocol: str, n: int,
            confirmed_since: Optional[float] = None) -> List[Result]:
        """The `n` fastest verified results for a problem, fastest first (`confirmed_since`: as for `best`)."""
        sql = (f"SELECT {', '.join(_COLUMNS)} FROM results WHERE problem=? AND gpu=? AND protocol=? AND status='ok'"
               + (" AND confirmed >= ?" if confirmed_since is not None else "") + " ORDER BY speedup DESC")
        args = (problem, gpu, protocol) + ((confirmed_since,) if confirmed_since is not None else ())
        with self._guard():
            rows = self._db().execute(sql, args).fetchall()
        current = [r for r in map(self._result, rows) if self._current(r)]
        return current[:n]

    def problems(self, gpu: Optional[str] = None, protocol: Optional[str] = None) -> List[str]:
        sql, args = "SELECT DISTINCT problem FROM results", []
        if gpu is not None or protocol is not None:
            sql += " WHERE " + " AND ".join(f"{c}=?" for c, v in (("gpu", gpu), ("protocol", protocol)) if v)
            args = [v for v in (gpu, protocol) if v]
        with self._guard():
            return [r[0] for r in self._db().execute(sql, args).fetchall()]

    def count(self) -> int:
        with self._guard():
            return self._db().execute("SELECT COUNT(*) FROM results").fetchone()[0]


def check_sqlite_file(path: Union[str, Path]) -> None:
    """Raise DataFileError when `path` cannot be an SQLite store: a directory, a file that does not start with
    SQLite's header, or one shorter than its header says (truncated). A missing or empty file is a new store."""
    path = Path(path)
    if path.is_dir():
        raise DataFileError(f"results store {path}: is a directory, not an SQLite file")
    try:
        with open(path, "rb") as f:
            head = f.read(100)
        size = path.stat().st_size
    except FileNotFoundError:
        return
    except OSError as err:
        raise DataFileError(f"results store {path}: cannot be read: {err.strerror or err}") from None
    if size == 0 or not head:   # empty when read: a new store (another process may be creating it meanwhile)
        return
    if len(head) < 100 or not head.startswith(b"SQLite format 3\x00"):
        raise DataFileError(f"results store {path}: not an SQLite database ({size} bytes starting {head[:16]!r}); "
                            "move it away to start a new store")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    if head[92:96] == head[24:28] and size < pages * page_size:   # the header's page count is current
        raise DataFileError(f"results store {path}: truncated: {size} bytes where its header says "
                            f"{pages * page_size}; restore it from a copy, or move it away and start a new store")
