"""Verification catches small, localized errors (one element, a 3x3 block, one column, edge tiles only) and never
fails a correct kernel: faults are planted into the output of a real kernel or of a torch stand-in that computes
what a correct kernel computes (fp32 sums, f16 sums per K tile, TF32 inputs, the epilogue in fp32)."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from l2c.build import build
from l2c.ir import KernelSpec
from l2c.parser import parse_one
from l2c.validate import validate
from l2c.verify import TORCH_DTYPES, edge_shape, verify

from .strategies import valid_specs


def _valid(text: str, target: str = "triton"):
    return validate(parse_one(text), target)


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """f32 values cut to TF32's 10 mantissa bits (truncated, as tensor cores may do)."""
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32).reshape(x.shape)


class TorchKernel:
    """A correct kernel in the l2c calling convention, computed by torch on the CPU; `fault(out)` corrupts the
    output in place after each call (None: correct)."""

    def __init__(self, valid, fault=None):
        self.valid, self.fault = valid, fault

    def __call__(self, a, b, c=None, bias=None, out=None):
        spec = self.valid.spec
        x, y = a.float(), b.float()
        if spec.types_a == "f32" and spec.types_math == "tf32":
            x, y = _tf32(x), _tf32(y)
        if spec.types_acc == "f16":   # the accumulator rounded to f16 after each K tile, as tl.dot with acc f16
            acc = torch.zeros((*a.shape[:-1], b.shape[-1]), dtype=torch.float16)
            for k0 in range(0, a.shape[-1], spec.tile_k):
                acc = (acc.float() + x[..., k0:k0 + spec.tile_k] @ y[..., k0:k0 + spec.tile_k, :]).half()
            z = acc.float()
        else:
            z = x @ y
        z = spec.epilogue_alpha * z
        if c is not None:
            z = z + spec.epilogue_beta * c.float()
        if bias is not None:
            z = z + (bias.float()[:, None] if spec.epilogue_bias == "row" else bias.float())
        z = {"none": lambda t: t, "relu": torch.relu, "gelu": F.gelu, "silu": F.silu}[spec.epilogue_activation](z)
        if out is None:
            m, n = z.shape[-2:]
            dtype = TORCH_DTYPES[spec.types_c]
            out = (torch.empty((*z.shape[:-2], n, m), dtype=dtype).transpose(-1, -2) if spec.layout_c == "col"
                   else torch.empty(z.shape, dtype=dtype))
        out.copy_(z)
        if self.fault is not None:
            self.fault(out)
        return out


class Faulty:
    """A real built kernel whose output `fault` corrupts after each call."""

    def __init__(self, kernel, fault):
        self.kernel, self.fault, self.valid = kernel, fault, kernel.valid

    def __call__(self, a, b, c=None, bias=None, out=None):
        result = self.kernel(a, b, c=c, bias=bias, out=out)
        self.fault(result)
        return result


