"""The C++ call table (l2c.native_call), built with the real host C++ compiler against this torch.

Its plans' entry point is a real C function (the `recorder` fixture of conftest.py) that records what it received,
so the pointers, the output's allocation and every way a call can miss or be declined are checked on CPU tensors
(a CPU call runs on "device -1" with no stream); its first test and torch fallback run torch's own CPU ops. On the
GPU the same table launches CUTLASS libraries (scripts/served_path.py measures it there).
"""
from __future__ import annotations

import ctypes
import dataclasses
import subprocess

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import l2c
from l2c import dispatch, native_call, ops
from l2c.targets.cutlass import shim

pytestmark = pytest.mark.skipif(native_call.find_cxx_compiler() is None or shim.find_c_compiler() is None,
                                reason="no host C/C++ compiler")

CPU = -1   # the device word of a CPU call in the table


@pytest.fixture(scope="module")
def new_table():
    assert native_call.build_now(timeout=900), native_call.failure()

    def make(matmul_spans=None, linear_spans=None):
        """A table whose resolvers answer `matmul_spans(a, b)` / `linear_spans(x, weight)` (default: every M served,
        so that calls reach the plans)."""
        every = lambda *_: [(0, 1 << 40)]   # noqa: E731
        return native_call.new_table(matmul_spans or every, linear_spans or every)
    return make


class Plan:
    """A call plan with an m x n output whose entry point is the recorder, which returns its M ^ N arguments as
    the status: the plan passes M = N = m (success), or M = m, N = m + 4 with `fail` (an error status)."""

    def __init__(self, recorder, m, n, dtype=torch.float16, transposed=False, fail=False, workspace=(4096, 256)):
        from l2c.kernel import output_template
        self.struct = shim.make_plan(recorder.record, (m, m + 4 if fail else m, 64, 1, 64, 0, n, 0, n, 0, n, 0,
                                                       *workspace))
        self.stored = (n, m) if transposed else (m, n)
        self.template = output_template(self.stored, dtype, torch.device("cpu"))
        self.transposed = transposed

    def add(self, table, a, b, bias=None, activation=0, device=CPU):
        table.add(a, b, bias, activation, self.struct, ctypes.addressof(self.struct), self.template, self.transposed,
                  device)


def operands(m=8, n=8, k=64, dtype=torch.float16):
    return torch.zeros(m, k, dtype=dtype), torch.zeros(k, n, dtype=dtype), torch.zeros(n, dtype=dtype)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_registered_call_launches_its_plan_with_this_calls_pointers(new_table, recorder, transposed):
    table = new_table()
    plan = Plan(recorder, 8, 8, transposed=transposed)
    a, b, bias = operands()
    plan.add(table, a, b, bias)
    assert table.size() == 1
    a2, b2, bias2 = operands()                       # the same signature, other tensors
    out = table.call(a2, b2, bias2, 0)
    assert tuple(out.shape) == (8, 8) and out.dtype == torch.float16
    assert out.is_contiguous() == (not transposed) and out.mT.is_contiguous() == transposed
    seen = [recorder.recorded(i) for i in range(20)]
    assert seen[:5] == [a2.data_ptr(), b2.data_ptr(), 0, bias2.data_ptr(), out.data_ptr()]
    assert seen[5:9] == [8, 8, 64, 1] and seen[19] == 0        # a CPU call: no stream
    assert table.call(a2, b2, bias2, 0).data_ptr() != out.data_ptr()   # each call its own output
    assert table.counts() == (2, 0)
    assert [recorder.recorded(17), recorder.recorded(18)] == [4096, 256]   # the plan's workspace


