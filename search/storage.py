"""Where the studies live: `--storage` parsed into an Optuna storage, and a journal file checked before Optuna
reads it (Optuna's own errors for a damaged journal name no line)."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Optional

import optuna

from ..errors import DataFileError


def parse_storage(arg: Optional[str], default_dir: Path):
    """`None` -> journal file in default_dir; `journal:PATH`; `:memory:`; any Optuna RDB URL."""
    if arg == ":memory:":
        return optuna.storages.InMemoryStorage()
    if arg and arg.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend, JournalStorage
        # absolute: Optuna's lock is a symlink to this path made beside it, and a relative target dangles there, so a
        # lock left by a killed writer was never released (the stale-lock check could not stat it: a busy wait)
        path = str(Path(arg[len("journal:"):]).expanduser().resolve())
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        check_journal(Path(path))
        return JournalStorage(JournalFileBackend(path))
    if not arg:   # a journal file: multi-process safe and far cheaper per trial than SQLite
        return parse_storage(f"journal:{Path(default_dir) / 'studies.journal'}", default_dir)
    kwargs = {"connect_args": {"timeout": 120}} if arg.startswith("sqlite") else {}
    heartbeat = {} if arg.startswith("sqlite") else {"heartbeat_interval": 60, "grace_period": 300}
    import sqlalchemy.exc
    for attempt in range(SCHEMA_RACE_TRIES):
        try:
            return optuna.storages.RDBStorage(arg, engine_kwargs=kwargs, **heartbeat)
        except sqlalchemy.exc.SQLAlchemyError as err:
            # Tunes started together on a new database race to create its tables: the loser's DDL fails on what the
            # winner made, and once the winner is done the schema is there to open.
            if attempt + 1 < SCHEMA_RACE_TRIES and _lost_schema_race(err):
                time.sleep(random.uniform(0.2, 1.0))
                continue
            _cannot_open(arg, err)
        except ImportError as err:   # a missing driver
            _cannot_open(arg, err)


# How many times a tune opens a new RDB storage whose tables another tune is creating at the same moment.
SCHEMA_RACE_TRIES = 6


def _lost_schema_race(err: Exception) -> bool:
    text = str(err)
    return any(s in text for s in ("already exists", "UNIQUE constraint failed", "UniqueViolation", "duplicate key"))


def _cannot_open(arg: str, err: Exception) -> None:
    """An unknown scheme, a missing driver, no server: DataFileError saying what `--storage` accepts."""
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    raise DataFileError(f"--storage {arg}: cannot open it as an Optuna storage ({reason}); expected an RDB URL "
                        f"(sqlite:///PATH, postgresql://...), journal:PATH or :memory:") from None


def check_journal(path: Path) -> None:
    """Raise DataFileError naming the line of `path` that is not a whole Optuna journal record: a line cut short (a
    writer killed mid-record; Optuna would skip it and append the next record to it, losing that one too) or one
    that is not a JSON record. Optuna itself raises a bare JSONDecodeError or ValueError from deep inside."""
    if not path.exists():
        return
    if path.is_dir():
        raise DataFileError(f"study journal {path}: is a directory, not a journal file")
    offset = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.endswith(b"\n"):
                raise DataFileError(f"study journal {path}: line {number} is cut short (no line end: a writer was "
                                    f"killed mid-record?); truncate the file to its first {offset} bytes to resume")
            try:
                record = json.loads(line)
            except ValueError as err:
                raise DataFileError(f"study journal {path}: line {number} (from byte {offset}) is not a journal "
                                    f"record ({err}); remove that line to resume") from None
            if not isinstance(record, dict) or "op_code" not in record:
                raise DataFileError(f"study journal {path}: line {number} is JSON but not an Optuna journal record")
            offset += len(line)
