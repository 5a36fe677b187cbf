"""The Triton target end to end: render -> build (cache, import) -> run under the interpreter -> verify.

Every check runs the generated kernel on fresh random inputs with a NaN-poisoned output against the
float64 reference (l2c.verify). Inputs are f16 or f32 only: bf16 `tl.dot` is broken in the Triton
interpreter, so bf16 inputs are verified on the GPU by scripts/gpu_check.py. (bf16 *outputs* and C inputs
are covered here.) Tiles are pinned to 16/32 so the interpreter stays fast.
"""
import os
import re

import pytest
import torch
import triton
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from l2c import cache
from l2c.build import build
from l2c.kernel import Kernel, call_signature
from l2c.targets.triton.build import TritonKernel, load_module
from l2c.errors import BuildError, L2ValidationError
from l2c.ir import KernelSpec
from l2c.knobs import ANY, DTYPE_BYTES
from l2c.lower import render
from l2c.targets.triton.rules import TMA_LOADS
from l2c.validate import validate
from l2c.verify import make_inputs, verify

from .strategies import valid_specs, with_reduce

SMALL_TILES = (16, 32)


@pytest.fixture(scope="module", autouse=True)
def _cache_in_tmp(cache_in_tmp):
    """Every kernel of this module is built into a cache of its own."""


def kernel_for(**knobs) -> Kernel:
    name = knobs.pop("name", "t")
    base = dict(tile_m=16, tile_n=16, tile_k=16)
    base.update(knobs)
    return build(validate(KernelSpec(name=name, **base), "triton"))


def check(kernel, m, n, k, batch=1, seed=0):
    result = verify(kernel, m, n, k, batch=batch, device="cpu", seed=seed)
    assert result.ok, (result, kernel.valid.spec.to_l2())
    return result