def test_the_table_launches_through_the_call_plan_shims_entry(new_table, capture_library):
    """Every served launch goes through the shim's `l2c_run_planned` (whose address `new_table` passes), so a call
    captured into a CUDA graph follows the shim's overlap rule (tests/test_cutlass_shim.py) on both call paths; here
    the entry handed to the table is a C stand-in that records the plan it gets."""
    assert new_table is not None   # the extension is built
    entry = ctypes.cast(capture_library.planned, ctypes.c_void_p).value
    table = native_call._module.CallTable(lambda *_: [(0, 1 << 40)], lambda *_: [(0, 1 << 40)], entry)
    struct = shim.make_plan(capture_library.launch, (8, 8, 64, 1, 64, 0, 8, 0, 8, 0, 8, 0, 4096, 256))
    a, b, _ = operands()
    table.add(a, b, None, 0, struct, ctypes.addressof(struct), torch.empty(8, 8, dtype=torch.float16), False, CPU)
    before = capture_library.planned_count()
    assert table.call(a, b, None, 0) is not None and table.call(a, b, None, 0) is not None
    assert capture_library.planned_count() - before == 2
    assert capture_library.last_planned() == ctypes.addressof(struct)
    without = native_call._module.CallTable(lambda *_: None, lambda *_: None, 0)   # no shim: no plan is taken
    with pytest.raises(RuntimeError, match="without the call-plan shim"):
        without.add(a, b, None, 0, struct, ctypes.addressof(struct), torch.empty(8, 8, dtype=torch.float16), False,
                    CPU)


def test_a_plan_without_a_workspace_pointer_launches_with_the_calls_own(new_table, recorder):
    """A kernel that writes a workspace keeps none in its plan: the table allocates one of the plan's size for each
    call (torch's caching allocator, the call's stream), so calls on two streams never share one."""
    table = new_table()
    plan = Plan(recorder, 8, 8, workspace=(0, 1040))
    a, b, bias = operands()
    plan.add(table, a, b, bias)
    out = table.call(a, b, bias, 0)
    first = recorder.recorded(17)
    assert first != 0 and first % 16 == 0 and recorder.recorded(18) == 1040
    assert first not in (a.data_ptr(), b.data_ptr(), bias.data_ptr(), out.data_ptr())
    held = torch.empty(1040, dtype=torch.uint8)          # memory in use elsewhere is never handed out
    table.call(a, b, bias, 0)
    assert recorder.recorded(17) not in (0, held.data_ptr()) and table.counts() == (2, 0)


