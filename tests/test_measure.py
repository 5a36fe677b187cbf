"""Protocol scheduling on the CPU device with real interpreter-run Triton kernels (built by l2c.build).

The CPU device differs from the GPU one only in its clock/sync/sleep; the scheduling and statistics
under test are the code that runs on the H200.
"""
import random
import statistics
import time

import pytest
import torch
from hypothesis import given, settings, strategies as st

from l2c.build import build
from l2c.measure import Problem, TorchMatmul, balanced_orders, measure, measure_call, measure_kernel, paired_speedup
from l2c.results_file import parse_protocols
from l2c.devices import CpuDevice
from l2c.parser import parse_one
from l2c.validate import validate

TINY = """
kernel tiny {
  target   triton
  problem  m=any n=any k=any
  types    a=f16 b=f16 c=f16 acc=f32
  tile     m=16 n=16 k=16
  swizzle  group=1
}
"""


@pytest.fixture(scope="module")
def kernel():
    return build(validate(parse_one(TINY), "triton"))


class Recorder:
    """Calls `fn` and logs (side, checksum of A, data pointer of A, out given) for every call."""

    def __init__(self, side, fn, log):
        self.side, self.fn, self.log = side, fn, log

    def __call__(self, a, b, c=None, bias=None, out=None):
        self.log.append((self.side, float(a.float().sum()), a.data_ptr(), out is not None))
        return self.fn(a, b, c=c, bias=bias, out=out)


def _sides(kernel, problem, log):
    return Recorder("candidate", kernel, log), Recorder("baseline", TorchMatmul(problem), log)


def test_call_protocol_interleaves_randomly_on_fresh_inputs(kernel):
    problem = Problem(16, 16, 16)
    log = []
    cand, base = _sides(kernel, problem, log)
    iters, warmup = 12, 2
    t = measure_call(cand, base, problem, CpuDevice(), iters=iters, warmup=warmup, rng=random.Random(3))
    assert len(t.candidate_samples) == len(t.baseline_samples) == iters
    assert [s for s, *_ in log].count("candidate") == [s for s, *_ in log].count("baseline") == warmup + iters
    timed = log[2 * warmup:]
    pairs = [timed[i:i + 2] for i in range(0, len(timed), 2)]
    assert all({p[0][0], p[1][0]} == {"candidate", "baseline"} for p in pairs)
    assert [p[0][0] for p in pairs] == t.order
    assert {"candidate", "baseline"} == set(t.order)                       # both orders occur
    assert all(p[0][1] == p[1][1] for p in pairs)                          # same inputs for both sides
    assert len({p[0][1] for p in pairs}) == iters                          # fresh inputs every iteration
    assert not any(given_out for *_, given_out in timed)                   # the call allocates its output
    flops = problem.flops
    assert t.candidate_tflops == pytest.approx(statistics.fmean(flops / s / 1e12 for s in t.candidate_samples))
    assert t.speedup == pytest.approx(t.candidate_tflops / t.baseline_tflops)


@settings(max_examples=30, deadline=None)
@given(iters=st.integers(1, 40), seed=st.integers(0, 1000))
def test_each_side_goes_first_in_half_the_repetitions(iters, seed):
    """The side that runs first after fresh inputs pays for it (5-10% on small shapes in `call` on the H200), so
    neither protocol may favour a side: each is first in half of the repetitions, the candidate in one more when
    their number is odd."""
    problem = Problem(16, 16, 16)
    base = TorchMatmul(problem)
    order = measure_call(base, base, problem, CpuDevice(), iters=iters, warmup=0, seed=seed).order
    assert order.count("candidate") == iters - iters // 2 and order.count("baseline") == iters // 2
    pairs = balanced_orders(random.Random(seed), iters)
    assert all(sorted(p) == ["baseline", "candidate"] for p in pairs)


def test_order_is_random_but_reproducible(kernel):
    problem = Problem(16, 16, 16)
    base = TorchMatmul(problem)
    orders = [measure_call(base, base, problem, CpuDevice(), iters=16, warmup=0, seed=s).order for s in (1, 1, 2)]
    assert orders[0] == orders[1] and orders[0] != orders[2]


def test_warm_up_is_not_timed():
    """A candidate whose first calls are slow (a compile, a clock ramp) must not show it in the samples."""
    problem = Problem(8, 8, 8)
    base = TorchMatmul(problem)
    calls = []

    def slow_start(a, b, c=None, bias=None, out=None):
        calls.append(1)
        if len(calls) <= 2:
            time.sleep(0.2)
        return base(a, b, out=out)

    t = measure_call(slow_start, base, problem, CpuDevice(), iters=5, warmup=2)
    assert max(t.candidate_samples) < 0.1
    calls.clear()
    t = measure_kernel(slow_start, base, problem, CpuDevice(), reps=3, warmup=2)
    assert max(t.candidate_samples) < 0.1


def test_kernel_protocol_rotates_buffers_and_times_both_sides_alike(kernel):
    problem = Problem(16, 16, 16)
    log = []
    cand, base = _sides(kernel, problem, log)
    footprint = problem.footprint_bytes()
    assert footprint == 3 * 16 * 16 * 2
    device = CpuDevice(l2_bytes=2 * footprint)          # rotate over 2 * L2 / footprint = 4 buffer sets
    t = measure_kernel(cand, base, problem, device, reps=3, warmup=1, rng=random.Random(0))
    assert t.details["buffer_sets"] == 4 and t.details["method"] == "eager"
    launches = t.details["launches_per_rep"]
    assert launches >= 4
    assert len(t.candidate_samples) == len(t.baseline_samples) == 3
    for side in ("candidate", "baseline"):
        calls = [c for c in log if c[0] == side]
        assert len({ptr for _, _, ptr, _ in calls}) == 4                  # every buffer set is used
        # warm-up + calibration + one untimed pass + timed repetitions, the same on both sides
        assert len(calls) == 1 + 1 + launches + 3 * launches
        assert all(given_out for *_, given_out in calls)                  # preallocated, rotated outputs
    assert t.candidate_s == statistics.median(t.candidate_samples)
    assert t.speedup == pytest.approx(statistics.median(
        b / c for c, b in zip(t.candidate_samples, t.baseline_samples)))


