"""l2c's checker (l2c.checker): which kernels it may verify on a caller's thread, that its CUDA source builds with
real nvcc into the entry points the Python side binds, that a machine without nvcc loads it from the shipped
pack, and that the totals its comparison returns are judged as l2c.verify judges (`verify.verdict`). Its verdicts
on real kernels against l2c.verify, with faults injected, need a GPU: scripts/checker_check.py (`python scripts/gpu.py
check`)."""
from __future__ import annotations

import ctypes
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from l2c import checker
from l2c.ir import KernelSpec
from l2c.targets.cutlass.build import compile_source, loads_without_compiler
from tests.strategies import specs
from tests.toolchain import needs_nvcc

PLAIN = KernelSpec(name="plain", target="cutlass", types_a="f16", types_b="f16", types_c="f16")


def test_plain_epilogues_are_checkable():
    assert checker.checkable(PLAIN, 128, 4096, 4096)
    for bias in ("row", "col"):
        assert checker.checkable(PLAIN.replace(epilogue_bias=bias, epilogue_alpha=0.5), 1, 256, 64)
    bf16 = PLAIN.replace(types_a="bf16", types_b="bf16", types_c="bf16")
    assert checker.checkable(bf16, 7, 100, 33) and checker.checkable(bf16.replace(types_c="f32"), 7, 100, 33)


@pytest.mark.parametrize("change", [dict(epilogue_activation="gelu"), dict(epilogue_beta=1.0),
                                    dict(epilogue_gate="silu"), dict(types_a="f32", types_b="f32", types_c="f32"),
                                    dict(problem_batch=4)])
def test_what_the_checker_does_not_implement_goes_to_the_worker(change):
    assert not checker.checkable(PLAIN.replace(**change), 64, 64, 64)


def test_problems_too_large_for_a_callers_thread_go_to_the_worker():
    assert checker.checkable(PLAIN, 1024, 4096, 4096)                      # 2^34 multiply-adds
    assert not checker.checkable(PLAIN, 1025, 4096, 4096)                  # more
    assert not checker.checkable(PLAIN, 1, 16384, 16384 + 64)              # operands over 256 MiB
    assert not checker.checkable(PLAIN, 0, 64, 64)


@settings(max_examples=200, deadline=None)
@given(specs(), st.integers(1, 4096), st.integers(1, 4096), st.integers(1, 8192))
def test_a_checkable_spec_is_one_whose_checks_the_checker_makes(spec, m, n, k):
    """The checker's reference is alpha * a @ b + bias over 16-bit inputs with a float32 product: a spec outside
    that (an activation, a C input, a gate, float32 inputs whose TF32 bound it does not model) is never checkable."""
    if checker.checkable(spec, m, n, k):
        assert spec.types_a in ("f16", "bf16") and spec.types_b == spec.types_a
        assert spec.epilogue_activation == "none" and spec.epilogue_beta == 0.0 and spec.epilogue_gate == "none"
        assert m * n * k <= checker.MAX_MACS


@needs_nvcc
def test_the_checker_builds_with_nvcc_and_exports_its_entry_points(tmp_path, monkeypatch):
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("L2C_PACK", str(tmp_path / "no-pack.zip"))   # compiled here, not installed
    assert not loads_without_compiler(checker.source(), checker.NAME)
    library = compile_source(checker.source(), checker.NAME)
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
    for name in ("fill", "changed", "poison", "unpoisoned", "compare", "point"):
        assert f"l2c_checker_{name}" in symbols
    checker._bind(ctypes.CDLL(str(library)))   # every entry point the Python side binds (loads without a GPU)
    assert loads_without_compiler(checker.source(), checker.NAME)


def test_without_nvcc_the_checker_loads_from_the_shipped_pack(tmp_path, monkeypatch):
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("L2C_NVCC", str(tmp_path / "no-nvcc-here"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(checker, "_library", None)
    assert loads_without_compiler(checker.source(), checker.NAME)
    assert checker.prepare(compile_if_needed=False)
    assert list((tmp_path / "cache" / "cutlass").glob(f"{checker.NAME}_*.so"))


def test_verify_without_the_library_is_unavailable_not_a_verdict(tmp_path, monkeypatch):
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("L2C_PACK", str(tmp_path / "no-pack.zip"))
    monkeypatch.setenv("L2C_NVCC", str(tmp_path / "no-nvcc-here"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(checker, "_library", None)
    with pytest.raises(checker.CheckerUnavailable):
        checker.verify(object(), 64, 64, 64)


class _HandCheck:
    """What the checker's comparison kernel (GPU only) returns for one output, written out by hand: `_judge` turns
    it into `l2c.verify`'s verdict, which is what this checks."""

    def __init__(self, spec, m, n, totals, point=(0.0, 1.0, 0.0)):
        self.spec, self.m, self.n, self.totals, self.values = spec, m, n, totals, point

    def compare(self, out):
        return self.totals

    def point(self, out, i, j):
        return self.values


def _totals(worst=0.5, index=0, nans=0, first_nan=0, nonfinite=0, diff2=1e-8, ref2=1.0, bound2=1e-4):
    import struct
    bits = struct.unpack("<I", struct.pack("<f", worst))[0]
    return checker._Totals(worst=(bits << 32) | index, nan_count=nans, first_nan=first_nan, nonfinite=nonfinite,
                           diff2=diff2, ref2=ref2, bound2=bound2)


def test_the_checkers_totals_are_judged_as_verify_judges():
    tol = 1e-2
    judge = lambda totals, point=(0.0, 1.0, 0.0): checker._judge(_HandCheck(PLAIN, 4, 8, totals, point), None, tol, "")
    assert judge(_totals()).ok
    worst = judge(_totals(worst=3.0, index=2 * 8 + 5), point=(1.5, 0.25, 2.25))
    assert not worst.ok and worst.reason.startswith("element (2, 5) is 2.25, expected 1.5: off by 0.75, 3 times its "
                                                    "elementwise bound 0.25")
    norm = judge(_totals(diff2=1.0, ref2=1.0))   # 100% error: over tol even with the cancellation allowance
    assert not norm.ok and norm.reason.startswith("relative error 1 exceeds tolerance 0.01; worst element")
    nan = judge(_totals(nans=3, first_nan=9))
    assert not nan.ok and nan.reason == "unwritten output (NaN) at element (1, 1) (3 of 32)"
    overflow = judge(_totals(nonfinite=1))
    assert not overflow.ok and overflow.reason == "non-finite output or reference (overflow?)"