def test_the_call_declines_where_the_python_path_must_decide(new_table, recorder):
    """A misaligned pointer, another device than the plan's, autograd recording (backward or forward mode), autocast
    to another dtype, a torch.func wrapper (vmap), an error status, an operand that is a tensor subclass or under a
    torch function mode: None."""
    table, kept = new_table(), Plan(recorder, 8, 8)
    a, b, bias = operands()
    kept.add(table, a, b, bias)
    skewed = torch.zeros(8 * 64 + 1, dtype=torch.float16)[1:].view(8, 64)
    assert table.call(skewed, b, bias, 0) is None
    elsewhere, plan = new_table(), Plan(recorder, 8, 8)
    plan.add(elsewhere, a, b, bias, device=0)                  # a plan of CUDA device 0
    assert elsewhere.call(a, b, bias, 0) is None
    w, plan = b.clone().requires_grad_(), Plan(recorder, 8, 8)
    plan.add(table, a, w, bias)
    assert table.call(a, w, bias, 0) is None                   # autograd records this call
    with torch.no_grad():
        assert table.call(a, w, bias, 0) is not None
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        dual = fwAD.make_dual(a, torch.ones_like(a))
        assert table.call(dual, b, bias, 0) is None            # forward-mode autograd records this call
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert table.call(a, b, bias, 0) is None               # autocast computes f16 operands in bf16
    with torch.autocast("cpu", dtype=torch.float16):
        assert table.call(a, b, bias, 0) is not None           # in their own dtype: the plan serves
    wide, plan = b.float(), Plan(recorder, 8, 8)
    plan.add(table, a, wide, bias)
    assert table.call(a, wide, bias, 0) is not None
    with torch.autocast("cpu", dtype=torch.float16):
        assert table.call(a, wide, bias, 0) is None            # autocast casts b (a is in its dtype already)
    declined = []
    torch.vmap(lambda x: declined.append(table.call(x, b, bias, 0) is None) or x.sum())(a.unsqueeze(0))
    assert declined == [True]                                  # a batched tensor under vmap has no memory of its own
    failing, plan = new_table(), Plan(recorder, 8, 8, fail=True)
    plan.add(failing, a, b, bias)
    assert failing.call(a, b, bias, 0) is None

    class Marked(torch.Tensor):
        pass
    assert table.call(a.as_subclass(Marked), b, bias, 0) is None
    assert table.call(a, b, bias, 0) is not None

    class Watching(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    with Watching():
        assert table.call(a, b, bias, 0) is None
    assert table.counts()[1] == 0                              # none of them went to torch here either


CHANGES = ["a rows", "a stride", "a dtype", "b cols", "b layout", "bias absent", "bias length", "activation"]


@settings(max_examples=40, deadline=None)
@given(change=st.sampled_from(CHANGES))
def test_a_call_of_any_other_signature_misses(new_table, recorder, change):
    """The key is the call signature (shapes, strides, dtypes, devices of A, B, bias) and the activation: a call
    that differs in any of them is not this plan's."""
    table, plan = new_table(), Plan(recorder, 16, 8)
    a, b, bias = operands(16, 8)
    plan.add(table, a, b, bias, activation=1)
    assert table.call(a, b, bias, 1) is not None
    other = {"a rows": lambda: (torch.zeros(24, 64, dtype=torch.float16), b, bias, 1),
             "a stride": lambda: (torch.zeros(16, 128, dtype=torch.float16)[:, :64], b, bias, 1),
             "a dtype": lambda: (a.to(torch.bfloat16), b.to(torch.bfloat16), bias.to(torch.bfloat16), 1),
             "b cols": lambda: (a, torch.zeros(64, 16, dtype=torch.float16), bias, 1),
             "b layout": lambda: (a, torch.zeros(8, 64, dtype=torch.float16).t(), bias, 1),
             "bias absent": lambda: (a, b, None, 1),
             "bias length": lambda: (a, b, torch.zeros(16, dtype=torch.float16)[::2], 1),   # same length, stride 2
             "activation": lambda: (a, b, bias, 0)}[change]()
    assert table.call(*other) is None


def test_a_linear_call_is_the_matmul_of_the_transposed_weight_with_any_leading_dimensions(new_table, recorder):
    table = new_table()
    x = torch.zeros(2, 3, 64, dtype=torch.float16)
    weight = torch.zeros(8, 64, dtype=torch.float16)
    plan = Plan(recorder, 6, 8)
    plan.add(table, x.reshape(-1, 64), weight.t())                   # as Dispatcher.linear registers it
    y = table.call_linear(x, weight, None, 0)
    assert tuple(y.shape) == (2, 3, 8)
    assert [recorder.recorded(i) for i in (0, 1, 4)] == [x.data_ptr(), weight.data_ptr(), y.data_ptr()]
    assert table.call_linear(x.transpose(0, 1), weight, None, 0) is None   # not contiguous: the Python path
    assert table.call(x.reshape(-1, 64), weight.t(), None, 0) is not None


_SPANS = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 12)).map(lambda t: (t[0], t[0] + t[1])), max_size=3)


B_FORMS = {"row-major": lambda k, n, dtype: torch.randn(k, n, dtype=dtype),
           "a row-major column slice": lambda k, n, dtype: torch.randn(k, n + 8, dtype=dtype)[:, :n],
           "column-major": lambda k, n, dtype: torch.randn(n, k, dtype=dtype).t()}


@settings(max_examples=60, deadline=None)
@given(spans=st.dictionaries(st.tuples(st.sampled_from([8, 12]), st.sampled_from([8, 16]), st.booleans()), _SPANS),
       calls=st.lists(st.tuples(st.integers(1, 48), st.sampled_from([8, 12]), st.sampled_from([8, 16]),
                                st.sampled_from(sorted(B_FORMS)), st.sampled_from([torch.float16, torch.float32])),
                      min_size=1, max_size=12))