def test_torch_writes_into_out_only_where_its_op_takes_out():
    """A kernel with an epilogue writes into the preallocated output; torch's side then allocates its result, as an
    eager user's epilogue does, rather than adding a copy into `out` that only its side would pay. A plain GEMM is
    torch.matmul(out=) on both sides."""
    epilogue = TINY.replace("swizzle  group=1", "swizzle  group=1\n  epilogue bias=col activation=relu")
    for text, problem, torch_out in ((TINY, Problem(16, 16, 16), True),
                                     (epilogue, Problem(16, 16, 16, bias="col", activation="relu"), False)):
        log = []
        cand, base = _sides(build(validate(parse_one(text), "triton")), problem, log)
        measure_kernel(cand, base, problem, CpuDevice(l2_bytes=2 * problem.footprint_bytes()), reps=2, warmup=1)
        assert all(given for side, *_, given in log if side == "candidate")
        assert {given for side, *_, given in log if side == "baseline"} == {torch_out}


def test_kernel_apart_launches_a_torch_kernel_before_every_timed_launch_and_takes_its_time_off(kernel):
    """`kernel_apart`: each launch of either side follows torch's one-element add, and a batch of those adds alone
    is timed in every repetition and taken off both sides (counted here with torch's profiler on the CPU)."""
    problem = Problem(16, 16, 16)
    log = []
    cand, base = _sides(kernel, problem, log)
    device = CpuDevice(l2_bytes=2 * problem.footprint_bytes())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t = measure("kernel_apart", cand, base, problem, device, reps=3, warmup=1)
    launches = t.details["launches_per_rep"]
    assert t.protocol == "kernel_apart" and t.details["spacer_s"] > 0
    adds = sum(e.count for e in prof.key_averages() if e.key == "aten::add_")
    # two sides and the spacers' own batch, each in one untimed pass and three repetitions
    assert adds == 3 * (1 + 3) * launches
    for side in ("candidate", "baseline"):
        assert len([c for c in log if c[0] == side]) == 1 + 1 + launches + 3 * launches
    assert all(s > 0 for s in t.candidate_samples + t.baseline_samples)


@pytest.mark.parametrize("protocol", ["kernel", "kernel_apart", "call"])
def test_a_slower_candidate_measures_slower(protocol):
    """The ratio's direction: a candidate that does the same work plus 3 ms must lose clearly."""
    problem = Problem(8, 8, 8)
    base = TorchMatmul(problem)

    def slower(a, b, c=None, bias=None, out=None):
        time.sleep(0.003)
        return base(a, b, out=out)

    t = measure(protocol, slower, base, problem, CpuDevice(), reps=3, iters=5, warmup=1)
    assert t.speedup < 0.5
    assert t.candidate_s > 0.003 > t.baseline_s


def test_server_protocol_sleeps_between_calls_but_does_not_time_the_gaps():
    problem = Problem(8, 8, 8)
    base = TorchMatmul(problem)
    start = time.perf_counter()
    t = measure("server", base, base, problem, CpuDevice(), iters=4, warmup=1, rate=25.0)
    wall = time.perf_counter() - start
    assert t.protocol == "server" and t.details["rate_per_s"] == 25.0
    assert wall >= 8 * t.details["mean_gap_s"]                     # 8 gaps slept (4 iterations x 2 sides)
    assert statistics.fmean(t.candidate_samples + t.baseline_samples) < t.details["mean_gap_s"]


def test_baseline_follows_the_spec_epilogue_and_layouts():
    spec = parse_one("""
kernel e { problem m=any n=any k=any
  types a=f32 b=f32 c=f32 acc=f32 math=ieee
  layout a=col b=row c=col
  epilogue alpha=0.5 beta=2.0 bias=row activation=relu }""")
    problem = Problem.from_spec(spec, 5, 7, 3)
    from l2c.measure import make_operands
    x = make_operands(problem, CpuDevice(), 1, seed=0)[0]
    assert x.a.stride(-2) == 1 and x.out.stride(-2) == 1           # column-major as the spec says
    got = TorchMatmul(problem)(x.a, x.b, c=x.c, bias=x.bias, out=x.out)
    want = torch.relu(0.5 * (x.a @ x.b) + 2.0 * x.c + x.bias[:, None])
    assert got is x.out and torch.allclose(got, want, atol=1e-5)


def test_parse_protocols():
    assert parse_protocols("kernel, call,kernel") == ["kernel", "call"]
    with pytest.raises(ValueError, match="warm"):
        parse_protocols("kernel,warm")


@settings(max_examples=200, deadline=None)
@given(clocks=st.lists(st.sampled_from([1.0, 1.12, 1.3]), min_size=1, max_size=15),
       ratio=st.floats(0.5, 2.0), seconds=st.floats(1e-6, 1e-2))
def test_kernel_speedup_is_immune_to_clock_changes_between_repetitions(clocks, ratio, seconds):
    """Each repetition times both sides at one clock; whatever the clock does between repetitions, the figure is
    the true ratio (a ratio of per-side medians is not: it can pair fast samples of one side with slow ones of
    the other)."""
    candidate = [seconds * f for f in clocks]
    baseline = [seconds * ratio * f for f in clocks]
    assert paired_speedup(candidate, baseline) == pytest.approx(ratio)
