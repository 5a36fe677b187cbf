"""The CUTLASS call-plan shim (l2c.targets.cutlass.shim), compiled with the real host C compiler.

The shim forwards a plan's 14 fixed arguments plus five per-call ones to a 20-argument entry point with the
ABI of `l2c_<name>_run` (templates/cutlass/gemm.cu.j2). Here the entry point is a real C function compiled
beside it that records what it received (the `recorder` fixture of conftest.py), so every field's position, width
and sign is checked; the test in test_cutlass_build.py calls a real CUTLASS library through the shim.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from l2c import cache
from l2c.targets.cutlass import shim as cutlass_shim

pytestmark = pytest.mark.skipif(cutlass_shim.find_c_compiler() is None, reason="no host C compiler")

INT = st.integers(-2**31, 2**31 - 1)
I64 = st.integers(-2**63, 2**63 - 1)
PTR = st.integers(1, 2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(ints=st.tuples(INT, INT, INT, INT), strides=st.tuples(*[I64] * 8), workspace=st.one_of(st.just(0), PTR),
       workspace_bytes=st.integers(0, 2**64 - 1), own_workspace=st.one_of(st.none(), PTR), a=PTR, b=PTR,
       bias=st.one_of(st.none(), PTR), d=PTR, stream=PTR)
def test_the_shim_forwards_every_argument_to_the_entry_point(recorder, ints, strides, workspace, workspace_bytes,
                                                              own_workspace, a, b, bias, d, stream):
    """Every fixed field in its place; the workspace is the plan's, or where the plan holds none, the call's own."""
    run = cutlass_shim.planned_call()
    assert run is not None
    arguments = (*ints, *strides, workspace, workspace_bytes)
    plan = cutlass_shim.make_plan(recorder.record, arguments)
    status = run(ctypes.addressof(plan), a, b, bias, d, own_workspace, stream)
    assert status == ints[0] ^ ints[1]
    seen = [recorder.recorded(i) for i in range(20)]
    expected = [a, b, 0, bias or 0, d, *ints, *strides, workspace or own_workspace or 0, workspace_bytes, stream]
    assert seen == [x % 2**64 for x in expected]


CAPTURE_IDS = itertools.count(1)   # the driver numbers a process's captures once each
EVENTS = st.lists(st.sampled_from(["launch", "launch", "other kernel", "join", "begin capture", "end capture"]),
                  max_size=40)


def expected_overlaps(events, library_on, switched):
    """Each launch's overlap by the shim's rule: the library's setting, except inside a capture where the launch
    would not follow this thread's previous launch alone (then off); a plan without the switch keeps the setting."""
    capturing, after_own, expected = False, False, []
    for event in events:
        if event == "launch":
            expected.append(int(library_on and (not switched or not capturing or after_own)))
            after_own = capturing
        elif event == "begin capture" and not capturing:
            capturing, after_own = True, False
        elif event == "end capture" and capturing:
            capturing, after_own = False, False
        elif event in ("other kernel", "join"):
            after_own = False
    return expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=EVENTS, library_on=st.booleans(), switched=st.booleans())
@example(events=["begin capture", "launch", "end capture", "begin capture", "other kernel", "launch"],
         library_on=True, switched=True)   # the second graph's first node has the handle of the first one's launch
def test_a_captured_launch_overlaps_only_the_previous_launch_of_a_plan(capture_stand_in, events, library_on,
                                                                      switched):
    """Programmatic dependent launch inside a CUDA-graph capture only right after l2c's own launch: after another
    kernel, two joined streams or at a capture's start the plan launches without it, and the library's setting is
    back as it was after every launch; eager launches keep the setting, and a plan without the switch (a kernel
    that does not overlap by default) is never switched."""
    lib = capture_stand_in
    lib.reset(int(library_on))
    run = cutlass_shim.planned_call()
    plan = cutlass_shim.make_plan(lib.launch, (8, 8, 64, 1, 64, 0, 8, 0, 8, 0, 8, 0, 4096, 256),
                                  lib.set_overlap if switched else None)
    capturing = False
    for event in events:
        if event == "launch":
            assert run(ctypes.addressof(plan), 16, 32, None, 48, None, 7) == 0
            assert lib.overlap_now() == int(library_on)
        elif event == "begin capture" and not capturing:
            capturing = True
            lib.begin_capture(next(CAPTURE_IDS))
        elif event == "end capture" and capturing:
            capturing = False
            lib.end_capture()
        elif event in ("other kernel", "join"):
            getattr(lib, event.replace(" ", "_"))()
    assert [lib.overlap_of(i) for i in range(lib.launches_seen())] == expected_overlaps(events, library_on, switched)