def test_the_first_test_sends_to_torch_exactly_the_ms_its_resolver_does_not_serve(new_table, spans, calls):
    """A key's spans are asked of the resolver once, then remembered; an M outside them is torch.matmul's result
    (bitwise: the same op), counted; an M inside them with no plan is left to the Python path (None). A row-major
    B is keyed as row-major whether it is contiguous or a column slice of a wider matrix (the dispatcher's
    `b_map_index`: the served_kn map the resolver reads)."""
    asked = []

    def resolve(a, b):
        key = (b.shape[0], b.shape[1], bool(dispatch.b_map_index(b)))
        asked.append((a.dtype, key))
        return spans.get(key, []) if a.dtype == torch.float16 else []
    table = new_table(resolve)
    fallbacks = 0
    for m, k, n, form, dtype in calls:
        a = torch.randn(m, k, dtype=dtype)
        b = B_FORMS[form](k, n, dtype)
        column_major = form == "column-major"
        served = dtype == torch.float16 and any(lo <= m <= hi for lo, hi in spans.get((k, n, column_major), []))
        y = table.call(a, b, None, 0)
        if served:
            assert y is None
        else:
            fallbacks += 1
            assert torch.equal(y, torch.matmul(a, b))
    assert table.counts() == (0, fallbacks)
    assert len(asked) == len(set(asked)) == table.shapes()


def test_a_linear_call_no_entry_serves_is_f_linear_with_its_bias_and_gradients(new_table):
    table = new_table(linear_spans=lambda x, w: [(5, 5)])
    x = torch.randn(2, 3, 16, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(8, 16))
    bias = torch.nn.Parameter(torch.randn(8))
    y = table.call_linear(x, weight, bias, 0)
    torch.testing.assert_close(y, F.linear(x, weight, bias), rtol=0, atol=0)
    y.sum().backward()
    assert x.grad is not None and weight.grad is not None and bias.grad is not None
    assert table.call_linear(torch.randn(5, 16), weight, None, 0) is None   # M = 5 is served: no plan, Python
    assert table.call_linear(torch.randn(4, 16), weight, None, 2) is None   # an activation unserved: Python
    assert table.counts() == (0, 1)


def test_the_dispatcher_serves_through_the_table_once_it_is_loaded(new_table, recorder, monkeypatch):
    """A dispatcher made once the extension is loaded holds a table (`Dispatcher.native`) whose first test asks the
    dispatcher's maps; `_remember_served` puts a CUTLASS launcher's plan in it, and `l2c.matmul`'s path
    (`ops.matmul_with`) and the custom op a compiled graph calls are then served by it; `stats` counts both paths."""
    from l2c.dispatch import Dispatcher, TunedEntry, TunedTable
    from l2c.kernel import call_signature
    from l2c.ir import KernelSpec
    from tests.test_cutlass_shim import _bound_kernel
    spec = KernelSpec(name="k", target="cutlass").to_l2()
    entry = TunedEntry(m=8, n=8, k=64, batch=1, dtype="f16", layout="row,row,row", target="cutlass",
                       spec_text=spec, tflops=2.0, baseline_tflops=1.0)
    dispatcher = Dispatcher(TunedTable([entry]), allow_cpu=True)
    assert dispatcher.native is not None
    kernel = _bound_kernel(recorder, 8, 8)
    a, b, _ = operands()
    sig = call_signature(a, b, None)
    kernel._plans = {sig: dataclasses.replace(kernel._plans["sig"], device=CPU)}
    dispatcher._remember_served((sig, None), kernel, a, b, None)
    assert dispatcher.native.size() == 1
    y = ops.matmul_with(dispatcher, a, b)
    assert tuple(y.shape) == (8, 8) and dispatcher.stats == {"tuned": 1, "fallback": 0}
    assert recorder.recorded(0) == a.data_ptr()
    monkeypatch.setattr(dispatch, "_default", dispatcher)
    a2 = a.clone()
    assert tuple(ops._matmul_op(a2, b, None, "none").shape) == (8, 8) and dispatcher.stats["tuned"] == 2
    assert recorder.recorded(0) == a2.data_ptr()
    assert tuple(l2c.matmul(a2, b).shape) == (8, 8) and dispatcher.stats["tuned"] == 3
    other = torch.randn(3, 64, dtype=torch.float16)            # an M no entry serves: torch, in C++
    torch.testing.assert_close(l2c.matmul(other, b), torch.matmul(other, b), rtol=0, atol=0)
    assert dispatcher.stats == {"tuned": 3, "fallback": 1} and dispatcher.native.counts() == (3, 1)


