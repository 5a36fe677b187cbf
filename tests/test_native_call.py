"""The C++ served-call table (l2c.targets.cutlass.native), built with the real host C++ compiler against this torch.

Its plans' entry point is a real C function (the `recorder` fixture of conftest.py) that records what it received,
so the pointers, the stream, the output's allocation and every way a call can miss or be declined are checked on
CPU tensors; on the GPU the same table launches CUTLASS libraries (scripts/served_path.py measures it there).
"""
from __future__ import annotations

import ctypes
import subprocess

import pytest
import torch
from hypothesis import given, settings, strategies as st

from l2c.targets.cutlass import native, shim

pytestmark = pytest.mark.skipif(native.find_cxx_compiler() is None or shim.find_c_compiler() is None,
                                reason="no host C/C++ compiler")


@pytest.fixture(scope="module")
def table_type():
    assert native.build_now(timeout=600), native.failure()
    return native.new_table


class Plan:
    """A call plan with an m x n output whose entry point is the recorder, which returns its M ^ N arguments as
    the status: the plan passes M = N = m (success), or M = m, N = m + 4 with `fail` (an error status)."""

    def __init__(self, recorder, m, n, dtype=torch.float16, transposed=False, fail=False):
        from l2c.kernel import output_template
        self.struct = shim.make_plan(recorder.record, (m, m + 4 if fail else m, 64, 1, 64, 0, n, 0, n, 0, n, 0, 4096,
                                                       256))
        self.stored = (n, m) if transposed else (m, n)
        self.template = output_template(self.stored, dtype, torch.device("cpu"))
        self.transposed = transposed

    def add(self, table, a, b, bias=None, activation=0, device=0):
        table.add(a, b, bias, activation, self.struct, ctypes.addressof(self.struct), self.template, self.transposed,
                  device)


def operands(m=8, n=8, k=64, dtype=torch.float16):
    return torch.zeros(m, k, dtype=dtype), torch.zeros(k, n, dtype=dtype), torch.zeros(n, dtype=dtype)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_registered_call_launches_its_plan_with_this_calls_pointers(table_type, recorder, transposed):
    table = table_type()
    plan = Plan(recorder, 8, 8, transposed=transposed)
    a, b, bias = operands()
    plan.add(table, a, b, bias)
    assert table.size() == 1
    a2, b2, bias2 = operands()                       # the same signature, other tensors
    out = table.matmul(a2, b2, bias2, 0, 0, 0xC0FFEE)
    assert tuple(out.shape) == (8, 8) and out.dtype == torch.float16
    assert out.is_contiguous() == (not transposed) and out.mT.is_contiguous() == transposed
    seen = [recorder.recorded(i) for i in range(20)]
    assert seen[:5] == [a2.data_ptr(), b2.data_ptr(), 0, bias2.data_ptr(), out.data_ptr()]
    assert seen[5:9] == [8, 8, 64, 1] and seen[19] == 0xC0FFEE
    assert table.matmul(a2, b2, bias2, 0, 0, 1).data_ptr() != out.data_ptr()   # each call its own output


def test_the_call_declines_where_the_python_path_must_decide(table_type, recorder):
    """A misaligned pointer, another current device, autograd recording, or an error status: None."""
    table, kept = table_type(), Plan(recorder, 8, 8)
    a, b, bias = operands()
    kept.add(table, a, b, bias)
    skewed = torch.zeros(8 * 64 + 1, dtype=torch.float16)[1:].view(8, 64)
    assert table.matmul(skewed, b, bias, 0, 0, 0) is None
    assert table.matmul(a, b, bias, 0, 1, 0) is None                        # the plan is device 0's
    w, plan = b.clone().requires_grad_(), Plan(recorder, 8, 8)
    plan.add(table, a, w, bias)
    assert table.matmul(a, w, bias, 0, 0, 0) is None                        # autograd records this call
    with torch.no_grad():
        assert table.matmul(a, w, bias, 0, 0, 0) is not None
    failing, plan = table_type(), Plan(recorder, 8, 8, fail=True)
    plan.add(failing, a, b, bias)
    assert failing.matmul(a, b, bias, 0, 0, 0) is None


CHANGES = ["a rows", "a stride", "a dtype", "b cols", "b layout", "bias absent", "bias length", "activation"]


@settings(max_examples=40, deadline=None)
@given(change=st.sampled_from(CHANGES))
def test_a_call_of_any_other_signature_misses(table_type, recorder, change):
    """The key is the call signature (shapes, strides, dtypes, devices of A, B, bias) and the activation: a call
    that differs in any of them is not this plan's."""
    table, plan = table_type(), Plan(recorder, 16, 8)
    a, b, bias = operands(16, 8)
    plan.add(table, a, b, bias, activation=1)
    assert table.matmul(a, b, bias, 1, 0, 0) is not None
    other = {"a rows": lambda: (torch.zeros(24, 64, dtype=torch.float16), b, bias, 1),
             "a stride": lambda: (torch.zeros(16, 128, dtype=torch.float16)[:, :64], b, bias, 1),
             "a dtype": lambda: (a.to(torch.bfloat16), b.to(torch.bfloat16), bias.to(torch.bfloat16), 1),
             "b cols": lambda: (a, torch.zeros(64, 16, dtype=torch.float16), bias, 1),
             "b layout": lambda: (a, torch.zeros(8, 64, dtype=torch.float16).t(), bias, 1),
             "bias absent": lambda: (a, b, None, 1),
             "bias length": lambda: (a, b, torch.zeros(16, dtype=torch.float16)[::2], 1),   # same length, stride 2
             "activation": lambda: (a, b, bias, 0)}[change]()
    assert table.matmul(*other, 0, 0) is None