@st.composite
def cases(draw, align: int = 1, **fixed):
    """(spec, m, n, k, batch): a random valid Triton spec with small tiles and a shape it accepts (N and K
    multiples of `align`: 8 keeps fp16 and fp32 rows 16-byte aligned, as TMA loads need)."""
    m = draw(st.integers(1, 70))
    n, k = (draw(st.integers(1, 70 // align)) * align for _ in range(2))
    batch = fixed.pop("batch", None) or draw(st.sampled_from((1, 1, 2, 3)))
    types_a = draw(st.sampled_from(("f16", "f32")))
    tile_k = draw(st.sampled_from(SMALL_TILES))
    fixed_k = draw(st.booleans())
    slices = draw(st.sampled_from((1, 1, 2, 3)))
    if fixed_k:
        slices = min(slices, -(-k // tile_k))
    pins = dict(
        types_a=types_a,
        types_acc=draw(st.sampled_from(("f32", "f16"))) if types_a == "f16" else "f32",
        problem_m=draw(st.sampled_from((ANY, m))),
        problem_n=draw(st.sampled_from((ANY, n))),
        problem_k=k if fixed_k else ANY,
        problem_batch=draw(st.sampled_from((ANY, batch))),
        tile_m=draw(st.sampled_from(SMALL_TILES)),
        tile_n=draw(st.sampled_from(SMALL_TILES)),
        tile_k=tile_k,
        split_k_slices=slices,
        # TMA loads need 16-byte rows: only with `align` 8 is every drawn shape one they accept
        launch_loads=draw(st.sampled_from(("pointer",) + TMA_LOADS)) if align >= 8 else "pointer",
        epilogue_alpha=draw(st.sampled_from((1.0, 0.5, -2.0))),
        epilogue_beta=draw(st.sampled_from((0.0, 0.0, 1.0, -0.75))),
    )
    pins.update(fixed)   # knobs the caller pins (`fixed` beyond `batch`)
    return draw(valid_specs("triton", **pins)), m, n, k, batch


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cases(), st.integers(0, 2 ** 31), st.sampled_from(["finalize", "inkernel"]))
def test_random_specs_match_reference(case, seed, reduce):
    spec, m, n, k, batch = case
    kernel = build(validate(with_reduce(spec, reduce), "triton"))
    check(kernel, m, n, k, batch, seed=seed)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(cases(), st.sampled_from(["finalize", "inkernel"]))
def test_prepare_describes_launches_a_plan_can_replay(case, reduce):
    """`prepare` hands every launch's arguments as the kernel's leading parameters by position plus its
    constexprs and launch options by name: exactly the kernel's parameter list, which is what a GPU launch
    plan (l2c.targets.triton.build._LaunchPlan) replays into Triton's compiled launcher. The call's own tensors
    appear as themselves, so a plan can put a later call's tensors in their place."""
    spec, m, n, k, batch = case
    kernel = build(validate(with_reduce(spec, reduce), "triton"))
    a, b, c, bias, _ = make_inputs(spec, m, n, k, batch, "cpu", torch.Generator().manual_seed(0))
    out, zero, launches = kernel.module.prepare(a, b, c, bias)
    finalize = spec.split_k_slices > 1 and (reduce == "finalize" or spec.split_k_mode == "atomic")
    assert len(launches) == (2 if finalize else 1)
    assert (zero is not None) == (finalize and spec.split_k_mode == "atomic")
    for jit, grid, args, meta in launches:
        names = jit.arg_names
        constexprs = [x for x in meta if x not in ("num_warps", "num_stages")]
        assert sorted(names[len(args):]) == sorted(constexprs)
        assert not any(x in meta for x in names[:len(args)])
        assert all(isinstance(g, int) and g > 0 for g in grid)
    assert launches[0][2][0] is a and launches[0][2][1] is b
    assert any(x is out for x in launches[-1][2])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.sampled_from(TMA_LOADS).flatmap(lambda loads: cases(align=8, batch=1, problem_batch=1,
                                                               launch_loads=loads)),
       st.integers(0, 2 ** 31))
def test_tma_loads_match_reference(case, seed):
    """`launch loads=tma` and `tma_device` (validated for fp16/fp32 A and B without a batch) read A and B through
    tensor descriptors (a column-major operand through its transpose): out-of-bounds tiles read as zero, so no
    masks. The kernel computes the reference in every layout. With `tma`, `prepare` passes host-built descriptors
    over the call's own tensors, which a launch plan replays over a later call's; with `tma_device` it passes the
    tensors and each program builds the descriptors. A column-major A whose M makes rows of a length TMA cannot
    read is refused with a ValueError (the dispatcher then falls back to torch)."""
    spec, m, n, k, batch = case
    kernel = build(validate(spec, "triton"))
    assert "a_desc.load(" in kernel.source
    assert ("tl.make_tensor_descriptor(" in kernel.source) == (spec.launch_loads == "tma_device")
    a, b, c, bias, _ = make_inputs(spec, m, n, k, batch, "cpu", torch.Generator().manual_seed(0))
    if spec.layout_a == "col" and (m * a.element_size()) % 16:   # (validation refuses a fixed M like this)
        with pytest.raises(ValueError, match="TMA"):
            kernel(a, b, c=c, bias=bias)
        m = -(-m // 8) * 8   # and the same kernel on the next M it accepts
        a, b, c, bias, _ = make_inputs(spec, m, n, k, batch, "cpu", torch.Generator().manual_seed(0))
    check(kernel, m, n, k, batch, seed=seed)
    _, _, launches = kernel.module.prepare(a, b, c, bias)
    a_desc, b_desc = launches[0][2][:2]
    if spec.launch_loads == "tma_device":
        assert a_desc is a and b_desc is b
        return
    assert a_desc.base is a and b_desc.base is b
    assert list(a_desc.block_shape) == ([spec.tile_k, spec.tile_m] if spec.layout_a == "col"
                                        else [spec.tile_m, spec.tile_k])
    assert list(b_desc.block_shape) == ([spec.tile_n, spec.tile_k] if spec.layout_b == "col"
                                        else [spec.tile_k, spec.tile_n])


# valid_specs filters draws by validation, which refuses most of the grown space: not a slow test
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(valid_specs("triton", launch_loads="pointer", launch_family="gemm", launch_evict="normal"),
       st.sampled_from(TMA_LOADS))
def test_tma_loads_are_validated_where_the_template_can_serve_them(spec, loads):
    """Every valid Triton gemm-family spec with pointer loads and no eviction hint (gemv and evict=first have rules
    of their own against TMA, gemv-loads and evict-loads) either validates with `loads=tma` and `loads=tma_device` too,
    or is refused by the rule triton-tma-loads exactly when it breaks what the TMA template assumes."""
    contiguous = (spec.problem_k if spec.layout_a == "row" else spec.problem_m,
                  spec.problem_n if spec.layout_b == "row" else spec.problem_k)
    eligible = (spec.problem_batch == 1 and spec.types_a in ("f16", "f32")
                and all(x == ANY or x * DTYPE_BYTES[spec.types_a] % 16 == 0 for x in contiguous))
    tma = spec.replace(launch_loads=loads)
    if eligible:
        assert validate(tma, "triton").spec.launch_loads == loads
        assert re.search(rf"\bloads={loads}(\s|$)", tma.to_l2()) and "loads=" not in spec.to_l2()
    else:
        with pytest.raises(L2ValidationError) as err:
            validate(tma, "triton")
        assert err.value.rule == "triton-tma-loads"


@pytest.mark.parametrize("loads", TMA_LOADS)
def test_tma_kernel_rejects_rows_it_cannot_load(loads):
    """TMA needs 16-byte-aligned rows: a shape-generic TMA kernel refuses K = 7 in fp16 with a ValueError (the
    dispatcher then falls back to torch), and the same spec with pointer loads serves it."""
    kernel = kernel_for(name="tma_rows", launch_loads=loads)
    a, b = torch.randn(16, 7).half(), torch.randn(7, 16).half()
    with pytest.raises(ValueError, match="TMA"):
        kernel(a, b)
    plain = kernel_for(name="tma_rows")
    assert torch.allclose(plain(a, b).float(), a.float() @ b.float(), atol=1e-2)


@pytest.mark.parametrize("layout_a", ["row", "col"])
@pytest.mark.parametrize("layout_b", ["row", "col"])
@pytest.mark.parametrize("layout_c", ["row", "col"])
def test_layouts(layout_a, layout_b, layout_c):
    check(kernel_for(layout_a=layout_a, layout_b=layout_b, layout_c=layout_c, epilogue_beta=0.5), 33, 47, 29)


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "silu"])
@pytest.mark.parametrize("bias", ["none", "row", "col"])
def test_epilogue(activation, bias):
    check(kernel_for(epilogue_activation=activation, epilogue_bias=bias, epilogue_alpha=0.75,
                     epilogue_beta=-1.5, types_c="f32"), 35, 18, 40)


@pytest.mark.parametrize("types_c", ["f16", "bf16", "f32"])
def test_output_and_c_types(types_c):
    check(kernel_for(types_c=types_c, epilogue_beta=1.0, epilogue_bias="col"), 20, 30, 40)


@pytest.mark.parametrize("types_a, acc, math", [("f16", "f16", "tf32"), ("f32", "f32", "tf32"),
                                                ("f32", "f32", "ieee")])
def test_input_and_accumulator_types(types_a, acc, math):
    result = check(kernel_for(types_a=types_a, types_b=types_a, types_acc=acc, types_math=math, types_c="f32"),
                   24, 40, 70)
    if math == "ieee" and types_a == "f32":
        assert result.tolerance < 1e-4


@pytest.mark.parametrize("mode", ["workspace", "atomic"])
@pytest.mark.parametrize("persistent", ["no", "yes"])
@pytest.mark.parametrize("reduce", ["finalize", "inkernel"])
def test_split_k(mode, persistent, reduce):
    kernel = kernel_for(split_k_slices=3, split_k_mode=mode, launch_persistent=persistent, problem_batch=ANY,
                        epilogue_beta=0.5, epilogue_bias="row", epilogue_activation="silu",
                        split_k_reduce=reduce if mode == "workspace" else "inkernel")
    check(kernel, 30, 21, 75, batch=2)
    check(kernel, 30, 21, 75, batch=2, seed=1)   # atomic: the buffer is cleared again on every call
    check(kernel, 17, 9, 20, batch=1, seed=2)    # K shorter than the slices: empty slices add nothing
    # atomic partials are always reduced by a finalize kernel (the in-kernel read raced on the H200)
    assert hasattr(kernel.module, "_get_locks") == (reduce == "inkernel" and mode == "workspace")


def test_split_k_reduce_is_part_of_the_spec_and_only_where_it_chooses_something():
    """The reduction changes the generated code, so it is a knob: two reductions are two spec texts (two keys
    for the results store and the build cache), and a spec that could not use it is refused before any build."""
    inkernel = KernelSpec(name="r", split_k_slices=2)
    finalize = inkernel.replace(split_k_reduce="finalize")
    assert "reduce=" not in inkernel.to_l2() and "reduce=finalize" in finalize.to_l2()
    assert render(validate(inkernel, "triton")) != render(validate(finalize, "triton"))
    for bad in (finalize.replace(split_k_slices=1), finalize.replace(split_k_mode="atomic")):
        with pytest.raises(L2ValidationError, match="split-k-reduce"):
            validate(bad, "triton")
    with pytest.raises(L2ValidationError, match="target-knob"):
        validate(finalize.replace(target="cutlass", tile_m=128, tile_n=128, tile_k=64), "cutlass")


@pytest.mark.parametrize("reduce", ["finalize", "inkernel"])
def test_split_k_takes_a_workspace_of_its_own_per_call_and_is_deterministic(reduce):
    """Each call's partials go to a buffer of its own from torch's allocator (on the GPU, on the call's stream), so
    calls on two streams, or a graph replayed beside eager calls, never share one; so do the in-kernel reduction's
    semaphores, zeroed per call."""
    kernel = kernel_for(split_k_slices=4, split_k_mode="workspace", split_k_reduce=reduce)
    a, b = torch.randn(40, 64).half(), torch.randn(64, 24).half()
    first, second = kernel(a, b), kernel(a, b)
    assert torch.equal(first, second)
    held = []
    for _ in range(2):   # both calls' launches held at once
        _, _, launches = kernel.module.prepare(a, b)
        held.append({x.dtype: x for _, _, args, _ in launches for x in args
                     if isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.int32)})
    one, other = held
    assert one[torch.float32].data_ptr() != other[torch.float32].data_ptr()
    assert one[torch.float32].numel() >= 4 * 40 * 24
    assert (torch.int32 in one) == (reduce == "inkernel")
    if reduce == "inkernel":
        assert one[torch.int32].data_ptr() != other[torch.int32].data_ptr()
        assert not one[torch.int32].any() and not other[torch.int32].any()
    assert not hasattr(kernel.module, "_workspace") and not hasattr(kernel.module, "_locks")
    signature = call_signature(a, b, None)
    kernel._planning_call(signature, a, b, None)   # no launch plan: a plan would fix one workspace for every call
    assert kernel.launcher(signature) is None and "per call" in kernel.plan_refusals[signature]


@pytest.mark.parametrize("raster", ["m", "n"])
@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("persistent", ["no", "yes"])
def test_launch_order(raster, group, persistent):
    check(kernel_for(swizzle_raster=raster, swizzle_group=group, launch_persistent=persistent), 70, 50, 16)


def test_batched_fixed_shape():
    kernel = kernel_for(problem_m=64, problem_n=32, problem_k=64, problem_batch=3, tile_m=32, tile_n=32,
                        tile_k=32, layout_a="col", epilogue_beta=2.0)
    check(kernel, 64, 32, 64, batch=3)
    assert "mask" not in kernel.source  # every dimension is a multiple of its tile: no masks emitted


@pytest.mark.parametrize("shape, message", [((49, 32, 64, 3), "M=48"), ((48, 33, 64, 3), "N=32"),
                                            ((48, 32, 63, 3), "K=64"), ((48, 32, 64, 2), "batch=3")])
def test_fixed_shape_rejects_other_shapes(shape, message):
    kernel = kernel_for(problem_m=48, problem_n=32, problem_k=64, problem_batch=3)
    m, n, k, batch = shape
    with pytest.raises(ValueError, match=message):
        kernel(torch.randn(batch, m, k).half(), torch.randn(batch, k, n).half())
    result = verify(kernel, m, n, k, batch=batch, device="cpu", seed=0)
    assert not result.ok and "ValueError" in result.reason


def test_launcher_checks_operands():
    kernel = kernel_for(epilogue_beta=1.0)
    a, b = torch.randn(8, 8).half(), torch.randn(8, 8).half()
    with pytest.raises(ValueError, match="needs the C input"):
        kernel(a, b)
    with pytest.raises(ValueError, match="must be torch.float16"):
        kernel(a.float(), b, c=torch.randn(8, 8).half())
    with pytest.raises(ValueError, match="shape"):
        kernel(a, b, c=torch.randn(8, 9).half())
    with pytest.raises(ValueError, match="reads no bias"):
        kernel(a, b, c=torch.randn(8, 8).half(), bias=torch.randn(8).half())


@pytest.mark.parametrize("family", ["gemm", "gemv"])
def test_a_bias_that_is_not_contiguous_is_refused(family):
    """The kernels read the bias at consecutive addresses: a strided bias (a view such as wide[::2]) is refused
    rather than read as if it were contiguous; a contiguous one serves."""
    knobs = dict(launch_family="gemv", tile_m=1, tile_n=16, tile_k=16) if family == "gemv" else {}
    kernel = kernel_for(epilogue_bias="col", **knobs)
    m = 1 if family == "gemv" else 16
    a, b, wide = torch.randn(m, 16).half(), torch.randn(16, 16).half(), torch.randn(32).half()
    with pytest.raises(ValueError, match="bias must be contiguous"):
        kernel(a, b, bias=wide[::2])
    torch.testing.assert_close(kernel(a, b, bias=wide[::2].contiguous()).float(),
                               a.float() @ b.float() + wide[::2].float(), rtol=2e-3, atol=2e-2)


def test_operands_past_32_bit_offsets_are_refused():
    """The kernels index inside a matrix in 32 bits: an operand whose farthest element lies 2^31 elements or more
    from its first is refused before any launch (views on the meta device hold no memory)."""
    kernel = kernel_for()
    meta = torch.empty(1, dtype=torch.float16, device="meta")
    b = torch.empty(16, 16, dtype=torch.float16, device="meta")
    for rows, refused in ((16, False), (17, True)):   # the last row at 15 x 2^27 < 2^31, or at 16 x 2^27 = 2^31
        a = meta.as_strided((rows, 16), (2 ** 27, 0))
        try:
            kernel.module.prepare(a, b)
            raised = ""
        except Exception as err:  # noqa: BLE001 - the meta device stops a call that got past the checks
            raised = str(err)
        assert ("2^31 elements" in raised) == refused, raised


def _broken(kernel: TritonKernel, old: str, new: str) -> TritonKernel:
    assert old in kernel.source
    source = kernel.source.replace(old, new)
    module, path = load_module(source, kernel.valid.name + "_broken")
    return TritonKernel(kernel.valid, source, module, path)


def test_verify_catches_unwritten_output():
    kernel = kernel_for(name="leaky")
    leaky = _broken(kernel, "mask = (offs_m[:, None] < M)", "mask = (offs_m[:, None] < M - 1)")
    result = verify(leaky, 20, 20, 20, device="cpu", seed=0)
    assert not result.ok and result.reason == "unwritten output (NaN) at element (19, 0)"   # the last row


def test_verify_catches_wrong_values():
    kernel = kernel_for(name="short_k")
    short = _broken(kernel, "range(k_tiles)", "range(k_tiles - 1)")
    result = verify(short, 20, 20, 40, device="cpu", seed=0)
    assert not result.ok and "exceeds tolerance" in result.reason


def test_verify_turns_kernel_exceptions_into_failures():
    kernel = kernel_for(name="raises")
    raising = _broken(kernel, "    m, k = a.shape[-2:]", "    raise RuntimeError('boom')")
    result = verify(raising, 8, 8, 8, device="cpu", seed=0)
    assert not result.ok and "RuntimeError: boom" in result.reason


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(valid_specs("triton"), st.sampled_from(["finalize", "inkernel"]))
def test_module_text(spec, reduce):
    """The module carries the canonical spec, compiles, and every named constant it defines is used."""
    spec = with_reduce(spec, reduce)
    source = render(validate(spec, "triton"))
    assert spec.to_l2() in "\n".join(line[4:] for line in source.splitlines())
    compile(source, f"{spec.name}.py", "exec")
    for name in re.findall(r"^([A-Z_]+) = ", source, flags=re.M):
        assert len(re.findall(rf"\b{name}\b", source)) > 1, f"{name} is defined but never used"
    assert "{{" not in source and "{%" not in source


def test_build_caches_and_reuses_the_module():
    first, second = kernel_for(name="twice"), kernel_for(name="twice")
    assert first.path == second.path and first.module is second.module
    assert first.path.parent == cache.cache_dir("triton")
    assert first.target == "triton" and first.flops(2, 3, 4, batch=5) == 2 * 2 * 3 * 4 * 5


@pytest.mark.parametrize("source, message", [("def launch(:\n", "does not compile"),
                                             ("raise RuntimeError('at import')\n", "at import"),
                                             ("x = 1\n", "no launch")])
def test_broken_source_is_a_build_error(source, message):
    with pytest.raises(BuildError, match=message):
        load_module(source, "broken")


@pytest.mark.skipif(getattr(triton, "knobs", None) is None, reason="launch plans need triton.knobs (Triton >= 3.4)")
def test_launch_hook_set_reads_triton_hook_chains():
    """Plans step aside while a profiler's launch hook is set, and only then: Triton >= 3.5 keeps an empty
    HookChain (never None) when no hook is set, which once kept every plan from being made on the H200."""
    from l2c.targets.triton.build import launch_hook_set
    runtime = triton.knobs.runtime
    assert not launch_hook_set()

    def hook(*args):
        pass
    enter = runtime.launch_enter_hook
    if hasattr(enter, "add"):
        enter.add(hook)
        try:
            assert launch_hook_set()
        finally:
            enter.remove(hook)
    else:
        runtime.launch_enter_hook = hook
        try:
            assert launch_hook_set()
        finally:
            runtime.launch_enter_hook = enter
    assert not launch_hook_set()


def test_call_planned_is_the_allocating_call():
    """The dispatcher hands a kernel the call signature it computed for its own lookup (`call_planned`); the
    result is the allocating call's, bit for bit, under every target's path (CPU: the checked launch)."""
    from l2c.kernel import call_signature
    kernel = kernel_for(epilogue_bias="col", epilogue_activation="relu")
    g = torch.Generator().manual_seed(3)
    a = torch.randn(20, 24, generator=g).half()
    b = torch.randn(24, 12, generator=g).half()
    bias = torch.randn(12, generator=g).half()
    want = kernel(a, b, bias=bias)
    got = kernel.call_planned(call_signature(a, b, bias), a, b, bias)
    assert torch.equal(got, want)


@pytest.mark.parametrize("reduce", ["inkernel", "finalize"])
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                                HealthCheck.function_scoped_fixture])
@given(st.lists(valid_specs("triton"), min_size=10, max_size=10))
def test_generated_kernels_compile_for_the_gpu(tmp_path, reduce, specs):
    """Triton's GPU compiler, run ahead of time on this CPU by `l2c build` (no interpreter), accepts every kernel
    the template generates, under each split-K reduction. The interpreter the other tests use checks what a kernel
    computes, not what the compiler accepts: a loop variable retyped in a branch (in-kernel split-K with TMA)
    passed them and failed to compile on the H200."""
    import subprocess
    import sys
    # with the template's feature matrix, so every branch of it is compiled whatever the random draw
    matrix = [KernelSpec(name="m", tile_m=64, tile_n=64, tile_k=32, split_k_slices=slices, split_k_mode=mode,
                         launch_persistent=persistent, layout_a=layout, layout_b=layout, problem_batch=batch,
                         launch_loads=loads, epilogue_bias="col", epilogue_beta=0.5)
              for slices, mode in ((1, "workspace"), (4, "workspace"), (4, "atomic"))
              for persistent in ("no", "yes") for layout, batch, loads in
              (("row", 1, "pointer"), ("row", 1, "tma"), ("row", 1, "tma_device"), ("row", ANY, "pointer"),
               ("col", 1, "pointer"), ("col", 1, "tma"), ("col", 1, "tma_device"), ("col", ANY, "pointer"))]
    specs = [with_reduce(s, reduce) for s in specs + matrix]
    path = tmp_path / f"specs_{len(list(tmp_path.iterdir()))}.l2"
    path.write_text("\n".join(s.replace(name=f"k{i}").to_l2() for i, s in enumerate(specs)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(L2C_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "l2c", "build", str(path), "--target", "triton", "-j", "2"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{len(specs)} built, 0 failed" in done.stdout


def test_tuner_compile_pool_compiles_triton_candidates_ahead(tmp_path):
    """The tuner's compile pool (a job of l2c.search.compile_pool) compiles a Triton candidate with Triton's GPU
    compiler when not interpreting, so a candidate that compiler rejects is failed on the CPU, before GPU time."""
    import subprocess
    import sys
    spec = KernelSpec(name="pool", target="triton", tile_m=64, tile_n=64, tile_k=32, split_k_slices=2).to_l2()
    code = ("import sys; from l2c.search.compile_pool import build_batch; "
            "from l2c.targets.triton.build import interpreting; assert not interpreting(); "
            "(built,) = build_batch([(sys.argv[1], 'triton', 'sm_90')]); "
            "assert built.kernels == 1 and built.seconds > 0, built; print(repr(built.failure))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["L2C_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "None"
    assert list(tmp_path.glob("triton/pool_*.py"))   # the module is in the build cache


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 70), min_size=1, max_size=3),
       dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]))