def test_l2c_nn_linear_goes_through_the_table(new_table, monkeypatch):
    from l2c.dispatch import Dispatcher, TunedTable
    from tests.test_dispatch import entry
    dispatcher = Dispatcher(TunedTable([entry(32, 48, 40)]), allow_cpu=True)
    monkeypatch.setattr(dispatch, "_default", dispatcher)
    layer = l2c.nn.Linear(40, 48, dtype=torch.float16)
    x = torch.randn(2, 5, 40, dtype=torch.float16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=0, atol=0)
    assert dispatcher.native.counts() == (0, 1) and dispatcher.native.shapes() == 1


def test_without_a_cxx_compiler_calls_keep_the_python_path(tmp_path):
    """No C++ compiler (or no torch headers): the build fails once with a warning that says why, no table is made,
    and the dispatcher keeps its Python path; `L2C_NATIVE_CALL=0` never builds."""
    import os
    import sys
    code = ("import warnings\nfrom l2c import native_call\n"
            "with warnings.catch_warnings(record=True) as w:\n    warnings.simplefilter('always')\n"
            "    print(native_call.build_now(), native_call.new_table(None, None) is None,"
            " repr(native_call.failure()), any('Python path' in str(x.message) for x in w))\n")
    env = dict(os.environ, L2C_CACHE_DIR=str(tmp_path), CXX="", PATH=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ", 2)[:2] == ["False", "True"]
    assert "no C++ compiler" in done.stdout and done.stdout.strip().endswith("True")
    off = subprocess.run([sys.executable, "-c", "from l2c import native_call\n"
                          "print(native_call.build_now(), native_call.failure())"],
                         capture_output=True, text=True, env=dict(os.environ, L2C_NATIVE_CALL="0",
                                                                  L2C_CACHE_DIR=str(tmp_path)))
    assert off.stdout.split() == ["False", "None"] and not list(tmp_path.glob("native/*.so"))


def test_compiled_graphs_trace_past_the_table(new_table, monkeypatch):
    """Under torch.compile the eager C++ call is never reached (it would break the graph): `fullgraph=True` compiles
    l2c.matmul and l2c.nn.Linear of a dispatcher holding the table, and the compiled results are torch's."""
    from l2c.dispatch import Dispatcher, TunedTable
    from tests.test_dispatch import entry
    dispatcher = Dispatcher(TunedTable([entry(32, 48, 40, dtype="f32"), entry(32, 48, 40, layout="row,row,row")]),
                            allow_cpu=True)
    assert dispatcher.native is not None
    monkeypatch.setattr(dispatch, "_default", dispatcher)
    layer = l2c.nn.Linear(40, 48)
    a, b = torch.randn(6, 40), torch.randn(40, 48)
    compiled = torch.compile(lambda a, b: (l2c.matmul(a, b), layer(a)), fullgraph=True)
    with torch.no_grad():
        y, z = compiled(a, b)
        torch.testing.assert_close(y, a @ b)
        torch.testing.assert_close(z, F.linear(a, layer.weight, layer.bias))


def test_the_table_warns_and_raises_as_torch_does(new_table):
    """Torch's warnings inside the table's op reach Python's `warnings` (recordable, filterable), and its errors are
    the exceptions torch.matmul and F.linear raise. (A fresh process: this warning is issued once per process.)"""
    import os
    import sys
    code = """
import warnings, torch
from l2c import native_call
assert native_call.build_now()
table = native_call.new_table(lambda a, b: [], lambda x, w: [])
x = torch.zeros(2, 8, dtype=torch.float16).view(torch.complex32)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    try:
        table.call(x, x.t(), None, 0)
    except Exception as err:
        print(type(err).__name__)
    try:
        torch.matmul(x, x.t())
    except Exception as err:
        print(type(err).__name__)
print(sorted({w.category.__name__ for w in seen}), any("ComplexHalf" in str(w.message) for w in seen))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    first, second, kinds = done.stdout.strip().splitlines()
    assert first == second and kinds == "['UserWarning'] True" and "ComplexHalf" not in done.stderr
    table = new_table(lambda a, b: [], lambda x, w: [])
    a, w = torch.randn(3, 16), torch.randn(8, 12)
    for run in (lambda: table.call(a, w.t(), None, 0), lambda: table.call_linear(a, w, None, 0)):
        with pytest.raises(RuntimeError):
            y = run()
            if y is None:   # left to the Python path, which raises as torch does
                F.linear(a, w)


def test_the_table_refuses_other_arguments_with_an_error_never_a_crash(new_table):
    """The two calls are CPython fast calls (not pybind11's argument dispatch): four positional arguments, an
    integer activation code, and a CallTable as `self`; anything else raises, never crashes."""
    table = new_table()
    a, b = operands()[:2]
    for call in (table.call, table.call_linear):
        with pytest.raises(TypeError):
            call(a, b, None)
        with pytest.raises(TypeError):
            call(a, b, None, "relu")
    with pytest.raises(TypeError):
        type(table).call(object(), a, b, None, 0)
    with pytest.raises(OverflowError):
        table.call(a, b, None, 10 ** 30)
    assert table.call(a, b, None, -1) is None and table.counts() == (0, 0)   # a code no plan has: declined


def test_a_compiled_graph_guards_neither_on_the_table_nor_on_the_counts(new_table, monkeypatch):
    """A function compiled while the table was not attached, and calling torch for shapes no entry serves, is not
    compiled again when the table attaches or as the fallback count grows."""
    from torch._dynamo.testing import CompileCounter
    from l2c.dispatch import Dispatcher, TunedTable
    from tests.test_dispatch import entry
    torch._dynamo.reset()
    dispatcher = Dispatcher(TunedTable([entry(32, 48, 40, layout="row,row,row")]), allow_cpu=True)
    dispatcher.native = None
    monkeypatch.setattr(dispatch, "_default", dispatcher)
    counter = CompileCounter()
    compiled = torch.compile(lambda a, b: l2c.matmul(a, b), backend=counter)
    a, b = torch.randn(6, 40), torch.randn(40, 48)
    for i in range(6):
        if i == 3:
            dispatcher._attach_native()
        torch.testing.assert_close(compiled(a, b), a @ b)
    assert counter.frame_count == 1


def test_a_shape_online_tuning_gave_to_torch_goes_to_torch_in_cxx(new_table, tmp_path, monkeypatch):
    """With online tuning on, every M may be served, so a new shape's first call takes the Python path (which tunes
    it); once the decision for a plain call is torch, later calls of that shape go to torch from the C++ table's
    first test, as a shape no table serves does, while other Ms of the same (K, N) still reach the Python path."""
    from l2c.dispatch import Dispatcher
    from l2c.online import Decisions, decision_settings
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    Decisions("cpu", "none", **decision_settings()).record(
        Decisions.signature("f16", "row,row,row", 8, 8, 64, False, "none"), None, 0.9)
    dispatcher = Dispatcher(None, allow_cpu=True, online=True)
    assert dispatcher.native is not None
    a, b, _ = operands()
    torch.testing.assert_close(ops.matmul_with(dispatcher, a, b), torch.matmul(a, b), rtol=0, atol=0)
    assert dispatcher.native.counts() == (0, 0) and dispatcher.counts["fallback"] == 1   # decided in Python
    held = dispatcher.served_kn[torch.float16][0][(64, 8)]   # b's (K, N), b row-major
    assert 8 not in held and 9 in held
    torch.testing.assert_close(ops.matmul_with(dispatcher, a, b), torch.matmul(a, b), rtol=0, atol=0)
    assert dispatcher.native.counts() == (0, 1) and dispatcher.counts["fallback"] == 1   # then torch in C++


def test_spans_answered_across_a_decision_are_asked_again(new_table):
    """A resolver's answer given while a decision made the table forget its first tests (another thread's online
    decision, while the resolver ran Python; here the resolver makes it itself) is not kept: that call takes the
    Python path and the next call asks again."""
    asked, tables = [], []

    def spans(a, b):
        asked.append(b.shape)
        tables[0].forget_first_tests()
        return []
    tables.append(new_table(matmul_spans=spans))
    a, b, _ = operands()
    assert tables[0].call(a, b, None, 0) is None and tables[0].shapes() == 0
    assert tables[0].call(a, b, None, 0) is None and len(asked) == 2


@settings(max_examples=100, deadline=None)
@given(st.sets(st.integers(0, 1 << 20), max_size=12), st.integers(0, 1 << 20))
def test_online_spans_hold_every_m_but_those_decided_torch(torch_ms, m):
    """The C++ first test's spans of a dispatcher that tunes online: closed, sorted, disjoint, and holding exactly
    the Ms online tuning did not give to torch."""
    from l2c.dispatch import _OnlineMs
    ms = _OnlineMs()
    ms.torch_ms.update(torch_ms)
    spans = ms.spans()
    assert all(lo <= hi for lo, hi in spans) and all(a[1] + 1 < b[0] for a, b in zip(spans, spans[1:]))
    held = any(lo <= x <= hi for lo, hi in spans for x in (m,))
    assert held == (m not in torch_ms) == (m in ms)


def test_a_kernel_whose_launch_fails_leaves_the_call_to_torch(new_table, recorder, caplog):
    """A served kernel whose launch fails (the entry point's CUDA-error status: a lost image, a GPU it was not built
    for) is not the call's fault: the C++ table hands the call to Python, which warns once and runs torch."""
    import logging
    from l2c.dispatch import Dispatcher, TunedEntry, TunedTable
    from l2c.errors import LaunchError
    from l2c.ir import KernelSpec
    from l2c.kernel import call_signature
    from tests.test_cutlass_shim import _bound_kernel
    spec = KernelSpec(name="k", target="cutlass").to_l2()
    entry = TunedEntry(m=2, n=4, k=64, batch=1, dtype="f16", layout="row,row,row", target="cutlass",
                       spec_text=spec, tflops=2.0, baseline_tflops=1.0)
    dispatcher = Dispatcher(TunedTable([entry]), allow_cpu=True)
    kernel = _bound_kernel(recorder, 2, 4)                       # status 2 ^ 4 = 6: a CUDA error
    a, b = torch.randn(2, 64, dtype=torch.float16), torch.randn(64, 4, dtype=torch.float16)
    sig = call_signature(a, b, None)
    kernel._plans = {sig: dataclasses.replace(kernel._plans["sig"], device=CPU)}
    kernel._get_device = lambda: CPU                              # the Python replay's device query, on CPU tensors
    with pytest.raises(LaunchError, match="status 6"):
        kernel.launcher(sig)(a, b, None)
    dispatcher._remember_served((sig, None), kernel, a, b, None)
    with caplog.at_level(logging.WARNING, logger="l2c.dispatch"):
        for _ in range(2):
            torch.testing.assert_close(ops.matmul_with(dispatcher, a, b), torch.matmul(a, b), rtol=0, atol=0)
    assert caplog.text.count("failed to launch") == 1