def test_a_linear_call_is_the_matmul_of_the_transposed_weight_with_any_leading_dimensions(table_type, recorder):
    table = table_type()
    x = torch.zeros(2, 3, 64, dtype=torch.float16)
    weight = torch.zeros(8, 64, dtype=torch.float16)
    plan = Plan(recorder, 6, 8)
    plan.add(table, x.reshape(-1, 64), weight.t())                   # as Dispatcher.linear registers it
    y = table.linear(x, weight, None, 0, 0, 0)
    assert tuple(y.shape) == (2, 3, 8)
    assert [recorder.recorded(i) for i in (0, 1, 4)] == [x.data_ptr(), weight.data_ptr(), y.data_ptr()]
    assert table.linear(x.transpose(0, 1), weight, None, 0, 0, 0) is None   # not contiguous: the Python path
    assert table.matmul(x.reshape(-1, 64), weight.t(), None, 0, 0, 0) is not None


def test_the_dispatcher_serves_a_registered_plan_from_the_table(table_type, recorder, monkeypatch):
    """`Dispatcher._remember_served` puts a CUTLASS launcher's plan in its C++ table, and `l2c.matmul`'s path
    (`ops.matmul_with`) is then served by it. The current device and stream are stand-ins: no CUDA here."""
    from l2c import dispatch, ops
    from l2c.dispatch import Dispatcher, TunedEntry, TunedTable
    from l2c.kernel import call_signature
    from l2c.ir import KernelSpec
    from tests.test_cutlass_shim import _bound_kernel
    monkeypatch.setattr(dispatch, "_get_device", lambda: 0)
    monkeypatch.setattr(dispatch, "_get_stream", lambda device: 0xBEEF)
    spec = KernelSpec(name="k", target="cutlass").to_l2()
    entry = TunedEntry(m=8, n=8, k=64, batch=1, dtype="f16", layout="row,row,row", target="cutlass",
                       spec_text=spec, tflops=2.0, baseline_tflops=1.0)
    dispatcher = Dispatcher(TunedTable([entry]), allow_cpu=True)
    kernel = _bound_kernel(recorder, 8, 8)
    a, b, _ = operands()
    sig = call_signature(a, b, None)
    kernel._plans = {sig: kernel._plans["sig"]}
    dispatcher._remember_served((sig, None), kernel, a, b, None)
    assert dispatcher.native is not None and dispatcher.native.size() == 1
    y = ops.matmul_with(dispatcher, a, b)
    assert tuple(y.shape) == (8, 8) and dispatcher.stats["tuned"] == 1
    assert recorder.recorded(0) == a.data_ptr() and recorder.recorded(19) == 0xBEEF
    # the custom op a compiled graph calls runs the same path
    monkeypatch.setattr(dispatch, "_default", dispatcher)
    a2 = a.clone()
    assert tuple(ops._matmul_op(a2, b, None, "none").shape) == (8, 8) and dispatcher.stats["tuned"] == 2
    assert recorder.recorded(0) == a2.data_ptr()


def test_without_a_cxx_compiler_served_calls_keep_the_python_path(tmp_path):
    """No C++ compiler (or no torch headers): the build fails once with a warning that says why, no table is made,
    and the dispatcher keeps serving through its Python path; `L2C_NATIVE_CALL=0` never builds."""
    import os
    import sys
    code = ("import warnings\nfrom l2c.targets.cutlass import native\n"
            "with warnings.catch_warnings(record=True) as w:\n    warnings.simplefilter('always')\n"
            "    print(native.build_now(), native.new_table() is None, repr(native.failure()),"
            " any('Python path' in str(x.message) for x in w))\n")
    env = dict(os.environ, L2C_CACHE_DIR=str(tmp_path), CXX="", PATH=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ", 2)[:2] == ["False", "True"]
    assert "no C++ compiler" in done.stdout and done.stdout.strip().endswith("True")
    off = subprocess.run([sys.executable, "-c", "from l2c.targets.cutlass import native\n"
                          "print(native.build_now(), native.failure())"],
                         capture_output=True, text=True, env=dict(os.environ, L2C_NATIVE_CALL="0",
                                                                  L2C_CACHE_DIR=str(tmp_path)))
    assert off.stdout.split() == ["False", "None"] and not list(tmp_path.glob("native/*.so"))
