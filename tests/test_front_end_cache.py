"""The front end's saved work in the user cache: the .l2 parser's tables and the templates' compiled code load in
later processes instead of being rebuilt, behave exactly as freshly built ones, and a damaged, foreign or
unwritable cache only costs the rebuild."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lark import Lark

from l2c import cache, grammar, lower
from l2c.errors import L2Error
from l2c.parser import parse_one
from l2c.validate import validate

from .strategies import specs, valid_specs


@pytest.fixture
def fresh_front_end(tmp_path, monkeypatch):
    """The front end as a new process sees it, with its user cache under tmp_path; a `reload()` drops what this
    process holds, as the next process would start."""
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "cache"))

    def reload():
        grammar.lark_parser.cache_clear()
        lower.environment.cache_clear()

    reload()
    yield reload
    reload()


def _outcome(text: str):
    """What parse_one makes of a text: the spec, or the error it reports (with its file:line:col)."""
    try:
        return parse_one(text, file="x.l2")
    except L2Error as err:
        return str(err)


_TEXTS = st.one_of(specs().map(lambda s: s.to_l2()),
                   specs().map(lambda s: s.to_l2()).flatmap(
                       lambda t: st.integers(0, len(t) - 1).map(lambda i: t[:i] + "}" + t[i + 1:])))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_TEXTS, min_size=1, max_size=4))
def test_a_saved_parser_parses_and_reports_errors_as_a_freshly_built_one(fresh_front_end, texts):
    fresh_front_end()
    built = [_outcome(t) for t in texts]           # builds the parser and saves it
    assert list(cache.cache_dir("front_end").glob("l2_parser_*.pickle"))
    fresh_front_end()
    loaded = [_outcome(t) for t in texts]          # loads the saved copy
    reference = Lark(grammar.grammar_text(), **grammar.PARSER_OPTIONS)
    assert type(grammar.lark_parser()) is Lark and grammar.lark_parser() is not reference
    assert loaded == built
    for text in texts:
        try:
            want = reference.parse(text)
        except Exception as err:  # noqa: BLE001 - the loaded parser must fail the same way
            with pytest.raises(type(err)):
                grammar.lark_parser().parse(text)
        else:
            assert grammar.lark_parser().parse(text) == want


@pytest.mark.parametrize("damage", [b"", b"not a pickle", None])
def test_a_damaged_or_truncated_saved_parser_is_built_again_and_replaced(fresh_front_end, damage):
    grammar.lark_parser()
    (saved,) = cache.cache_dir("front_end").glob("l2_parser_*.pickle")
    good = saved.read_bytes()
    saved.write_bytes(good[: len(good) // 2] if damage is None else damage)
    fresh_front_end()
    spec = parse_one("kernel k { tile m=64 n=64 k=32 }")
    assert (spec.tile_m, spec.tile_n, spec.tile_k) == (64, 64, 32)
    assert saved.read_bytes() != (good[: len(good) // 2] if damage is None else damage)   # saved again, whole
    with open(saved, "rb") as f:
        assert Lark.load(f).parse("kernel k { }") == grammar.lark_parser().parse("kernel k { }")
    assert not list(saved.parent.glob("*.tmp"))


def test_an_unwritable_cache_leaves_the_front_end_working(fresh_front_end, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv(cache.ENV_VAR, str(blocker / "cache"))   # under a file: no folder can be made there
    fresh_front_end()
    spec = parse_one("kernel k { target triton\n problem m=64 n=64 k=64 }")
    assert "@triton.jit" in lower.render(validate(spec, "triton", "sm_90"))


@pytest.mark.parametrize("target", ["triton", "cutlass"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_templates_loaded_from_their_compiled_code_render_as_freshly_compiled_ones(fresh_front_end, target, data):
    valid = validate(data.draw(valid_specs(target)), target, "sm_90")
    fresh_front_end()
    compiled = lower.render(valid)
    saved = list(cache.cache_dir("templates").glob("__jinja2_*.cache"))
    assert saved
    fresh_front_end()
    assert lower.render(valid) == compiled       # from the saved code
    for path in saved:                           # truncated copies: compiled again
        path.write_bytes(path.read_bytes()[:40])
    fresh_front_end()
    assert lower.render(valid) == compiled