@pytest.fixture
def served(new_table, recorder):
    """A dispatcher whose C++ table holds a (recorder) plan for 8x64 @ 64x8 f16, as after one eager served call:
    (dispatcher, a, b)."""
    from l2c.dispatch import Dispatcher, TunedEntry, TunedTable
    from l2c.ir import KernelSpec
    from l2c.kernel import call_signature
    from tests.test_cutlass_shim import _bound_kernel
    entry = TunedEntry(m=8, n=8, k=64, batch=1, dtype="f16", layout="row,row,row", target="cutlass",
                       spec_text=KernelSpec(name="k", target="cutlass").to_l2(), tflops=2.0, baseline_tflops=1.0)
    dispatcher = Dispatcher(TunedTable([entry]), allow_cpu=True)
    kernel = _bound_kernel(recorder, 8, 8)
    a, b = torch.randn(8, 64, dtype=torch.float16), torch.randn(64, 8, dtype=torch.float16)
    sig = call_signature(a, b, None)
    kernel._plans = {sig: dataclasses.replace(kernel._plans["sig"], device=CPU)}
    kernel._get_device = lambda: CPU
    dispatcher._remember_served((sig, None), kernel, a, b, None)
    assert dispatcher.native.size() == 1
    return dispatcher, a, b


def _launches(dispatcher) -> int:
    return dispatcher.stats["tuned"]   # the C++ table's served calls included


