"""The L2C_* settings: one registry (l2c/settings.py) that every reader goes through, each documented in the
README; none of them reaches the generated code (that is what knobs are for)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from l2c import settings

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for d in ("l2c", "search") for p in (ROOT / d).rglob("*.py") if p.name != "settings.py"]


def test_every_l2c_variable_is_read_through_the_registry():
    direct = [f"{p.relative_to(ROOT)}: {line.strip()}" for p in SOURCES for line in p.read_text().splitlines()
              if re.search(r"environ(\.get\(|\[)\s*[\"']L2C_", line)]
    assert direct == []
    named = {m for p in SOURCES for m in re.findall(r"[\"'](L2C_[A-Z_]+)[\"']", p.read_text())}
    assert named <= set(settings.SETTINGS), named - set(settings.SETTINGS)


def test_every_setting_is_documented_and_none_reaches_a_template():
    readme = (ROOT / "README.md").read_text()
    assert [n for n, doc in settings.SETTINGS.items() if f"| `{n}` | {doc} |" not in readme] == []
    templates = " ".join(p.read_text() for p in (ROOT / "templates").rglob("*.j2"))
    assert "L2C_" not in templates and "environ" not in templates


def test_an_unknown_setting_is_a_programming_error(monkeypatch):
    monkeypatch.setenv("L2C_PREPARE", "")
    assert settings.value("L2C_PREPARE") is None
    with pytest.raises(KeyError):
        settings.value("L2C_NOT_A_SETTING")


@pytest.mark.parametrize("text", ["abc", "nan", "-1", "inf", "-0.5"])
def test_a_tuning_margin_that_is_not_a_ratio_is_refused(text, monkeypatch):
    """A margin below 0, NaN or text silently became a default, or let a kernel 7x slower than torch win and be
    persisted (-1); it is refused by name, and the default dispatcher then turns online choice off."""
    from l2c import online
    for name, read in (("L2C_TUNE_MARGIN", online.margin), ("L2C_TUNE_EAGER_MARGIN", online.eager_margin)):
        monkeypatch.setenv(name, text)
        with pytest.raises(ValueError, match=name):
            read()
        monkeypatch.delenv(name)
    monkeypatch.setenv("L2C_TUNE_MARGIN", "1.2")
    assert online.margin() == 1.2 and online.eager_margin() == online.DEFAULT_EAGER_MARGIN


@pytest.mark.parametrize("text, seconds", [("inf", 900.0), ("1e300", 900.0), ("nan", 900.0), ("-3", 900.0),
                                           ("soon", 900.0), ("45", 45.0)])
def test_the_prepare_timeout_is_a_number_of_seconds_a_timer_can_wait(text, seconds, monkeypatch, caplog):
    """inf made the job's threading.Timer raise OverflowError in its thread (a traceback in the user's program, and
    no limit at all); every value a timer cannot wait is warned of and the default used."""
    from l2c import prepare
    monkeypatch.setenv("L2C_PREPARE_TIMEOUT_S", text)
    with caplog.at_level("WARNING", logger="l2c.prepare"):
        assert prepare.job_timeout_s() == seconds
    assert ("L2C_PREPARE_TIMEOUT_S" in caplog.text) == (seconds != 45.0)
    assert prepare.JOB_TIMEOUT_S == 900.0


def test_a_cache_folder_that_is_a_file_is_a_warning_at_start_up_not_a_thread_traceback(tmp_path):
    """L2C_CACHE_DIR naming a file: the start-up thread raised NotADirectoryError and Python printed 'Exception in
    thread l2c-start-up'; now calls fall back with a warning, and compute the same."""
    import os
    import subprocess
    import sys
    afile = tmp_path / "afile"
    afile.write_text("x")
    script = ("import torch, l2c; from l2c import background; "
              "print(l2c.matmul(torch.ones(2, 3), torch.ones(3, 2))[0, 0].item()); background.join_all(30)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "L2C_CACHE_DIR": str(afile), "L2C_WARM_START": "0"})
    assert done.returncode == 0 and done.stdout.strip() == "3.0", done.stderr
    assert "Exception in thread" not in done.stderr and "Traceback" not in done.stderr, done.stderr
