"""Damaged tuner files give one line naming the file and what is wrong, never a traceback: real SQLite files, real
Optuna journals, real `l2c tune --runner interpreter` processes (tiny Triton kernels under the CPU interpreter)."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from l2c.errors import DataFileError
from l2c.search.store import Result, Store

ROOT = Path(__file__).resolve().parents[1]


def tune(tmp_path, store="r.sqlite", journal="j.log", trials=2):
    return subprocess.run(
        [sys.executable, "-m", "l2c", "tune", "--runner", "interpreter", "--shapes", "32x32x32", "--target", "triton",
         "--trials", str(trials), "--store", str(tmp_path / store), "--storage", f"journal:{tmp_path / journal}",
         "--policy", "off", "--seed", "0", "--no-llm", "--confirm", "0", "--export", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)


def assert_one_line(result, *fragments):
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("l2c tune: error: "), result.stderr
    for fragment in fragments:
        assert fragment in last, last


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tune: its store and journal, copied by each test that damages them."""
    folder = tmp_path_factory.mktemp("finished")
    result = tune(folder)
    assert result.returncode == 0, result.stderr
    assert (folder / "out" / "sm_90.json").exists()
    return folder


def _copy(finished, tmp_path):
    for name in ("r.sqlite", "j.log"):
        (tmp_path / name).write_bytes((finished / name).read_bytes())


def _store_file(tmp_path, rows=200) -> bytes:
    """The bytes of a real store of `rows` results, checkpointed into the main file."""
    path = tmp_path / "full.sqlite"
    store = Store(path)
    store.record_many([Result(problem=f"p{i}", spec="kernel k { }\n" * 50, target="triton", gpu="g", protocol="kernel",
                              status="ok", speedup=1.0) for i in range(rows)])
    store.close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return path.read_bytes()


@pytest.mark.parametrize("damage, fragment", [
    (lambda data: data[: len(data) // 2], "truncated"),
    (lambda data: b"\x00garbage\xff" * 300, "not an SQLite database"),
    (lambda data: data[:60], "not an SQLite database"),
])
def test_damaged_store_files_are_one_error_naming_the_file(tmp_path, damage, fragment):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(damage(_store_file(tmp_path)))
    with pytest.raises(DataFileError, match=fragment) as info:
        Store(bad)
    assert str(bad) in str(info.value)


def test_a_store_damaged_past_its_header_is_named_at_the_first_query(tmp_path):
    """Pages overwritten inside a file of the right length: SQLite finds it, and the error names the store."""
    data = bytearray(_store_file(tmp_path))
    page = int.from_bytes(data[16:18], "big")
    data[page:page * 3] = b"\xa5" * (2 * page)   # the table's pages, not the header
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(bytes(data))
    with pytest.raises(DataFileError) as info:
        store = Store(bad)
        list(store.results())
    assert str(bad) in str(info.value) and "SQLite" in str(info.value)


def test_tune_with_a_garbage_store_is_one_line(tmp_path):
    (tmp_path / "r.sqlite").write_bytes(b"not a database at all\n" * 10)
    assert_one_line(tune(tmp_path), "r.sqlite", "not an SQLite database")


def test_tune_with_a_store_path_that_is_a_directory_is_one_line(tmp_path):
    (tmp_path / "r.sqlite").mkdir()
    assert_one_line(tune(tmp_path), "r.sqlite", "is a directory")


@pytest.mark.parametrize("damage, fragments", [
    (lambda data: data[:-5], ("cut short", "truncate the file to its first")),
    (lambda data: data + b"\x00\x00garbage", ("cut short",)),
    (lambda data: data + b"{not json\n", ("is not a journal record", "remove that line")),
    (lambda data: b"[1, 2]\n" + data, ("line 1 is JSON but not an Optuna journal record",)),
])
def test_tune_with_a_damaged_journal_is_one_line_naming_it(finished, tmp_path, damage, fragments):
    _copy(finished, tmp_path)
    journal = tmp_path / "j.log"
    journal.write_bytes(damage(journal.read_bytes()))
    assert_one_line(tune(tmp_path), "j.log", *fragments)


def test_the_line_a_torn_journal_names_is_the_one_to_cut(finished, tmp_path):
    """Cut where the message says, and the tune resumes: the finished study is kept."""
    _copy(finished, tmp_path)
    journal = tmp_path / "j.log"
    whole = journal.read_bytes()
    journal.write_bytes(whole + b'{"op_code": 5, "worker')   # a record torn by a kill
    result = tune(tmp_path)
    assert_one_line(result, f"truncate the file to its first {len(whole)} bytes")
    journal.write_bytes(journal.read_bytes()[:len(whole)])
    again = tune(tmp_path)
    assert again.returncode == 0, again.stderr
    assert "32x32x32:" in again.stdout


def test_an_emptied_store_under_a_finished_study_is_refused(finished, tmp_path):
    """`: > store.sqlite`: the study says it is done; exporting from the empty store would write nothing, silently."""
    _copy(finished, tmp_path)
    (tmp_path / "r.sqlite").write_bytes(b"")
    result = tune(tmp_path)
    assert_one_line(result, "r.sqlite", "has no result for 2 of the 2 evaluated trials", "emptied or replaced")
    assert not (tmp_path / "out").exists()


def test_a_journal_path_that_is_a_directory_is_one_line(tmp_path):
    (tmp_path / "j.log").mkdir()
    assert_one_line(tune(tmp_path), "j.log", "is a directory")


def test_a_store_held_locked_is_not_called_damaged(tmp_path):
    """A whole store that cannot be written (held by another process, a read-only folder) was reported with the
    advice for a damaged file, "move it away and start a new store"; the advice now says what to check."""
    path = tmp_path / "s.sqlite"
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(DataFileError) as info:
            Store(path, timeout_s=0.2).record(Result(problem="p", spec="kernel k { }\n", target="triton", gpu="g",
                                                     protocol="kernel", status="ok", speedup=1.0))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "locked" in str(info.value) and "no process holds it" in str(info.value)
    assert "start a new store" not in str(info.value)