@pytest.mark.parametrize("path", ["C++", "Python"])
@pytest.mark.parametrize("transform", ["functionalize", "functionalize_operand", "grad", "vjp", "jvp", "jacrev"])
def test_calls_inside_torch_func_transforms_are_torchs_on_both_paths(served, transform, path):
    """Inside a torch.func transform the table's plan never launches (functionalization's wrappers and an output
    allocated there have no memory: a launch would write to address 0) and the result is torch's."""
    dispatcher, a, b = served
    if path == "Python":
        dispatcher.native = None
    before = _launches(dispatcher)

    def f(x):   # a and b captured: plain tensors with memory
        return (ops.matmul_with(dispatcher, a, b).float().sum() * x).sum()
    x = torch.ones(2)
    if transform == "functionalize":
        y = torch.func.functionalize(lambda z: ops.matmul_with(dispatcher, a, b) + z)(torch.zeros(8, 8).half())
        torch.testing.assert_close(y, a @ b)
    elif transform == "functionalize_operand":
        torch.testing.assert_close(torch.func.functionalize(lambda z: ops.matmul_with(dispatcher, z, b))(a.clone()),
                                   a @ b)
    else:
        {"grad": lambda: torch.func.grad(f)(x), "vjp": lambda: torch.func.vjp(f, x),
         "jvp": lambda: torch.func.jvp(f, (x,), (x,)), "jacrev": lambda: torch.func.jacrev(f)(x)}[transform]()
    after = _launches(dispatcher)
    assert after == before