def test_a_launch_on_the_legacy_default_stream_asks_nothing(capture_stand_in):
    """Stream 0 (torch's default stream, where eager calls usually run) cannot be captured, so the shim makes no
    driver query there and the library's setting stands, whatever the query would have said."""
    lib = capture_stand_in
    plan = cutlass_shim.make_plan(lib.launch, (8, 8, 64, 1, 64, 0, 8, 0, 8, 0, 8, 0, 4096, 256), lib.set_overlap)
    lib.begin_capture(next(CAPTURE_IDS))   # what the stand-in would answer for any stream
    lib.other_kernel()
    run = cutlass_shim.planned_call()
    assert run(ctypes.addressof(plan), 16, 32, None, 48, None, None) == 0
    assert run(ctypes.addressof(plan), 16, 32, None, 48, None, 7) == 0
    assert [lib.overlap_of(i) for i in range(lib.launches_seen())] == [1, 0]


def test_threads_capturing_at_once_leave_the_library_setting_as_it_was(capture_stand_in):
    """The overlap switch belongs to the library, shared by every thread: launches captured on several threads at
    once, each after a node not its own, each launch without the overlap, leave the library set as before (a
    switch-off / restore pair of one thread interleaved with another's would leave it off for good)."""
    import threading
    lib = capture_stand_in
    lib.joined_and_slow(200)
    plan = cutlass_shim.make_plan(lib.launch, (8, 8, 64, 1, 64, 0, 8, 0, 8, 0, 8, 0, 4096, 256), lib.set_overlap)
    run = cutlass_shim.planned_call()   # ctypes releases the GIL for the call: the launches overlap in time

    def launches():
        for _ in range(25):
            assert run(ctypes.addressof(plan), 16, 32, None, 48, None, 7) == 0

    threads = [threading.Thread(target=launches) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert lib.launches_seen() == 100
    assert [lib.overlap_of(i) for i in range(100)] == [0] * 100
    assert lib.overlap_now() == 1


def test_make_plan_refuses_a_wrong_argument_count(recorder):
    with pytest.raises(ValueError, match="14 arguments"):
        cutlass_shim.make_plan(recorder.record, (1, 2, 3))


def test_the_shim_is_cached_and_rebuilt_from_its_source(tmp_path, monkeypatch):
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    cutlass_shim.shim_library.cache_clear()
    try:
        assert cutlass_shim.planned_call() is not None
        built = list((tmp_path / "native").glob("cutlass_call_plan_*.so"))
        assert len(built) == 1
    finally:
        cutlass_shim.shim_library.cache_clear()


def test_a_truncated_shim_is_rebuilt_not_loaded(tmp_path):
    """A cached shim cut short used to be dlopen'ed at l2c.dispatch's start-up, and every process importing l2c died
    of SIGBUS. In a child process, so that a crash fails this test rather than ending the run."""
    script = ("import sys; from l2c.targets.cutlass import shim; lib = shim.shim_library(); "
              "print(lib is not None, sorted(p.stat().st_size for p in (shim.cache.cache_dir('native')).glob('*.so')))")
    env = {**os.environ, "L2C_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and first.stdout.startswith("True"), first.stderr
    (library,) = (tmp_path / "native").glob("cutlass_call_plan_*.so")
    whole = library.read_bytes()
    library.write_bytes(whole[:len(whole) // 2])
    again = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, (again.returncode, again.stderr)
    assert again.stdout.startswith("True") and library.read_bytes() != whole[:len(whole) // 2]
    assert cache.intact_library(library)


def test_without_a_compiler_kernels_keep_the_direct_call(tmp_path, monkeypatch):
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", str(tmp_path))    # no cc, no gcc
    cutlass_shim.shim_library.cache_clear()
    try:
        assert cutlass_shim.planned_call() is None
    finally:
        cutlass_shim.shim_library.cache_clear()


def _bound_kernel(recorder, m, n, transposed=False, workspace_per_call=0):
    """A CUTLASS kernel object holding one call plan whose entry point is the recorder (a real C function through
    the real shim): the plan holds a workspace pointer (4096), or with `workspace_per_call` bytes none. The device
    queries are stand-ins: this machine has no CUDA device to ask."""
    import torch
    from l2c.kernel import output_template
    from l2c.targets.cutlass.kernel import CutlassKernel, _CallPlan
    kernel = object.__new__(CutlassKernel)
    workspace = (0, workspace_per_call) if workspace_per_call else (4096, 256)
    arguments = (m, n, 64, 1, 64, 0, n, 0, n, 0, n, 0, *workspace)
    native = cutlass_shim.make_plan(recorder.record, arguments)
    stored = (n, m) if transposed else (m, n)
    plan = _CallPlan(device=0, dtype=torch.float16, stored_shape=stored, transposed=transposed,
                     out_template=output_template(stored, torch.float16, torch.device("cpu")), arguments=arguments,
                     workspace_per_call=workspace_per_call, native=native, native_address=ctypes.addressof(native))
    kernel._plans, kernel._launches = {"sig": plan}, {}
    kernel._run_planned = cutlass_shim.planned_call()
    kernel._empty_like = torch.empty_like
    kernel._get_device, kernel._get_stream = (lambda: 0), (lambda device: 0xC0FFEE)
    kernel._error = lambda status: f"status {status}"
    return kernel


@pytest.mark.parametrize("transposed", [False, True])
def test_a_bound_launcher_passes_this_calls_pointers_and_a_fresh_output(recorder, transposed):
    """`CutlassKernel.launcher`: the plan's closure hands the shim this call's A, B, bias and a freshly allocated
    output of the plan's shape, on the current stream; it declines a misaligned pointer or another device (None),
    and an error status raises (ValueError for the call's own fault)."""
    import torch
    kernel = _bound_kernel(recorder, 8, 8, transposed)          # status m ^ n = 0: success
    assert kernel.launcher("other signature") is None
    launch = kernel.launcher("sig")
    a, b, bias = torch.zeros(8, 64, dtype=torch.float16), torch.zeros(64, 8, dtype=torch.float16), torch.zeros(8)
    out = launch(a, b, bias)
    assert tuple(out.shape) == (8, 8) and out.dtype == torch.float16
    assert out.is_contiguous() == (not transposed) and out.mT.is_contiguous() == transposed
    seen = [recorder.recorded(i) for i in range(20)]
    assert seen[:5] == [a.data_ptr(), b.data_ptr(), 0, bias.data_ptr(), out.data_ptr()] and seen[19] == 0xC0FFEE
    assert seen[17:19] == [4096, 256]                                # the plan's own workspace
    assert launch(a, b, None) is not None and recorder.recorded(3) == 0
    assert launch(a, b, bias).data_ptr() != out.data_ptr() or out is None   # each call its own output
    skewed = torch.zeros(8 * 64 + 1, dtype=torch.float16)[1:].view(8, 64)
    assert launch(skewed, b, bias) is None
    assert kernel.launcher("sig") is launch                          # bound once per plan
    assert kernel.call_planned("sig", a, b, bias) is not None        # the planned call is the same replay
    kernel._get_device = lambda: 1
    kernel._launches.clear()                                        # bound again, with that device query
    assert kernel.launcher("sig")(a, b, bias) is None
    failing = _bound_kernel(recorder, 1, 3).launcher("sig")        # status 1 ^ 3 = 2: the call's fault
    with pytest.raises(ValueError, match="status 2"):
        failing(a, b, bias)
    with pytest.raises(RuntimeError, match="status 6"):
        _bound_kernel(recorder, 2, 4).launcher("sig")(a, b, bias)


def _without_the_shim(kernel, recorder):
    """Make the bound kernel's plan one made while the shim was missing (native_address 0), whose replay calls the
    20-argument entry point (the recorder); returns the plan."""
    plan = kernel._plans["sig"]
    kernel._plans["sig"] = type(plan)(**{**plan.__dict__, "native": None, "native_address": 0})
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    kernel._run = ctypes.CFUNCTYPE(i32, *[vp] * 5, *[i32] * 4, *[i64] * 8, vp, ctypes.c_size_t, vp)(
        ctypes.cast(recorder.record, ctypes.c_void_p).value)
    return plan


@pytest.mark.parametrize("shim", [True, False])
def test_a_plan_without_a_workspace_gives_each_call_its_own(recorder, shim):
    """A kernel that writes a workspace (split-K, stream-K, parallel split-K) keeps no pointer in its plan: each
    replay, through the shim or the 20-argument entry, passes a workspace of the plan's size allocated for that
    call, so calls on two streams never share one (docs/CONTRACTS.md)."""
    import torch
    kernel = _bound_kernel(recorder, 8, 8, workspace_per_call=1040)
    if not shim:
        _without_the_shim(kernel, recorder)
    launch = kernel.launcher("sig")
    a, b = torch.zeros(8, 64, dtype=torch.float16), torch.zeros(64, 8, dtype=torch.float16)
    kept = launch(a, b, None)
    first = recorder.recorded(17)
    assert first != 0 and first % 16 == 0 and recorder.recorded(18) == 1040
    assert first not in (a.data_ptr(), b.data_ptr(), kept.data_ptr())
    held = torch.empty(1040, dtype=torch.uint8)          # memory in use elsewhere is never handed out
    launch(a, b, None)
    assert recorder.recorded(17) not in (0, held.data_ptr()) and recorder.recorded(18) == 1040


def test_without_the_shim_a_bound_launcher_calls_the_20_argument_entry(recorder):
    """A plan made while the shim was missing (native_address 0) replays through the library's own 20-argument
    entry point, with the plan's fixed arguments in their places."""
    import torch
    kernel = _bound_kernel(recorder, 8, 8)
    plan = _without_the_shim(kernel, recorder)
    launch = kernel.launcher("sig")
    assert not hasattr(launch, "native_plan")                         # nothing for the C++ table to replay
    a, b = torch.zeros(8, 64, dtype=torch.float16), torch.zeros(64, 8, dtype=torch.float16)
    out = launch(a, b, None)
    seen = [recorder.recorded(i) for i in range(20)]
    assert seen[:5] == [a.data_ptr(), b.data_ptr(), 0, 0, out.data_ptr()]
    assert seen[5:19] == list(plan.arguments) and seen[19] == 0xC0FFEE