def plus_one(out):
    out[out.shape[0] // 2, out.shape[1] // 3] += 1


def negate_one(out):
    out[7, 5] = -out[7, 5]


def zero_block(out):
    out[100:103, 200:203] = 0


def scale_last_column(out):
    out[:, -1] *= 1.1


HGEMM = "kernel h { types a=f16 b=f16 c=f16 tile m=32 n=32 k=32 launch warps=4 }"


def test_one_element_off_by_one_fails_in_a_real_kernel():
    """At 64^3 an element off by 1 moves the relative norm by 2e-3, under the 3e-3 tolerance; the bound sees it."""
    kernel = build(_valid(HGEMM))
    assert verify(kernel, 64, 64, 64, seed=1).ok
    result = verify(Faulty(kernel, plus_one), 64, 64, 64, seed=1)
    assert not result.ok and result.rel_error <= result.tolerance, result
    assert "element (32, 21)" in result.reason and "off by 1" in result.reason, result.reason


@pytest.mark.parametrize("fault, shape", [
    (negate_one, (512, 512, 512)),
    (zero_block, (2048, 2048, 256)),
    (scale_last_column, (2048, 2048, 256)),
], ids=["negated-element", "zeroed-3x3", "last-column-x1.1"])
def test_localized_faults_fail(fault, shape):
    valid = _valid("kernel h { types a=f16 b=f16 c=f16 }")
    assert verify(TorchKernel(valid), *shape, seed=2).ok
    result = verify(TorchKernel(valid, fault), *shape, seed=2)
    assert not result.ok, result
    assert result.rel_error <= result.tolerance, "the norm alone passes this fault: the elementwise bound caught it"
    assert result.reason.startswith("element ("), result.reason


def test_a_fault_only_in_partial_tiles_fails_at_a_shape_of_whole_tiles():
    """A shape-generic kernel checked at a shape of whole tiles is also checked where its last tiles are partial."""
    kernel = build(_valid(HGEMM))

    def edge_rows_zeroed(out):
        if out.shape[0] % 32:
            out[-1, :] = 0

    assert edge_shape(kernel.valid.spec, 64, 64, 64) == (40, 40, 40)
    result = verify(Faulty(kernel, edge_rows_zeroed), 64, 64, 64, seed=3)
    assert not result.ok and "at 40x40x40, which has partial tiles" in result.reason, result.reason


def test_unwritten_element_is_named():
    kernel = build(_valid(HGEMM))

    def unwritten(out):
        out[3, 4] = math.nan

    result = verify(Faulty(kernel, unwritten), 37, 41, 19, seed=4)
    assert not result.ok and "unwritten output (NaN) at element (3, 4)" in result.reason


def nan_to_zero(out):
    """What fmaxf(x, 0) does to a NaN that reaches a ReLU: returns 0."""
    out.nan_to_num_(nan=0.0)


@pytest.mark.parametrize("text", [
    "types a=f16 b=f16 c=f16 epilogue activation=relu",
    "types a=bf16 b=bf16 c=f32 layout a=col c=col split_k slices=2 epilogue bias=row activation=relu",
])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_relu_that_drops_nan_fails_and_one_that_keeps_it_passes(text, batch):
    """A ReLU written as fmaxf turns a NaN product into 0: every check on finite inputs passes it, the NaN row fails
    it (torch.relu keeps NaN)."""
    valid = _valid(f"kernel r {{ {text} problem batch=any }}")
    assert verify(TorchKernel(valid), 48, 40, 56, batch=batch, seed=1).ok
    result = verify(TorchKernel(valid, nan_to_zero), 48, 40, 56, batch=batch, seed=1)
    assert not result.ok and "a NaN in A at" in result.reason and "not NaN" in result.reason, result
    assert f"({batch - 1}, 24, 18)" in result.reason if batch > 1 else "(24, 18)" in result.reason


def test_a_real_relu_kernel_keeps_nan():
    """The Triton template's ReLU (tl.maximum with NaN propagation), run by the interpreter."""
    kernel = build(_valid("kernel r { types a=f16 b=f16 c=f16 tile m=16 n=16 k=16 epilogue bias=col "
                          "activation=relu }"))
    result = verify(kernel, 33, 20, 24, seed=2)
    assert result.ok, result


@pytest.mark.parametrize("text", [
    "types a=f16 b=f16 c=f16 acc=f16",
    "types a=f16 b=f16 c=bf16",
    "types a=f16 b=f16 c=f32 epilogue alpha=-1.75 beta=0.5 bias=row activation=gelu",
    "types a=f32 b=f32 c=f32 math=tf32 epilogue bias=col activation=silu",
    "types a=f32 b=f32 c=f32 math=ieee epilogue alpha=3.0 beta=-2.0 activation=relu",
    "types a=bf16 b=bf16 c=bf16 layout a=col b=col c=col epilogue beta=1.0 bias=col activation=gelu",
    "types a=f16 b=f16 c=f16 split_k slices=4 epilogue alpha=0.001",
    "types a=bf16 b=bf16 c=bf16 epilogue alpha=2.0 beta=1.0 bias=col activation=relu",
    "types a=f16 b=f16 c=f16 acc=f16 epilogue alpha=0.25 beta=-1.0 bias=row",
])
@pytest.mark.parametrize("shape", [(257, 131, 1000), (64, 64, 4096), (1, 300, 7)])
def test_correct_kernels_pass_in_every_type_and_epilogue(text, shape):
    """The stand-in rounds as a correct kernel may (f16 sums per K tile, truncated TF32 inputs): never a failure."""
    valid = _valid(f"kernel t {{ {text} }}")
    for seed in range(3):
        result = verify(TorchKernel(valid), *shape, seed=seed)
        assert result.ok, result


@st.composite
def small_triton_specs(draw):
    """Valid Triton specs small enough for the interpreter, with every epilogue, accumulator, split-K and layout."""
    types_a = draw(st.sampled_from(("f16", "f32")))   # not bf16: its tl.dot is wrong in the interpreter
    scalar = st.one_of(st.just(0.0), st.sampled_from((1.0, -1.0, 0.5, 2.0)),   # powers of two: exact inputs too
                       st.floats(-4, 4).filter(lambda x: abs(x) > 1e-3))
    return draw(valid_specs(
        "triton", problem_m="any", problem_n="any", problem_k="any", problem_batch=1, types_a=types_a,
        types_b=types_a, types_acc=draw(st.sampled_from(("f32", "f16") if types_a == "f16" else ("f32",))),
        tile_m=draw(st.sampled_from((16, 32))), tile_n=draw(st.sampled_from((16, 32))),
        tile_k=draw(st.sampled_from((16, 32))), launch_loads="pointer",
        split_k_mode=draw(st.sampled_from(("workspace", "atomic"))),
        epilogue_alpha=draw(scalar.filter(lambda x: x != 0.0)), epilogue_beta=draw(scalar)))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(spec=small_triton_specs(), shape=st.tuples(st.integers(1, 70), st.integers(1, 70), st.integers(1, 70)),
       seed=st.integers(0, 2 ** 31))
def test_real_kernels_pass(spec, shape, seed):
    """Generated Triton kernels (interpreter) pass both checks, at the drawn shape and at its edge shape."""
    result = verify(build(validate(spec, "triton")), *shape, seed=seed)
    assert result.ok, (spec.to_l2(), shape, result)


@pytest.mark.parametrize("alpha", [1e-6, 3e-8])
def test_a_correct_kernel_whose_outputs_are_subnormal_in_its_output_type_passes(alpha):
    """Storing a tiny result into f16 rounds it to a subnormal's spacing (6e-8) whatever the kernel does: the norm
    check allows that much, and no more (the elementwise bound and a wrong element still fail it)."""
    spec = KernelSpec(name="tiny", target="triton", types_a="f32", types_b="f32", types_c="f16", tile_m=16,
                      tile_n=16, tile_k=16, epilogue_alpha=alpha)
    kernel = build(validate(spec, "triton"))
    for seed in range(4):
        result = verify(kernel, 5, 3, 7, seed=seed)
        assert result.ok, result


class Clobbering:
    """A correct kernel that also writes elsewhere after each call: into an operand it was only to read, or just
    past its output's last element (through the storage the output sits in)."""

    def __init__(self, valid, where):
        self.inner, self.where, self.valid = TorchKernel(valid), where, valid

    def __call__(self, a, b, c=None, bias=None, out=None):
        result = self.inner(a, b, c=c, bias=bias, out=out)
        if self.where == "b":
            b[0, 0] = b[0, 0] + 1
        elif self.where == "past the end":
            flat = torch.as_strided(result, (result.numel() + 1,), (1,), result.storage_offset())
            flat[-1] = 0
        return result


@pytest.mark.parametrize("where, layout_c", [("b", "row"), ("past the end", "row"), ("past the end", "col")])
def test_a_kernel_that_writes_outside_its_output_fails(where, layout_c):
    """Verification keeps the operands to compare after the calls and a guard of NaN around the output: a kernel that
    changes its inputs or stores past its output (a user's weights, a neighbouring tensor) is a failed candidate, even
    where its output is right."""
    valid = _valid(f"kernel h {{ types a=f16 b=f16 c=f16 layout c={layout_c} }}")
    assert verify(TorchKernel(valid), 48, 40, 32, seed=4).ok
    result = verify(Clobbering(valid, where), 48, 40, 32, seed=4)
    assert not result.ok, result
    assert ("input `b`" if where == "b" else "outside its output") in result.reason, result.reason


class AssumesPackedRows:
    """A kernel right on packed operands that reads B as if its leading dimension were its width (a kernel that
    ignores ldb): wrong on a column slice of a wider matrix."""

    def __init__(self, valid):
        self.inner, self.valid = TorchKernel(valid), valid

    def __call__(self, a, b, c=None, bias=None, out=None):
        packed = torch.as_strided(b, b.shape, (b.shape[1], 1), b.storage_offset())
        return self.inner(a, packed, c=c, bias=bias, out=out)


def test_a_kernel_that_ignores_the_leading_dimension_fails():
    """Verification also calls the kernel on operands with padded leading dimensions (the column slices of fused
    weights the dispatcher serves): a kernel that takes them must compute the same; one that declines them
    (ValueError) is not at fault."""
    valid = _valid("kernel h { types a=f16 b=f16 c=f16 layout b=row }")
    assert verify(TorchKernel(valid), 48, 40, 32, seed=5).ok
    result = verify(AssumesPackedRows(valid), 48, 40, 32, seed=5)
    assert not result.ok and "padded leading dimensions" in result.reason, result

    class DeclinesPadded(TorchKernel):
        def __call__(self, a, b, c=None, bias=None, out=None):
            if b.stride(0) != b.shape[1]:
                raise ValueError("only packed rows")
            return super().__call__(a, b, c=c, bias=bias, out=out)

    assert verify(DeclinesPadded(valid), 48, 40, 32, seed=5).ok


class DropsTheLastKTile(TorchKernel):
    """An f16-accumulating kernel that leaves out the last K tile: within the tolerance of normal inputs at large K."""

    def __call__(self, a, b, c=None, bias=None, out=None):
        tile = self.valid.spec.tile_k
        return super().__call__(a[..., :-tile], b[..., :-tile, :], c=c, bias=bias, out=out)


F16_ACC = "kernel acc16 { types a=f16 b=f16 c=f16 acc=f16 tile m=64 n=64 k=64 launch warps=4 }"


def test_a_dropped_k_tile_fails_on_inputs_where_a_correct_kernel_is_exact():
    """At K = 8192 an f16 accumulator's tolerance hides a missing K tile on normal inputs (1/128 of the sum); on
    inputs of -1, 0 and 1 every correct kernel is exact, so it fails there, and the correct kernel still passes."""
    valid = _valid(F16_ACC)
    for seed in range(3):
        assert verify(TorchKernel(valid), 64, 64, 8192, seed=seed).ok
        result = verify(DropsTheLastKTile(valid), 64, 64, 8192, seed=seed)
        assert not result.ok and "inputs of -1, 0 and 1" in result.reason, result



class RoundsOnce:
    """A perfect kernel: float64 product and epilogue, rounded once to types.c."""

    def __init__(self, valid):
        self.valid = valid

    def __call__(self, a, b, c=None, bias=None, out=None):
        from l2c.verify import epilogue
        spec = self.valid.spec
        z = epilogue(spec, a.double() @ b.double(), c, bias).to(TORCH_DTYPES[spec.types_c])
        if out is None:
            out = torch.empty_like(z)
        out.copy_(z)
        return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(alpha=st.sampled_from((1.0, 16.0, 2.0, 0.5, 0.0625, -4.0)), beta=st.sampled_from((0.0, 1.0, 0.0625, 16.0)),
       bias=st.sampled_from(("none", "row", "col")), types=st.sampled_from((("f16", "f16"), ("f16", "bf16"),
                                                                          ("f16", "f32"), ("f32", "f32"))),
       activation=st.sampled_from(("none", "relu")), shape=st.sampled_from(((32, 32, 64), (16, 16, 16),
                                                                           (64, 64, 4096), (8, 24, 152))),
       seed=st.integers(0, 2 ** 31))
def test_a_kernel_that_rounds_once_passes_on_exact_inputs(alpha, beta, bias, types, activation, shape, seed):
    """Inputs of -1, 0 and 1 are drawn so that alpha * A @ B + beta * C + bias fits the output type exactly: a kernel
    that computes the epilogue exactly and rounds once (as every correct one does) equals the reference, whatever
    scales alpha, beta and the bias mix (alpha = 16 with a bias once needed more bits than bf16 holds)."""
    types_a, types_c = types
    spec = KernelSpec(name="r", target="triton", types_a=types_a, types_b=types_a, types_c=types_c, tile_m=16,
                      tile_n=16, tile_k=16, epilogue_alpha=alpha, epilogue_beta=beta, epilogue_bias=bias,
                      epilogue_activation=activation)
    result = verify(RoundsOnce(validate(spec, "triton")), *shape, seed=seed)
    assert result.ok, (spec.to_l2(), shape, result)
