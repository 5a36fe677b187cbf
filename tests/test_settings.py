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
