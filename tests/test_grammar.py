"""The grammar file is generated from the knob table and stays within the Lark/llguidance subset."""
import re

from l2c.grammar import generate_grammar, grammar_text
from l2c.knobs import KNOBS, SECTIONS


def test_committed_grammar_is_current():
    assert grammar_text() == generate_grammar(), "run `python -m l2c.grammar` and commit grammar/l2.lark"


def test_every_knob_and_value_is_spelled_in_the_grammar():
    text = grammar_text()
    for section in SECTIONS:
        assert f'"{section}"' in text
    for knob in KNOBS:
        if knob.name:
            assert re.search(rf'^{knob.field}: "{knob.name}" "="', text, re.M), knob.key
        if knob.kind == "enum":
            for value in knob.choices:
                assert f'"{value}"' in text


def test_grammar_stays_in_the_shared_subset():
    text = grammar_text()
    assert "::=" not in text
    assert not re.search(r"^[A-Z_]+\.\d+\s*:", text, re.M), "terminal priorities are not portable"
    imports = re.findall(r"^%import (\S+)", text, re.M)
    assert all(i.startswith("common.") for i in imports)


def test_readme_documents_every_knob_and_rule_as_the_tables_say():
    from pathlib import Path

    from l2c.commands.check import knob_table_markdown
    from l2c.validate import RULES
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert knob_table_markdown() in readme, "paste `l2c check --knobs` into the README"
    for name, text in RULES.items():
        assert f"| `{name}` | {text} |" in readme, name