def test_a_planned_call_allocates_a_contiguous_output_of_its_shape(shape, dtype):
    """Planned calls allocate through `output_template` (a one-element tensor expanded): torch.empty_like of it is
    a fresh, contiguous tensor of the full shape, never a view of the template."""
    from l2c.kernel import output_template
    template = output_template(tuple(shape), dtype, torch.device("cpu"))
    assert template.untyped_storage().nbytes() == torch.tensor([], dtype=dtype).element_size()
    out = torch.empty_like(template)
    assert tuple(out.shape) == tuple(shape) and out.dtype == dtype and out.is_contiguous()
    assert out.untyped_storage().nbytes() == out.numel() * out.element_size()
    assert out.data_ptr() != template.data_ptr()


def test_compiling_ahead_refuses_what_the_gpu_would_and_keeps_tritons_ptx_dump_off_stdout(tmp_path):
    """Past the rules (a spec made valid by hand), compiling ahead is the last check before a GPU: a kernel whose
    compiled shared memory exceeds the arch's block limit (Triton would refuse every launch) and one ptxas refuses are
    BuildErrors naming why, and the PTX Triton prints when ptxas fails does not reach stdout."""
    import subprocess
    import sys
    code = """
import dataclasses
from l2c.arch import ARCHS
from l2c.errors import BuildError
from l2c.ir import KernelSpec
from l2c.rules import ValidSpec
from l2c.targets.triton.build import build_triton, compile_ahead, interpreting
assert not interpreting()
def ahead(spec, warps, arch):
    try:
        compile_ahead(build_triton(ValidSpec(spec, "triton", arch, stages=2, warps=warps, schedule="none",
                                             smem_bytes=0)))
    except BuildError as err:
        return str(err)
small = KernelSpec(name="small", target="triton", tile_m=64, tile_n=64, tile_k=32, pipeline_stages=2)
tiny_smem = dataclasses.replace(ARCHS["sm_90"], smem_per_block=1024)
print("SHARED", ahead(small, 4, tiny_smem))
print("FITS", ahead(small, 4, ARCHS["sm_90"]))
crowded = KernelSpec(name="crowded", target="triton", tile_m=256, tile_n=256, tile_k=64, pipeline_stages=2,
                     launch_warps=16)
print("REGISTERS", ahead(crowded, 16, ARCHS["sm_90"]).splitlines()[0])
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["L2C_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("SHARED small: small_kernel needs ") and "more than the 1024" in line for line in lines)
    assert "FITS None" in lines
    assert any(line.startswith("REGISTERS crowded: Triton cannot compile crowded_kernel") for line in lines)
    assert "reproducer" not in done.stdout and len(lines) == 3, done.stdout[:2000]


def test_a_muted_compile_leaves_other_threads_output_and_a_missing_stdout_alone(monkeypatch, capsys):
    """While one thread compiles ahead with Triton's prints muted, another thread's prints pass; with no stdout at
    all (a daemon, pythonw) printing stays the no-op it is without l2c."""
    import sys
    import threading
    from l2c.targets.triton.build import _this_thread_quiet
    inside, done = threading.Event(), threading.Event()

    def compile_muted():
        with _this_thread_quiet():
            print("muted")
            inside.set()
            done.wait(10)

    for stdout in (sys.stdout, None):
        monkeypatch.setattr(sys, "stdout", stdout)
        inside.clear(), done.clear()
        worker = threading.Thread(target=compile_muted)
        worker.start()
        assert inside.wait(10)
        print("passes")
        done.set()
        worker.join()
        assert sys.stdout is stdout
    monkeypatch.undo()
    assert capsys.readouterr().out == "passes\n"


def test_muting_and_unmuting_while_other_threads_print_never_crashes():
    """CPython's print holds sys.stdout by a borrowed reference while it writes: a muting proxy freed when stdout is
    set back crashed `l2c build` (SIGSEGV) with threads printing their progress. Threads toggling the mute beside
    threads printing, for a few seconds, in a fresh interpreter."""
    import subprocess
    import sys
    code = """
import sys, threading, time
from l2c.targets.triton.build import _this_thread_quiet
stop = time.monotonic() + 4
def toggle():
    while time.monotonic() < stop:
        with _this_thread_quiet():
            pass
def write():
    while time.monotonic() < stop:
        print("x" * 2000)
threads = [threading.Thread(target=f) for f in (toggle, write, write)]
[t.start() for t in threads]
[t.join() for t in threads]
sys.stderr.write("survived")
"""
    done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stderr.endswith("survived"), (done.returncode, done.stderr[-2000:])
