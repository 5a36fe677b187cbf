"""Parsing, the canonical printer and the parser's error contract."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from l2c.errors import L2Error, L2SyntaxError
from l2c.ir import KernelSpec, print_spec, print_specs
from l2c.knobs import KNOBS
from l2c.parser import parse, parse_one

from .strategies import fits_fp32, fp32_scalars, huge_integer_texts, specs

EXAMPLE = """\
# comment line
kernel hgemm {            # trailing comment
  problem m=4096 n=any k=64
  tile    m=128 n=256 k=64
  epilogue alpha=2 beta=-0.5 bias=col activation=gelu
}
kernel defaults { }
"""


def test_parse_example_and_defaults():
    first, second = parse(EXAMPLE, "ex.l2")
    assert first.name == "hgemm" and first.problem_m == 4096 and first.problem_n == "any"
    assert (first.tile_m, first.tile_n, first.tile_k) == (128, 256, 64)
    assert first.epilogue_alpha == 2.0 and first.epilogue_beta == -0.5
    assert second == KernelSpec(name="defaults")
    assert first.origin.file == "ex.l2"
    assert first.origin.position_of("tile_n") == (4, 19)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_print_then_parse_is_identity(spec):
    assert parse_one(print_spec(spec)) == spec


@settings(max_examples=100)
@given(st.lists(specs(), min_size=1, max_size=4, unique_by=lambda s: s.name))
def test_printing_is_canonical_and_idempotent(spec_list):
    text = print_specs(spec_list)
    again = parse(text)
    assert again == spec_list
    assert print_specs(again) == text


@settings(max_examples=100)
@given(specs(), st.randoms(use_true_random=False))
def test_statement_order_and_whitespace_do_not_matter(spec, rnd):
    lines = print_spec(spec).splitlines()
    body = lines[1:-1]
    rnd.shuffle(body)
    text = "\n\n".join([lines[0]] + ["   " + b + "   # note" for b in body] + [lines[-1]])
    assert parse_one(text) == spec


@pytest.mark.parametrize("text, line, col, fragment", [
    ("kernel a { tile m=100 }", 1, 19, 'unexpected \'100\'; expected one of "1", "112", "128"'),
    ("kernel a { pipeline stages=12 }", 1, 28, "unexpected '12'; expected one of \"1\", \"2\""),
    ("kernel a {\n  tile m=128 m=64 }", 2, 16, "tile.m is set twice"),
    ("kernel a { split_k slices=99 }", 1, 27, "above the maximum 32"),
    ("kernel a { split_k slices=0 }", 1, 27, "below the minimum 1"),
    ("kernel a { problem m=0 }", 1, 22, "below the minimum 1"),
    ("kernel a { foo }", 1, 12, 'unexpected \'foo\'; expected one of "cluster"'),
    ("kernel a {", 1, 11, "unexpected end of file"),
    ("", 1, 1, 'expected "kernel"'),
    ("kernel a {} kernel a {}", 1, 20, "used twice"),
    ("kernel 1a {}", 1, 8, "expected a name"),
    ("kernel a { epilogue alpha=1e999 }", 1, 27, "not a finite number"),
    ("kernel a { epilogue alpha=1e-400 }", 1, 27, "too small to be told from 0"),
    ("kernel a { types a=f64 }", 1, 20, 'expected one of "bf16", "f16", "f32"'),
    ("kernel a { tile m=128 } $", 1, 25, "unexpected character '$'"),
])
def test_syntax_errors_name_file_line_col_and_expectation(text, line, col, fragment):
    with pytest.raises(L2SyntaxError) as info:
        parse(text, "bad.l2")
    err = info.value
    assert (err.file, err.line, err.col) == ("bad.l2", line, col), err.render()
    assert fragment in err.render()
    assert err.render().startswith(f"bad.l2:{line}:{col}: error: ")


_VALID_TEXT = print_spec(KernelSpec(name="k", tile_m=64, epilogue_bias="row"))


@settings(max_examples=400)
@given(st.text(max_size=200))
def test_fuzz_random_text_only_raises_l2_errors(text):
    try:
        parse(text)
    except L2Error:
        pass


@settings(max_examples=400)
@given(st.data())
def test_fuzz_mutations_of_valid_specs_only_raise_l2_errors(data):
    text = _VALID_TEXT
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(text)))
        op = data.draw(st.sampled_from(["insert", "delete", "replace", "duplicate"]))
        chunk = data.draw(st.text(min_size=1, max_size=6))
        if op == "insert":
            text = text[:pos] + chunk + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + len(chunk):]
        elif op == "replace":
            text = text[:pos] + chunk + text[pos + len(chunk):]
        else:
            text = text[:pos] + text[pos:pos + 20] + text[pos:]
    try:
        result = parse(text)
    except L2Error as err:
        assert err.line is not None and err.line >= 1
    else:
        assert all(isinstance(s, KernelSpec) for s in result)


def test_every_knob_has_a_default_that_prints_and_parses():
    spec = KernelSpec(name="d")
    for knob in KNOBS:
        assert getattr(spec, knob.field) == knob.default
    assert parse_one(print_spec(spec)) == spec


@pytest.mark.parametrize("text, line, col", [
    ("kernel a { # x\u2028y\x0c\n\n", 1, 17),        # U+2028 and form feed are no line breaks to Lark
    ("kernel a {\r\n  tile m=64\r\n", 2, 12),
    ("kernel a {\n\n\n   ", 1, 11),                  # just after the last thing written
    ("kernel a { tile m=64 \x0b", 1, 22),           # a vertical tab is not whitespace to the grammar either
])
def test_end_of_file_errors_point_into_the_file(text, line, col):
    with pytest.raises(L2SyntaxError) as info:
        parse(text, "e.l2")
    assert (info.value.line, info.value.col) == (line, col), info.value.render()
    assert info.value.line <= text.count("\n") + 1


@settings(max_examples=200)
@given(st.sampled_from(["problem m", "problem n", "problem k", "problem batch", "split_k slices"]),
       huge_integer_texts)
def test_fuzz_huge_integers_are_range_errors_at_their_token(knob_text, digits):
    section, name = knob_text.split()
    text = f"kernel a {{\n  {section} {name}={digits}\n}}\n"
    value = int(digits) if len(digits) < 4000 else None
    hi = 32 if section == "split_k" else 2 ** 31 - 1
    try:
        spec = parse_one(text)
    except L2SyntaxError as err:
        assert value is None or value > hi or value < 1, err.render()
        assert (err.line, err.col, err.rule) == (2, len(section) + len(name) + 5, "range"), err.render()
        assert len(err.render()) < 300
    else:
        assert value is not None and 1 <= value <= hi
        assert getattr(spec, f"{section}_{name}") == value


@settings(max_examples=200)
@given(st.sampled_from(["alpha", "beta"]), fp32_scalars)
def test_fuzz_out_of_range_scalars_are_rejected_before_any_compiler(name, value):
    from l2c.errors import L2ValidationError
    from l2c.validate import validate
    text = f"kernel a {{ epilogue {name}={value!r} }}"
    spec = parse_one(text)
    try:
        validate(spec, "triton")
    except L2ValidationError as err:
        assert not fits_fp32(value) and err.rule == "fp32-scalar" and err.knob == f"epilogue.{name}", err.render()
        assert (err.line, err.col) == (1, 21 + len(name) + 1)
    else:
        assert fits_fp32(value)


@settings(max_examples=200)
@given(st.binary(max_size=120), st.sampled_from([b"", b"kernel a {", b"kernel a {}\n", "\u00e9".encode()]))
def test_fuzz_bytes_files_only_raise_l2_errors_inside_the_file(tmp_path_factory, data, prefix):
    from l2c.parser import parse_file
    path = tmp_path_factory.mktemp("b") / "f.l2"
    path.write_bytes(prefix + data)
    try:
        parse_file(path)
    except L2Error as err:
        assert err.line is None or 1 <= err.line <= (prefix + data).count(b"\n") + 1, err.render()