@pytest.mark.parametrize("path", ["C++", "Python"])
def test_a_traced_call_records_torchs_op_and_leaves_the_table_serving(served, path):
    """torch.jit.trace of a served call records torch's matmul (a launch would be invisible to the trace, which
    would then replay only the output's allocation), and eager calls are served again afterwards (the trace's sizes
    are not kept as the first test's answer)."""
    dispatcher, a, b = served
    if path == "Python":
        dispatcher.native = None
    ops.matmul_with(dispatcher, a, b)
    traced = torch.jit.trace(lambda x, y: ops.matmul_with(dispatcher, x, y), (a, b), check_trace=False)
    kinds = [node.kind() for node in traced.graph.nodes()]
    assert "aten::matmul" in kinds or "aten::mm" in kinds, kinds
    other = torch.randn(8, 64, dtype=torch.float16)
    torch.testing.assert_close(traced(other, b), other @ b)
    before = _launches(dispatcher)
    ops.matmul_with(dispatcher, a, b)
    assert _launches(dispatcher) == before + 1


@pytest.mark.parametrize("path", ["C++", "Python"])
def test_calls_under_a_dispatch_mode_are_torchs(served, path):
    """Under a TorchDispatchMode (FakeTensorMode here) the mode sees torch's op; no plan launches (the output
    allocated there has no memory)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    dispatcher, a, b = served
    if path == "Python":
        dispatcher.native = None
    before = _launches(dispatcher)
    with FakeTensorMode(allow_non_fake_inputs=True):
        y = ops.matmul_with(dispatcher, a, b)
    assert tuple(y.shape) == (8, 8) and type(y).__name__ == "FakeTensor"
    assert _launches(dispatcher) == before


def test_a_call_under_a_torch_function_mode_is_still_served(served):
    """`with torch.device(...)` is a torch function mode, which sees the call to l2c rather than torch's ops: the
    C++ table leaves the call to the Python path, which serves it."""
    dispatcher, a, b = served
    before = _launches(dispatcher)
    with torch.device("cpu"):
        y = ops.matmul_with(dispatcher, a, b)
    assert _launches(dispatcher) == before + 1 and tuple(y.shape) == (8, 8)


def test_a_program_ends_without_waiting_for_another_process_building_the_call_table(tmp_path):
    """Another process holds the C++ call table's build lock (its g++ run takes tens of seconds on a fresh
    machine: every rank of a multi-process job but one waits on it): a program that started the build and ends
    meanwhile exits at once, as when it waits on its own compile (l2c.background)."""
    import os
    import sys
    import textwrap
    import time
    env = dict(os.environ, L2C_CACHE_DIR=str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import importlib.machinery, sys, time, torch
        from l2c import cache, native_call
        digest = cache.content_hash(native_call.SOURCE, native_call.find_cxx_compiler(), torch.__version__,
                                    sys.version)[:20]
        library = cache.cache_dir("native") / f"l2c_call_table_{digest}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
        with cache.locked(library):
            print("held", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-c", "from l2c import native_call; import time; "
                               "native_call.start_build(); time.sleep(0.5)"], env=env, timeout=120)
        assert done.returncode == 0 and time.monotonic() - start < 20
    finally:
        holder.kill()
        holder.wait()
