"""`l2c.matmul` / `l2c.nn.Linear`: table lookup, fallback correctness, and the tuned path (interpreter)."""
import json
import logging

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import torch.nn.functional as F

import l2c
from l2c.dispatch import Dispatcher, TunedEntry, TunedTable, set_tuned_table
from l2c.ir import KernelSpec


def entry(m, n, k, tflops=2.0, baseline=1.0, spec=None, layout="row,col,row", target="triton", m_range=None,
          cell=None, dtype="f16"):
    """A table entry; `m_range` makes it a token-count range, `cell` ((n_lo, n_hi), (k_lo, k_hi)) with it a cell."""
    generic = cell is not None
    spec = spec or KernelSpec(name=f"t{m}x{n}x{k}", problem_m=m if m_range is None else "any",
                              problem_n="any" if generic else n, problem_k="any" if generic else k, tile_m=16,
                              tile_n=16, tile_k=16, layout_b="col", swizzle_group=1, launch_warps=4)
    lo, hi = m_range or (None, None)
    (n_lo, n_hi), (k_lo, k_hi) = cell or ((None, None), (None, None))
    return TunedEntry(m=m, n=n, k=k, batch=1, dtype=dtype, layout=layout, target=target,
                      spec_text=spec.to_l2(), tflops=tflops, baseline_tflops=baseline, m_lo=lo, m_hi=hi,
                      n_lo=n_lo, n_hi=n_hi, k_lo=k_lo, k_hi=k_hi)


def test_lookup_serves_exact_shapes_and_measured_ranges_only():
    table = TunedTable([entry(16, 64, 32), entry(128, 64, 32), entry(1024, 64, 32)])
    assert table.lookup("f16", "row,col,row", 128, 64, 32).m == 128
    for m in (1, 100, 129, 5000):     # no entry measured at this M: torch serves it
        assert table.lookup("f16", "row,col,row", m, 64, 32) is None
    assert table.lookup("f16", "row,col,row", 128, 64, 64) is None
    assert table.lookup("bf16", "row,col,row", 128, 64, 32) is None
    assert table.lookup("f16", "row,row,row", 128, 64, 32) is None
    boxed = TunedTable([entry(64, 64, 32, cell=((64, 128), (32, 64)), m_range=(64, 128)), entry(128, 64, 32)])
    assert boxed.lookup("f16", "row,col,row", 100, 96, 40).m == 64     # inside the cell's box
    assert boxed.lookup("f16", "row,col,row", 128, 64, 32).serves_cell is False   # an exact entry first
    for m, n, k in ((63, 96, 40), (100, 129, 40), (100, 96, 65)):   # outside it on one axis: torch
        assert boxed.lookup("f16", "row,col,row", m, n, k) is None
    ranged = TunedTable([entry(32, 64, 32, m_range=(8, 64)), entry(48, 64, 32, tflops=3.0, m_range=(40, 56))])
    assert ranged.lookup("f16", "row,col,row", 8, 64, 32).m == 32
    assert ranged.lookup("f16", "row,col,row", 50, 64, 32).m == 48     # the best worst-case range that holds M
    assert ranged.lookup("f16", "row,col,row", 64, 64, 32).m == 32
    assert ranged.lookup("f16", "row,col,row", 7, 64, 32) is None
    assert ranged.lookup("f16", "row,col,row", 65, 64, 32) is None


_CELL_SIDES = st.tuples(st.sampled_from([16, 32, 48, 64]), st.sampled_from([0, 16, 32]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 600), st.integers(0, 40), st.sampled_from(["exact", "range", "cell"]),
                          st.floats(0.5, 2.0, allow_nan=False), _CELL_SIDES, _CELL_SIDES), min_size=1, max_size=12),
       st.integers(1, 700), st.sampled_from([16, 32, 40, 64, 80, 96]), st.sampled_from([16, 32, 40, 64, 80, 96]))
def test_a_kernel_never_serves_a_shape_outside_what_was_measured_for_it(rows, m, n, k):
    """Whatever the table holds, a lookup returns an entry only for a shape it was measured faster at: its own
    shape, inside the range of M its producer measured, or inside the box whose corners it won."""
    entries = []
    for lo, width, kind, speed, (n_lo, n_wide), (k_lo, k_wide) in rows:
        if kind == "cell":
            entries.append(entry(lo, n_lo, k_lo, tflops=speed, m_range=(lo, lo + width),
                                 cell=((n_lo, n_lo + n_wide), (k_lo, k_lo + k_wide))))
        else:
            entries.append(entry(lo + width // 2 if kind == "range" else lo, 64, 32, tflops=speed,
                                 m_range=(lo, lo + width) if kind == "range" else None))
    table = TunedTable(entries)
    hit = table.lookup("f16", "row,col,row", m, n, k)
    assert table.may_serve(m, n, k) or hit is None     # the dispatcher's early torch test never drops a served shape
    if hit is not None:
        assert hit.speedup > 1.0
        if hit.serves_cell:
            assert hit.holds(m, n, k)
        else:
            assert (hit.n, hit.k) == (n, k)
            assert hit.m == m or (hit.serves_range and hit.m_lo <= m <= hit.m_hi)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([32, 48, 64]), st.sampled_from([32, 40]), st.integers(1, 64),
                          st.sampled_from(["exact", "range", "cell"]), st.sampled_from(["f16", "bf16"]),
                          st.sampled_from(["row,col,row", "row,row,row"])), min_size=0, max_size=6),
       st.lists(st.tuples(st.sampled_from([32, 40, 48, 64]), st.sampled_from([32, 40])), min_size=1, max_size=4),
       st.integers(1, 64))
def test_the_shape_prefilter_sends_to_torch_exactly_what_no_entry_may_serve(rows, calls, m):
    """l2c.matmul's and Dispatcher.linear's first test (a's dtype and b's layout, then b's (K, N) or the weight's
    (N, K), then M, against the dispatcher's maps) lets through exactly the calls an entry of that dtype and layouts
    may serve, asked first or again (a cell's (N, K) is worked out at its first call and
    remembered)."""
    table = TunedTable([entry(em, en, ek, m_range=(1, em) if kind != "exact" else None, dtype=dtype, layout=layout,
                              cell=((en, en + 16), (ek, ek + 8)) if kind == "cell" else None)
                        for en, ek, em, kind, dtype, layout in rows])
    dispatcher = Dispatcher(table, allow_cpu=True, online=False)
    for n, k in calls + calls:
        for torch_dtype, dtype in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
            for b_layout, by_kn in zip(("row,row,row", "row,col,row"), dispatcher.served_kn[torch_dtype]):
                assert (m in by_kn[k, n]) == table.may_serve(m, n, k, dtype=dtype, layout=b_layout)
            linear = dispatcher.served_nk[torch_dtype]
            assert (m in linear[n, k]) == table.may_serve(m, n, k, dtype=dtype, layout="row,col,row")
            assert bool(linear[n, k]) == any(table.may_serve(em, n, k, dtype=dtype, layout="row,col,row")
                                             for em in range(1, 65))
        assert table.may_serve(m, n, k) == any(table.may_serve(m, n, k, dtype=d) for d in ("f16", "bf16"))
    online = Dispatcher(None, allow_cpu=True, online=True)   # online: any shape may be tuned
    assert m in online.served_kn[torch.float16][1][7, 7] and m in online.served_nk[torch.bfloat16][7, 7]


def test_calls_no_entry_may_serve_are_torch_and_counted():
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True)
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    v = torch.randn(40, dtype=torch.float16)
    for args in ((a, v), (a[:, :32], w[:, :32].t()), (a.float(), w.float().t()[:, :7])):
        torch.testing.assert_close(l2c.matmul(*args), torch.matmul(*args))
    assert l2c.nn.Linear(40, 7)(a.float()).shape == (32, 7)
    assert dispatcher.stats == {"tuned": 0, "fallback": 4}
    set_tuned_table(None)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 40), bias=st.booleans(),
       activation=st.sampled_from([None, "relu", "gelu", "silu"]), use_out=st.booleans(), lead=st.integers(0, 2))
def test_a_dispatcher_that_serves_nothing_is_torch_at_every_entry_point(m, n, k, bias, activation, use_out, lead):
    """No table for this GPU and no online choice (an H100 with the H200's table): l2c.matmul and l2c.nn.Linear
    skip the first test and return bit for bit what the full path's fallback returns (a table serving none of these
    shapes), counted as fallbacks; with online choice or a table a dispatcher takes the full path."""
    from l2c.ops import matmul_with
    dispatcher = set_tuned_table(None, allow_cpu=True, online=False)
    assert dispatcher.serves_nothing and not Dispatcher(None, allow_cpu=True, online=True).serves_nothing
    full = Dispatcher(TunedTable([entry(1000, 48, 40, dtype="f32")]), allow_cpu=True)
    assert not full.serves_nothing
    a, b = torch.randn(m, k), torch.randn(k, n)
    c = torch.randn(n) if bias else None
    out, full_out = (torch.empty(m, n), torch.empty(m, n)) if use_out else (None, None)
    got = l2c.matmul(a, b, bias=c, activation=activation, out=out)
    want = matmul_with(full, a, b, c, activation, full_out)
    assert torch.equal(got, want) and (out is None or got is out)
    layer = l2c.nn.Linear(k, n, bias=bias, activation=activation)
    x = torch.randn(*([2] * lead), m, k)
    with torch.no_grad():
        assert torch.equal(layer(x), full.linear(x, layer.weight, layer.bias, activation))
    assert dispatcher.stats == {"tuned": 0, "fallback": 2} and full.stats == {"tuned": 0, "fallback": 2}
    set_tuned_table(None)


def test_a_dispatcher_that_serves_nothing_traces_to_torchs_ops_once():
    """Under torch.compile (fullgraph) the no-table path traces to torch's ops, counts nothing in the graph and
    compiles once for repeated calls."""
    import torch._dynamo
    dispatcher = set_tuned_table(None, online=False)
    torch._dynamo.reset()
    layer = l2c.nn.Linear(40, 48)
    compiled = torch.compile(lambda a, b: (l2c.matmul(a, b), layer(a)), fullgraph=True, backend="eager")
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            a, b = torch.randn(6, 40), torch.randn(40, 48)
            y, z = compiled(a, b)
            assert torch.equal(y, a @ b) and torch.equal(z, F.linear(a, layer.weight, layer.bias))
    assert dispatcher.stats == {"tuned": 0, "fallback": 0}
    torch._dynamo.reset()
    set_tuned_table(None)


@pytest.mark.parametrize("call", ["bias_activation", "residual", "gated", "gated_mlp"])
def test_a_dispatcher_that_serves_nothing_traces_every_epilogue_as_torchs_ops(call):
    """Under torch.compile a dispatcher that can serve nothing leaves no l2c op in the graph (the compiler sees
    torch's ops and may fuse the epilogue), and the compiled results equal eager l2c's."""
    import torch._dynamo
    set_tuned_table(None, online=False)
    torch._dynamo.reset()
    graphs = []

    def capture(gm, inputs):
        graphs.append(gm)
        return gm.forward

    a, b, bias, residual = torch.randn(6, 40), torch.randn(40, 48), torch.randn(48), torch.randn(6, 48)
    mlp = l2c.nn.GatedMLP(40, 24, gate="silu")
    fn = {"bias_activation": lambda: l2c.matmul(a, b, bias=bias, activation="gelu"),
          "residual": lambda: l2c.matmul(a, b, bias=bias, residual=residual),
          "gated": lambda: l2c.gated_matmul(a, b, "gelu_tanh", bias),
          "gated_mlp": lambda: mlp(a)}[call]
    with torch.no_grad():
        eager = fn()
        compiled = torch.compile(fn, fullgraph=True, backend=capture)()
    torch.testing.assert_close(compiled, eager)
    targets = [str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]
    assert targets and not any("l2c" in t for t in targets), targets
    torch._dynamo.reset()
    set_tuned_table(None)


def test_entries_slower_than_cublas_are_never_chosen():
    table = TunedTable([entry(128, 64, 32, tflops=0.9, baseline=1.0)])
    assert table.lookup("f16", "row,col,row", 128, 64, 32) is None and len(table) == 0


def test_load_reads_the_contract_format(tmp_path):
    e = entry(64, 64, 64)
    path = tmp_path / "sm_90.json"
    path.write_text(json.dumps({"format": 1, "arch": "sm_90", "protocol": "kernel", "entries": [
        {"m": 64, "n": 64, "k": 64, "batch": 1, "dtype": "f16", "layout": e.layout, "target": "triton",
         "spec": e.spec_text, "tflops": 2.0, "baseline_tflops": 1.0}]}))
    table = TunedTable.load(path)
    assert table.lookup("f16", "row,col,row", 64, 64, 64).spec_text == e.spec_text


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "silu"])
def test_fallback_is_exactly_torch(activation):
    set_tuned_table(None)
    a, b, bias = torch.randn(7, 5), torch.randn(5, 3), torch.randn(3)
    ref = a @ b + bias
    ref = {None: ref, "relu": F.relu(ref), "gelu": F.gelu(ref), "silu": F.silu(ref)}[activation]
    torch.testing.assert_close(l2c.matmul(a, b, bias=bias, activation=activation), ref)
    out = torch.empty(7, 3)
    assert l2c.matmul(a, b, bias=bias, activation=activation, out=out) is out
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("lead", [(), (2,)])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_out_follows_torchs_out_rules_where_torch_runs_the_epilogue_apart(activation, lead):
    """Where torch runs the bias or activation after the product (an activation, a batched a), `out=` is written as
    torch.matmul(out=) and torch.addmm(out=) write it: an empty out is resized silently, one of another shape with
    torch's deprecation warning, and an out= call autograd would record is refused."""
    set_tuned_table(None)
    a, b, bias = torch.randn(*lead, 7, 5), torch.randn(5, 3), torch.randn(3)
    want = torch.matmul(a, b) + bias
    want = want if activation is None else F.relu(want)
    out = torch.empty(0)
    assert l2c.matmul(a, b, bias=bias, activation=activation, out=out) is out
    torch.testing.assert_close(out, want)
    out = torch.empty(2, 2)
    with pytest.warns(UserWarning, match="was resized"):
        assert l2c.matmul(a, b, bias=bias, activation=activation, out=out) is out
    torch.testing.assert_close(out, want)
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        l2c.matmul(a.requires_grad_(), b, bias=bias, activation=activation, out=torch.empty(*lead, 7, 3))


def test_an_argument_that_is_not_a_tensor_is_a_type_error_naming_it():
    """A list, an array or a number where l2c.matmul or l2c.gated_matmul takes a tensor raises a TypeError naming the
    argument, as torch.matmul does, at a shape a kernel serves too (not an AttributeError from the dispatcher)."""
    set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    for name, value in (("a", a.tolist()), ("b", w.t().numpy()), ("bias", 1.0), ("out", 0.0), ("residual", 1.0)):
        call = {"a": a, "b": w.t(), name: value}
        with pytest.raises(TypeError, match=f"argument '{name}' must be Tensor"):
            l2c.matmul(**call)
    with pytest.raises(TypeError, match="argument 'bias' must be Tensor"):
        l2c.gated_matmul(a, torch.randn(40, 96, dtype=torch.float16), "silu", bias=[1.0] * 96)
    set_tuned_table(None)


def test_bad_activation_is_a_clear_error():
    with pytest.raises(ValueError, match="activation must be one of"):
        l2c.matmul(torch.randn(2, 2), torch.randn(2, 2), activation="tanh")


def test_linear_matches_torch_and_keeps_state_dict():
    set_tuned_table(None)
    ref = torch.nn.Linear(8, 4)
    lin = l2c.nn.Linear.from_linear(ref, activation="silu")
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(lin(x), F.silu(ref(x)))
    assert set(lin.state_dict()) == set(ref.state_dict())
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    expect = model(x)
    l2c.nn.replace_linears(model)
    assert all(type(m) is not torch.nn.Linear for m in model)
    torch.testing.assert_close(model(x), expect)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([None, "relu", "gelu", "silu"]), st.booleans(), st.booleans(),
       st.sampled_from(["silu", "gelu_tanh"]))
def test_scripted_layers_compute_what_the_eager_ones_do(activation, bias, residual, gate):
    """`torch.jit.script` of an l2c.nn.Linear (or a model after replace_linears) and of a GatedMLP: torch's ops,
    the eager layer's results bit for bit where torch serves it, activation and residual included; saved and
    loaded without Python."""
    import io
    set_tuned_table(None)
    torch.manual_seed(0)
    x, r = torch.randn(2, 3, 8), torch.randn(2, 3, 4)
    lin = l2c.nn.Linear(8, 4, bias=bias, activation=None if residual else activation)
    scripted = torch.jit.script(lin)
    assert torch.equal(scripted(x), lin(x))
    if residual:
        assert torch.equal(scripted(x, r), lin(x, r))
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    assert torch.equal(torch.jit.load(buffer)(x), lin(x))
    mlp = l2c.nn.GatedMLP(8, 16, gate=gate, bias=bias)
    scripted_mlp = torch.jit.script(mlp)
    assert torch.equal(scripted_mlp(x), mlp(x)) and torch.equal(scripted_mlp(x, x), mlp(x, x))
    model = l2c.nn.replace_linears(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
    assert torch.equal(torch.jit.script(model)(x), model(x))


def test_matmul_under_torch_compile():
    set_tuned_table(None)
    f = torch.compile(lambda a, b: l2c.matmul(a, b, activation="relu"))
    a, b = torch.randn(6, 4), torch.randn(4, 3)
    torch.testing.assert_close(f(a, b), F.relu(a @ b))


def test_tuned_path_runs_the_tuned_kernel_on_the_interpreter():
    """The real dispatcher path: lookup, epilogue specialisation (bias + gelu), build, call."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40, m_range=(24, 40))]), allow_cpu=True,
                                 prepare="inline")
    a = torch.randn(30, 40, dtype=torch.float16)                     # M=30: inside the measured range
    w = torch.randn(48, 40, dtype=torch.float16)
    bias = torch.randn(48, dtype=torch.float16)
    y = l2c.matmul(a, w.t(), bias=bias, activation="gelu")
    assert dispatcher.stats["tuned"] == 1 and dispatcher.stats["fallback"] == 0
    ref = F.gelu(a.double() @ w.double().t() + bias.double())
    assert ((y.double() - ref).norm() / ref.norm()).item() < 5e-3
    # a shape with no entry falls back to torch
    l2c.matmul(torch.randn(4, 40, dtype=torch.float16), torch.randn(40, 7, dtype=torch.float16))
    assert dispatcher.stats["fallback"] == 1
    set_tuned_table(None)


def test_a_row_major_b_sliced_from_a_wider_matrix_is_served_as_row_major():
    """`a @ w[:, :N]` (a column slice of a fused weight: row-major, not contiguous) reaches an `a @ b` entry with B
    row-major, as the contiguous B does; a column-major B of the same shape does not."""
    spec = KernelSpec(name="r32x48x40", problem_m=32, problem_n=48, problem_k=40, tile_m=16, tile_n=16, tile_k=16,
                      layout_b="row", swizzle_group=1, launch_warps=4)
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40, spec=spec, layout="row,row,row")]), allow_cpu=True,
                                 prepare="inline")
    a, wide = torch.randn(32, 40, dtype=torch.float16), torch.randn(40, 72, dtype=torch.float16)
    for b in (wide[:, :48], wide[:, 24:], wide[:, :48].contiguous()):
        torch.testing.assert_close(l2c.matmul(a, b).float(), a.float() @ b.float(), atol=2e-2, rtol=2e-2)
    assert dispatcher.stats == {"tuned": 3, "fallback": 0}
    l2c.matmul(a, torch.randn(48, 40, dtype=torch.float16).t())
    assert dispatcher.stats == {"tuned": 3, "fallback": 1}
    set_tuned_table(None)


def test_a_forward_mode_tangent_is_carried_by_torch_not_dropped_by_a_tuned_kernel():
    """Dual tensors (forward-mode AD) at a served shape: the tuned kernels have no forward derivative, so torch serves
    those calls and the tangent comes out as torch's; plain calls before and after are served."""
    import torch.autograd.forward_ad as fwad
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, da = torch.randn(32, 40, dtype=torch.float16), torch.randn(32, 40, dtype=torch.float16)
    w = torch.randn(48, 40, dtype=torch.float16)
    l2c.matmul(a, w.t())
    assert dispatcher.stats == {"tuned": 1, "fallback": 0}
    for call in (lambda x: l2c.matmul(x, w.t()), lambda x: dispatcher.linear(x, w)):
        with fwad.dual_level():
            y = call(fwad.make_dual(a, da))
            tangent = fwad.unpack_dual(y).tangent
        assert tangent is not None
        torch.testing.assert_close(tangent.float(), da.float() @ w.float().t(), atol=2e-2, rtol=2e-2)
    assert dispatcher.stats["tuned"] == 1
    l2c.matmul(a, w.t())
    assert dispatcher.stats["tuned"] == 2
    set_tuned_table(None)


def test_autocast_to_another_dtype_is_torchs_and_to_the_operands_dtype_is_served():
    """Inside `torch.autocast` whose dtype is not the operands', torch serves the call and its result has torch's
    (autocast's) dtype; in the operands' own dtype the tuned kernel serves as outside."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    l2c.matmul(a, w.t())
    assert dispatcher.stats == {"tuned": 1, "fallback": 0}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for y, expect in ((l2c.matmul(a, w.t()), torch.matmul(a, w.t())), (dispatcher.linear(a, w), F.linear(a, w))):
            assert y.dtype == expect.dtype == torch.bfloat16
            torch.testing.assert_close(y, expect)
    assert dispatcher.stats["tuned"] == 1
    with torch.autocast("cpu", dtype=torch.float16):
        assert l2c.matmul(a, w.t()).dtype == torch.float16
    assert dispatcher.stats["tuned"] == 2
    set_tuned_table(None)


def test_calls_inside_torch_func_transforms_are_torchs():
    """torch.vmap (and torch.func's other transforms) over l2c.matmul and l2c.nn.Linear's path at a served shape: the
    batched tensors have no memory of their own, so torch serves those calls (a tuned launch raised
    NotImplementedError); results as torch's, and plain calls are served before and after."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(3, 32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    l2c.matmul(a[0], w.t())
    assert dispatcher.stats == {"tuned": 1, "fallback": 0}
    expect = (a.float() @ w.float().t())
    for call in (lambda x: l2c.matmul(x, w.t()), lambda x: dispatcher.linear(x, w)):
        torch.testing.assert_close(torch.vmap(call)(a).float(), expect, atol=2e-2, rtol=2e-2)
    grad = torch.func.grad(lambda x: l2c.matmul(x, w.t()).float().sum())(a[0].float().half())
    torch.testing.assert_close(grad.float(), w.float().sum(0).expand(32, 40), atol=2e-2, rtol=2e-2)
    assert dispatcher.stats["tuned"] == 1
    l2c.matmul(a[0], w.t())
    assert dispatcher.stats["tuned"] == 2
    set_tuned_table(None)


def test_steady_state_resolution_still_tells_signatures_apart():
    """The per-call cache keys on shapes, strides, dtypes and devices: a call that differs in any of them from
    an earlier one (same M, N, K) is resolved afresh, not served by the earlier call's kernel."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a = torch.randn(32, 40, dtype=torch.float16)
    w = torch.randn(48, 40, dtype=torch.float16)
    for _ in range(2):   # the second call takes the cached resolution
        y = l2c.matmul(a, w.t())
        assert torch.allclose(y.float(), a.float() @ w.float().t(), atol=2e-2, rtol=2e-2)
    assert dispatcher.stats == {"tuned": 2, "fallback": 0}
    # same (M, N, K) but B row-major: the table has only row,col,row, so torch serves it
    y = l2c.matmul(a, w.t().contiguous())
    assert dispatcher.stats["fallback"] == 1
    assert torch.allclose(y.float(), a.float() @ w.float().t(), atol=2e-2, rtol=2e-2)
    # same shapes and strides, other dtype: no f32 entries, torch again
    l2c.matmul(a.float(), w.float().t())
    assert dispatcher.stats["fallback"] == 2
    # and the first signature still runs the tuned kernel
    l2c.matmul(a, w.t())
    assert dispatcher.stats == {"tuned": 3, "fallback": 2}
    # same signature, another epilogue: its own kernel (the fused activation), not the plain one served before
    for _ in range(2):
        y = l2c.matmul(a, w.t(), activation="relu")
        assert torch.allclose(y.float(), (a.float() @ w.float().t()).relu(), atol=2e-2, rtol=2e-2)
    assert dispatcher.stats == {"tuned": 5, "fallback": 2}
    # and through nn.Linear's path (x @ W^T): the plain kernel again, from the same served signature
    y = dispatcher.linear(a, w)
    assert torch.allclose(y.float(), a.float() @ w.float().t(), atol=2e-2, rtol=2e-2)
    assert dispatcher.stats == {"tuned": 6, "fallback": 2}
    set_tuned_table(None)


def test_linear_serves_3d_inputs_from_the_table_and_is_torch_elsewhere():
    """Eager l2c.nn.Linear: a (batch, tokens, in) input is flattened to M = batch*tokens for the table lookup and
    the tuned kernel's output reshaped back; an unserved shape runs torch.nn.Linear's own F.linear."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40, m_range=(3, 32))]), allow_cpu=True,
                                 prepare="inline")
    ref = torch.nn.Linear(40, 48).half()
    lin = l2c.nn.Linear.from_linear(ref, activation="gelu")
    x = torch.randn(2, 16, 40, dtype=torch.float16)
    with torch.no_grad():     # inference: a fused activation serves (it has no backward of its own)
        y = lin(x)
    assert y.shape == (2, 16, 48) and dispatcher.stats == {"tuned": 1, "fallback": 0}
    expect = F.gelu(x.double() @ ref.weight.double().t() + ref.bias.double())
    assert ((y.double() - expect).norm() / expect.norm()).item() < 5e-3
    with torch.no_grad():
        lin(torch.randn(3, 40, dtype=torch.float16))      # M=3: the low end of the measured range
    assert dispatcher.stats == {"tuned": 2, "fallback": 0}
    lin(x).float().sum().backward()                        # with autograd, gelu runs through torch
    assert dispatcher.stats["fallback"] == 1 and lin.weight.grad is not None
    plain = l2c.nn.Linear.from_linear(torch.nn.Linear(40, 7).half())   # N=7: no entry, torch's F.linear
    x7 = torch.randn(5, 40, dtype=torch.float16)
    assert torch.equal(plain(x7), F.linear(x7, plain.weight, plain.bias))
    assert dispatcher.stats["fallback"] == 2
    set_tuned_table(None)


def test_the_tuned_path_keeps_autograd_and_its_gradients_match_torch():
    """Training through a served kernel: the output records a graph, and dX, dW, db equal torch's."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    ref = torch.nn.Linear(40, 48).half()
    lin = l2c.nn.Linear.from_linear(ref)
    x = torch.randn(32, 40, dtype=torch.float16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    y = lin(x)
    assert y.grad_fn is not None and dispatcher.stats["tuned"] == 1
    grad = torch.randn(32, 48, dtype=torch.float16)
    y.float().mul(grad.float()).sum().backward()
    ref(x_ref).float().mul(grad.float()).sum().backward()
    for got, want in ((x.grad, x_ref.grad), (lin.weight.grad, ref.weight.grad), (lin.bias.grad, ref.bias.grad)):
        assert got is not None and got.shape == want.shape
        assert ((got.double() - want.double()).norm() / want.double().norm()).item() < 5e-3
    a = torch.randn(32, 40, dtype=torch.float16).requires_grad_()
    w = torch.randn(48, 40, dtype=torch.float16)
    out = l2c.matmul(a, w.t())
    out.float().sum().backward()
    assert dispatcher.stats["tuned"] == 2 and a.grad is not None
    torch.testing.assert_close(a.grad.float(), torch.ones(32, 48).mm(w.float()), atol=0.2, rtol=2e-2)
    set_tuned_table(None)


def test_kernels_are_prepared_in_a_background_process_and_torch_serves_meanwhile(tmp_path, monkeypatch):
    """The default mode: the first call of a signature runs torch and queues the kernel for the worker process
    (a real subprocess, here on the Triton interpreter); once it is built and verified, calls are tuned."""
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))   # no earlier process verified it
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="background")
    a = torch.randn(32, 40, dtype=torch.float16)
    w = torch.randn(48, 40, dtype=torch.float16)
    expect = a.float() @ w.float().t()
    y = l2c.matmul(a, w.t())
    assert dispatcher.stats == {"tuned": 0, "fallback": 1}
    torch.testing.assert_close(y.float(), expect, atol=2e-2, rtol=2e-2)
    assert dispatcher.wait(timeout=300)
    y = l2c.matmul(a, w.t())
    assert dispatcher.stats == {"tuned": 1, "fallback": 1}
    torch.testing.assert_close(y.float(), expect, atol=2e-2, rtol=2e-2)
    set_tuned_table(None)


def test_calls_made_while_a_kernel_is_prepared_derive_its_job_once(tmp_path, monkeypatch):
    """While the worker prepares a signature's kernel, each call asks only for the job's state: deriving the job
    (the entry's spec parsed and specialised) is done once, not per call (it cost ~2.5 ms a call on the H200)."""
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    import l2c.dispatch as dispatch
    derived, real = [], dispatch.served_spec
    monkeypatch.setattr(dispatch, "served_spec", lambda *args, **kw: derived.append(args[1]) or real(*args, **kw))
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="background")
    a = torch.randn(32, 40, dtype=torch.float16)
    w = torch.randn(48, 40, dtype=torch.float16)
    for _ in range(5):
        l2c.matmul(a, w.t())
    assert derived == [32]
    assert dispatcher.wait(timeout=300)
    l2c.matmul(a, w.t())
    assert derived == [32] and dispatcher.stats["tuned"] >= 1
    set_tuned_table(None)


def test_a_kernel_verified_by_an_earlier_process_serves_from_the_first_call(tmp_path, monkeypatch):
    """Once the worker verified a kernel at a shape, the pass is recorded for this GPU, driver and l2c version: a
    later process (a new dispatcher on the same cache) whose build of it runs no compiler (here: the interpreter)
    serves it from its first call, with no worker; another driver or l2c version, or another kernel, waits for
    the worker's check again."""
    from l2c.verified import VerifiedKernels
    from l2c.prepare import Job
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    table = TunedTable([entry(32, 48, 40)])
    a = torch.randn(32, 40, dtype=torch.float16)
    w = torch.randn(48, 40, dtype=torch.float16)
    expect = a.float() @ w.float().t()
    first = set_tuned_table(table, allow_cpu=True, prepare="background")
    l2c.matmul(a, w.t())
    assert first.wait(timeout=300)
    l2c.matmul(a, w.t())
    assert first.stats == {"tuned": 1, "fallback": 1}
    later = set_tuned_table(table, allow_cpu=True, prepare="background")
    torch.testing.assert_close(l2c.matmul(a, w.t()).float(), expect, atol=2e-2, rtol=2e-2)
    job = next(iter(first._jobs.values()))
    assert later.stats == {"tuned": 1, "fallback": 0} and later.preparer.state(job) is None   # no worker asked
    assert VerifiedKernels("cpu", "none").holds(job)
    assert not VerifiedKernels("cpu", "other-driver").holds(job)
    assert not VerifiedKernels("cpu", "none", version="0.0.0-other").holds(job)
    assert not VerifiedKernels("cpu", "none").holds(Job(job.spec_text, job.target, job.arch, 64, 48, 40, "cpu"))
    other = entry(32, 48, 40, spec=KernelSpec(name="other", problem_m=32, problem_n=48, problem_k=40, tile_m=16,
                                              tile_n=16, tile_k=16, layout_b="col", swizzle_group=2, launch_warps=4))
    elsewhere = set_tuned_table(TunedTable([other]), allow_cpu=True, prepare="background")
    l2c.matmul(a, w.t())
    assert elsewhere.stats == {"tuned": 0, "fallback": 1}      # another kernel: the worker checks it first
    assert elsewhere.wait(timeout=300)
    set_tuned_table(None)


def test_a_kernel_that_fails_preparation_is_remembered_and_never_served():
    from l2c.prepare import FAILED, READY, Job, Preparer
    preparer = Preparer(idle_exit_s=5)
    good = Job(entry(32, 48, 40).spec_text, "triton", "sm_90", 32, 48, 40, "cpu")
    bad = Job("kernel broken { tile m=", "triton", "sm_90", 32, 48, 40, "cpu")
    preparer.request(bad)
    preparer.request(good)
    assert preparer.wait(timeout=300)
    assert preparer.state(good) == READY
    assert preparer.state(bad) == FAILED and "build failed" in preparer.reason(bad)
    assert preparer.request(bad) == FAILED          # remembered: not queued again


BAD_TABLES = {
    "torn.json": b"{", "empty.json": b"", "list.json": b"[]", "entries5.json": b'{"entries": 5}',
    "binary.json": bytes(range(256)), "utf16.json": '{"entries": []}'.encode("utf-16"),
}


@pytest.mark.parametrize("name", sorted(BAD_TABLES) + ["missing.json", "a_directory"])
def test_a_table_that_cannot_be_read_warns_once_and_l2c_runs_torch(tmp_path, monkeypatch, caplog, name):
    from l2c.dispatch import table_for_arch
    path = tmp_path / name
    if name in BAD_TABLES:
        path.write_bytes(BAD_TABLES[name])
    elif name == "a_directory":
        path.mkdir()
    monkeypatch.setenv("L2C_TUNED_TABLE", str(path))
    with caplog.at_level("WARNING", logger="l2c.dispatch"):
        assert table_for_arch("sm_90") == (None, None)
    assert len(caplog.records) == 1 and str(path) in caplog.text and "runs torch" in caplog.text
    dispatcher = Dispatcher(None)
    a, b = torch.randn(4, 3), torch.randn(3, 2)
    torch.testing.assert_close(dispatcher.matmul(a, b), a @ b)


def test_malformed_entries_are_skipped_and_the_rest_served(tmp_path, monkeypatch, caplog):
    from l2c.dispatch import table_for_arch
    good = entry(64, 64, 64).to_row()
    rows = [good, {**good, "spec": None}, {**good, "spec": 5}, {**good, "m": "64"}, {**good, "tflops": "fast"},
            {k: v for k, v in good.items() if k != "target"}, 5, None, {**good, "m_range": [128, 256]}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": 1, "arch": "sm_90", "entries": rows}))
    monkeypatch.setenv("L2C_TUNED_TABLE", str(path))
    with caplog.at_level("WARNING", logger="l2c.dispatch"):
        table = table_for_arch("sm_90").serving
    assert table is not None and table.skipped == len(rows) - 1 and len(table) == 1
    assert "8 malformed entries skipped" in caplog.text and "entries[1]" in caplog.text
    assert table.lookup("f16", "row,col,row", 64, 64, 64) is not None


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_out_of_the_wrong_dtype_is_refused_as_torch_refuses_it(activation):
    """l2c.matmul(out=) never casts: a tuned kernel declines a mismatched out, and torch's path raises."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a = torch.randn(32, 40, dtype=torch.float16)
    w = torch.randn(48, 40, dtype=torch.float16)
    with pytest.raises(RuntimeError):
        torch.matmul(a, w.t(), out=torch.empty(32, 48, dtype=torch.float32))
    with pytest.raises(RuntimeError):
        l2c.matmul(a, w.t(), activation=activation, out=torch.empty(32, 48, dtype=torch.float32))
    good = torch.empty(32, 48, dtype=torch.float16)
    assert l2c.matmul(a, w.t(), activation=activation, out=good) is good
    set_tuned_table(None)


def test_online_tuning_times_candidates_once_and_later_processes_reuse_the_decision(tmp_path, monkeypatch):
    """L2C_TUNE=online on a shape no table holds: the first call runs torch while the worker (a real process, the
    Triton interpreter) builds, verifies and times candidates; the decision is persisted per GPU, driver and l2c
    version, served from then on, reused by a new dispatcher (a later process) without tuning, and not reused
    under another l2c version. The margins are 0 here: on the CPU no interpreted kernel beats torch."""
    from l2c.online import Decisions, candidate_specs, decision_settings
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("L2C_TUNE_MARGIN", "0")
    monkeypatch.setenv("L2C_TUNE_EAGER_MARGIN", "0")
    monkeypatch.setenv("L2C_TUNE_TARGETS", "cutlass,triton")   # the interpreter runs Triton's candidates only
    assert candidate_specs("f16", "row,col,row", 2, 48, 64) and not candidate_specs("f16", "row,col,row", 64, 48, 64)
    dispatcher = set_tuned_table(None, allow_cpu=True, online=True)
    a = torch.randn(2, 64, dtype=torch.float16)
    w = torch.randn(48, 64, dtype=torch.float16)
    expect = a.float() @ w.float().t()
    torch.testing.assert_close(l2c.matmul(a, w.t()).float(), expect, atol=2e-2, rtol=2e-2)
    assert dispatcher.stats == {"tuned": 0, "fallback": 1}
    assert dispatcher.wait(timeout=600)
    torch.testing.assert_close(l2c.matmul(a, w.t()).float(), expect, atol=2e-2, rtol=2e-2)
    assert dispatcher.stats == {"tuned": 1, "fallback": 1}
    signature = Decisions.signature("f16", "row,col,row", 2, 48, 64, False, "none")
    decided, spec = Decisions("cpu", "none", **decision_settings()).get(signature)
    assert decided and "family=gemv" in spec
    timings = dispatcher.online_timings[signature]   # every verified candidate's speedup, the winner's too
    assert spec in timings and all(isinstance(v, float) and v > 0 for v in timings.values())
    later = set_tuned_table(None, allow_cpu=True, online=True)          # a new process: the decision is on disk
    l2c.matmul(a, w.t())
    assert later.stats == {"tuned": 1, "fallback": 0} and not later.preparer.replies
    settings = decision_settings()
    assert not Decisions("cpu", "none", version="0.0.0-other", **settings).entries   # another l2c starts afresh
    from l2c import cache
    assert Decisions("cpu", "none", **settings).records.key["l2c"] == cache.code_identity()   # its code, too
    assert cache.code_identity().startswith(l2c.__version__ + "+")
    assert not Decisions("cpu", "other-driver", **settings).entries
    monkeypatch.setenv("L2C_TUNE_MARGIN", "1.05")   # decided under another margin: tuned again
    assert not Decisions("cpu", "none", **decision_settings()).entries
    set_tuned_table(None)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(8, 20000), k=st.integers(8, 20000))
def test_online_candidates_are_the_tables_nearest_kernels_first(m, n, k):
    """Online tuning times the kernels of the table's entries nearest the call's shape first (log distance, none
    inside a range or cell), each kernel once and shape-generic, in the call's dtype and layouts only, then the
    Triton GEMV candidates of few rows."""
    from l2c.online import NEAREST, candidate_specs, distance, nearest_kernels
    shapes = [(1, 64, 64), (16, 4096, 4096), (128, 1024, 8192), (2048, 2048, 2048), (8192, 512, 64), (64, 8192, 256),
              (4, 16384, 1024), (512, 12288, 12288)]
    entries = [entry(mm, nn, kk, spec=KernelSpec(name=f"e{i}", tile_m=16, tile_n=16, tile_k=16, layout_b="col",
                                                 swizzle_group=1, launch_warps=4, pipeline_stages=2 + i % 4))
               for i, (mm, nn, kk) in enumerate(shapes)]
    entries.append(entry(300, 300, 300, spec=KernelSpec(name="ranged", tile_m=32, tile_n=32, tile_k=32,
                                                        layout_b="col", swizzle_group=1, launch_warps=4),
                         m_range=(100, 900)))
    entries.append(entry(64, 64, 64, spec=KernelSpec(name="other_layout", tile_m=64, tile_n=64, tile_k=32),
                         layout="row,row,row"))
    table = TunedTable(entries)
    near = nearest_kernels(table, "f16", "row,col,row", m, n, k)
    assert len(near) == min(NEAREST, len(shapes) + 1) and len(set(near)) == len(near)
    assert all("other_layout" not in t and "m=any n=any k=any" in t for t in near)
    by_name = {e.spec_text.split()[1]: e for e in entries}
    gaps = [distance(by_name[t.split()[1]], m, n, k) for t in near]
    assert gaps == sorted(gaps)
    assert min(distance(e, m, n, k) for e in entries[:-1]) == gaps[0]
    assert distance(entries[-2], 500, 300, 300) == 0.0 and distance(entries[-2], 1800, 300, 300) > 0.0
    texts = candidate_specs("f16", "row,col,row", m, n, k, table, targets=("cutlass", "triton"))
    assert [t.split()[1] for t in texts[:len(near)]] == [t.split()[1] for t in near]
    gemv = [t for t in texts[len(near):]]
    assert bool(gemv) == (m <= 16) and all("target   triton" in t for t in gemv)
    assert candidate_specs("f16", "row,col,row", m, n, k, table, targets=("cutlass",)) == []   # all Triton here


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, 4096), n=st.integers(8, 8192), k=st.integers(8, 8192))
def test_online_choice_times_only_kernels_the_cpp_call_table_launches_by_default(monkeypatch, m, n, k):
    """By default (`L2C_TUNE_TARGETS` unset: cutlass) the candidates are the table's nearest CUTLASS kernels alone,
    however near its Triton kernels lie, and no Triton decoding candidate: an eager call of a Triton choice is
    launched from Python, dearer than torch's own."""
    from l2c.online import NEAREST, candidate_specs
    monkeypatch.delenv("L2C_TUNE_TARGETS", raising=False)
    near, far = ((m, n, k), (2 * m, n, k), (m, 2 * n, k)), ((8 * m, n, k), (m, 8 * n, k), (m, n, 8 * k))
    entries = [entry(mm, nn, kk, target=target, spec=KernelSpec(name=f"{target}{i}", target=target, tile_m=64,
                                                                tile_n=64, tile_k=64, layout_b="col",
                                                                pipeline_stages=2 + i))
               for target, shapes in (("triton", near), ("cutlass", far)) for i, (mm, nn, kk) in enumerate(shapes)]
    texts = candidate_specs("f16", "row,col,row", m, n, k, TunedTable(entries))
    assert len(texts) == min(NEAREST, 3) and all("target   cutlass" in t for t in texts)


def test_online_choice_with_nothing_to_time_sends_the_shape_to_torch_from_the_first_test(tmp_path, monkeypatch):
    """Under the default targets a shape near only Triton kernels has no candidate: it is torch's from its first call
    on (the first test's maps hold its M as torch's, no job goes to the worker); with Triton among the targets the
    same call hands the worker a tuning job."""
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("L2C_TUNE_TARGETS", raising=False)
    table = TunedTable([entry(32, 48, 64)])   # a Triton entry at M = 32 only
    a, w = torch.randn(2, 64, dtype=torch.float16), torch.randn(48, 64, dtype=torch.float16)
    dispatcher = set_tuned_table(table, allow_cpu=True, online=True)
    torch.testing.assert_close(l2c.matmul(a, w.t()), a @ w.t())
    assert 2 in dispatcher.served_kn[torch.float16][1][64, 48].torch_ms and not dispatcher._jobs
    l2c.matmul(a, w.t())
    assert dispatcher.stats == {"tuned": 0, "fallback": 2} and not dispatcher.preparer.replies
    monkeypatch.setenv("L2C_TUNE_TARGETS", "cutlass,triton")
    dispatcher = set_tuned_table(table, allow_cpu=True, online=True)
    l2c.matmul(a, w.t())
    assert any(key[0] == "online" for key in dispatcher._jobs)
    assert dispatcher.wait(timeout=600)
    set_tuned_table(None)


def test_a_persisted_decision_of_a_target_not_timed_now_is_not_served(tmp_path, monkeypatch):
    """A Triton decision persisted while Triton was among the targets is not served by a process whose targets leave
    Triton out (it is timed again among those targets: here none, so torch), and is served where Triton is in."""
    from l2c.online import Decisions, candidate_specs, decision_settings
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("L2C_TUNE_TARGETS", "cutlass,triton")
    spec = candidate_specs("f16", "row,col,row", 2, 48, 64, targets=("triton",))[0]
    Decisions("cpu", "none", **decision_settings()).record(
        Decisions.signature("f16", "row,col,row", 2, 48, 64, False, "none"), spec, 1.2)
    monkeypatch.delenv("L2C_TUNE_TARGETS")
    a, w = torch.randn(2, 64, dtype=torch.float16), torch.randn(48, 64, dtype=torch.float16)
    dispatcher = set_tuned_table(None, allow_cpu=True, online=True)
    torch.testing.assert_close(l2c.matmul(a, w.t()), a @ w.t())
    assert dispatcher.wait(timeout=600)
    l2c.matmul(a, w.t())
    assert dispatcher.stats == {"tuned": 0, "fallback": 2} and not dispatcher._kernels
    monkeypatch.setenv("L2C_TUNE_TARGETS", "cutlass,triton")
    dispatcher = set_tuned_table(None, allow_cpu=True, online=True)
    l2c.matmul(a, w.t())
    assert dispatcher.wait(timeout=600)
    expect = a.float() @ w.float().t()
    torch.testing.assert_close(l2c.matmul(a, w.t()).float(), expect, atol=2e-2, rtol=2e-2)
    assert dispatcher.stats["tuned"] == 1
    set_tuned_table(None)


def test_a_malformed_overlap_setting_is_reported_and_kernels_launch_as_by_default(monkeypatch, caplog, tmp_path):
    """`L2C_OVERLAP` other than one of its choices: the default dispatcher warns once (a user's call never raises
    for it), an explicit dispatcher and `l2c bench` through it refuse it, and a CUTLASS kernel launches as with
    the default rather than failing its construction (which would leave every call to torch)."""
    from l2c import dispatch
    from l2c.cli import main
    from l2c.rules import ValidSpec
    from l2c.targets.cutlass.kernel import overlaps
    from l2c.validate import validate
    valid = validate(KernelSpec(name="b", target="cutlass", tile_m=64, tile_n=64, tile_k=64,
                                launch_schedule="basic"), "cutlass")
    assert isinstance(valid, ValidSpec) and overlaps(valid) is True
    monkeypatch.setenv("L2C_OVERLAP", "1")
    assert overlaps(valid) is True
    monkeypatch.setattr(dispatch, "_default", None)
    with caplog.at_level("WARNING", logger="l2c"):
        dispatch.default_dispatcher()
    assert "L2C_OVERLAP='1': expected measured, measured-any, all or 0; using measured" in caplog.text
    with pytest.raises(ValueError, match="expected measured, measured-any, all or 0"):
        set_tuned_table(None)
    assert main(["bench", "dispatch", "--shapes", "offgrid", "--limit", "1", "--device", "cpu",
                 "-o", str(tmp_path / "r.jsonl")]) == 2
    monkeypatch.setenv("L2C_OVERLAP", "0")
    assert overlaps(valid) is False
    monkeypatch.delenv("L2C_OVERLAP")
    set_tuned_table(None)


def test_a_malformed_tune_targets_setting_turns_online_choice_off_with_a_warning(monkeypatch, caplog):
    """`L2C_TUNE_TARGETS` naming no target: the default dispatcher warns once and serves without online choice (a
    user's call never raises for it); an explicit dispatcher asking for online choice raises the same message."""
    from l2c import dispatch
    monkeypatch.setenv("L2C_TUNE", "online")
    monkeypatch.setenv("L2C_TUNE_TARGETS", "cuda")
    monkeypatch.setattr(dispatch, "_default", None)
    with caplog.at_level("WARNING", logger="l2c"):
        dispatcher = dispatch.default_dispatcher()
    assert dispatcher.online is False and "L2C_TUNE_TARGETS='cuda'" in caplog.text
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    torch.testing.assert_close(l2c.matmul(a, b), a @ b)
    with pytest.raises(ValueError, match="expected a comma-separated list of cutlass, triton"):
        set_tuned_table(None, online=True)
    monkeypatch.delenv("L2C_TUNE")
    set_tuned_table(None)


def test_a_triton_candidate_that_loses_an_eager_call_is_not_chosen(tmp_path, monkeypatch):
    """A Triton candidate that beats the device-time margin (0 here) still serves only if its eager call, launched
    from Python, is not slower than torch's (`L2C_TUNE_EAGER_MARGIN`, default 1.0). On the CPU the interpreted
    kernel loses every eager call, so with the default torch keeps the shape; with the eager margin at 0 it wins."""
    from l2c.online import candidate_specs, tune_one
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("L2C_TUNE_MARGIN", "0")
    candidates = candidate_specs("f16", "row,col,row", 2, 48, 64, targets=("triton",))[:1]
    best, speedup, note, timings, timed = tune_one(candidates, 2, 48, 64, False, "none", "cpu")
    assert best is None and speedup is None and note.startswith("1 timed, 1 lost an eager call"), note
    assert timings == {} and timed == 1   # no evidence of a win either: its callers would lose
    monkeypatch.setenv("L2C_TUNE_EAGER_MARGIN", "0")
    best, speedup, note, timings, timed = tune_one(candidates, 2, 48, 64, False, "none", "cpu")
    assert best is not None and "family=gemv" in best and speedup > 0 and note == "1 timed"
    assert timings[best] == speedup


def test_online_tuning_leaves_empty_products_to_torch(tmp_path, monkeypatch):
    """M, N or K of 0 under online tuning: torch's empty (or zero) result, no candidates asked for (their distance to
    the table's shapes has no logarithm)."""
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    dispatcher = set_tuned_table(TunedTable([entry(64, 64, 32)]), allow_cpu=True, online=True)
    for m, n, k in ((0, 64, 32), (8, 0, 32), (8, 64, 0)):
        a, w = torch.randn(m, k, dtype=torch.float16), torch.randn(n, k, dtype=torch.float16)
        torch.testing.assert_close(l2c.matmul(a, w.t()), a @ w.t())
        torch.testing.assert_close(dispatcher.linear(a, w), F.linear(a, w))
    assert not dispatcher.preparer.replies and dispatcher.stats["tuned"] == 0
    set_tuned_table(None)


def test_a_persisted_online_decision_is_not_built_on_the_calling_thread(tmp_path, monkeypatch):
    """A later process meets a decision whose CUTLASS library is no longer in the build cache (nor in a pack): its
    calls run torch while the worker prepares it, and the calling thread never starts a build."""
    from l2c.online import Decisions, decision_settings
    from tests.test_pack import _hide_nvcc
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("L2C_PACK", str(tmp_path / "no_pack.zip"))
    _hide_nvcc(monkeypatch, tmp_path)
    spec = KernelSpec(name="evicted", target="cutlass", tile_m=64, tile_n=64, tile_k=64, layout_b="col").to_l2()
    Decisions("cpu", "none", **decision_settings()).record(
        Decisions.signature("f16", "row,col,row", 32, 48, 64, False, "none"), spec, 1.2)
    dispatcher = set_tuned_table(None, allow_cpu=True, online=True)
    a = torch.randn(32, 64, dtype=torch.float16)
    w = torch.randn(48, 64, dtype=torch.float16)
    torch.testing.assert_close(l2c.matmul(a, w.t()).float(), a.float() @ w.float().t(), atol=2e-2, rtol=2e-2)
    assert dispatcher.stats == {"tuned": 0, "fallback": 1}
    assert not dispatcher._kernels                      # nothing built here: the worker has the job
    assert dispatcher.wait(timeout=600)
    l2c.matmul(a, w.t())
    assert dispatcher.stats == {"tuned": 0, "fallback": 2} and not dispatcher._kernels   # it failed there: torch
    set_tuned_table(None)


def test_online_tuning_never_compiles_a_cutlass_candidate(tmp_path, monkeypatch):
    """A CUTLASS candidate neither in the build cache nor in the prebuilt pack is skipped by the online worker: no
    compiler runs while a call waits to be tuned (the cache stays empty)."""
    from l2c.online import tune_one
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("L2C_PACK", str(tmp_path / "no_pack.zip"))
    spec = KernelSpec(name="never_built", target="cutlass", tile_m=64, tile_n=64, tile_k=64, layout_b="col")
    best, speedup, note, timings, timed = tune_one([spec.to_l2()], 64, 64, 64, False, "none", "cpu")
    assert (best, speedup, timings, timed) == (None, None, {}, 0) and note.startswith("0 timed")
    assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.cu"))


def test_importing_the_dispatcher_asks_for_the_toolchains_off_the_calling_thread():
    """At import, l2c.dispatch builds the parser and templates and starts a thread that builds CUTLASS's call-plan
    shim and asks each target for its toolchain id (nvcc's version), so the first tuned call finds them cached; a
    fresh process shows the thread ran to the end (the CUTLASS version, part of that id, and the shim are cached)
    and printed nothing."""
    import subprocess
    import sys
    code = ("import threading, l2c.dispatch\n"
            "[t.join(60) for t in threading.enumerate() if t.name == 'l2c-start-up']\n"
            "from l2c.grammar import lark_parser\n"
            "from l2c.targets.cutlass.toolchain import cutlass_version\n"
            "from l2c.targets.cutlass.shim import shim_library\n"
            "print(lark_parser.cache_info().currsize, cutlass_version.cache_info().currsize,\n"
            "      shim_library.cache_info().currsize)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["1", "1", "1"], done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_a_served_out_is_written_as_torch_writes_it():
    """`out=` at a served shape: autograd sees the write (a tensor saved for backward then fails backward, as with
    torch); an out that requires grad, overlaps itself or lives elsewhere goes to torch, which refuses it."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    buf = torch.zeros(32, 48, dtype=torch.float16)
    p = torch.ones(32, 48, dtype=torch.float16, requires_grad=True)
    z = (p * buf).sum()
    assert l2c.matmul(a, w.t(), out=buf) is buf and dispatcher.stats["tuned"] == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    for bad in (torch.empty(32, 48, dtype=torch.float16, requires_grad=True),
                torch.empty(1, 48, dtype=torch.float16).expand(32, 48)):
        with pytest.raises(RuntimeError):
            torch.matmul(a, w.t(), out=bad)
        with pytest.raises(RuntimeError):
            l2c.matmul(a, w.t(), out=bad)
    assert dispatcher.stats["tuned"] == 1
    set_tuned_table(None)


def test_an_inference_out_outside_inference_mode_is_refused_at_a_served_shape():
    """An `out=` made under torch.inference_mode() is not written by a served kernel outside it: torch refuses that
    in-place update, and so does l2c.matmul (inside inference mode the kernel serves it)."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    with torch.inference_mode():
        out = torch.zeros(32, 48, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="inference tensor"):
        torch.matmul(a, w.t(), out=out)
    with pytest.raises(RuntimeError, match="inference tensor"):
        l2c.matmul(a, w.t(), out=out)
    assert dispatcher.stats["tuned"] == 0
    with torch.inference_mode():
        assert l2c.matmul(a, w.t(), out=out) is out
    assert dispatcher.stats["tuned"] == 1
    torch.testing.assert_close(out.float(), a.float() @ w.float().t(), atol=2e-2, rtol=2e-2)
    set_tuned_table(None)


def test_operands_of_a_tensor_subclass_are_torchs():
    """A subclass (a wrapper such as DTensor has no memory of its own to launch on; torch's op honours the type) is
    served by torch, with torch's result and type, at a shape a kernel serves."""
    class Tagged(torch.Tensor):
        pass

    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    tagged = a.as_subclass(Tagged)
    y = l2c.matmul(tagged, w.t())
    assert type(y) is Tagged and torch.equal(y.as_subclass(torch.Tensor), torch.matmul(a, w.t()))
    assert dispatcher.stats == {"tuned": 0, "fallback": 1}
    l2c.matmul(a, w.t())
    assert dispatcher.stats["tuned"] == 1
    set_tuned_table(None)


def test_an_entry_serves_plain_calls_with_the_plain_epilogue_and_the_operands_type():
    """A table entry whose own spec scales (alpha), reads C or stores another type serves `a @ b` as torch computes
    it: the served spec is the plain one."""
    from l2c.tuned_table import served_spec
    odd = KernelSpec(name="odd", problem_m=32, problem_n=48, problem_k=40, tile_m=16, tile_n=16, tile_k=16,
                     layout_b="col", swizzle_group=1, launch_warps=4, epilogue_alpha=2.0, epilogue_beta=0.5,
                     types_c="f32")
    spec = served_spec(entry(32, 48, 40, spec=odd), 32, False, "none")
    assert (spec.epilogue_alpha, spec.epilogue_beta, spec.types_c) == (1.0, 0.0, "f16")
    assert served_spec(entry(32, 48, 40, spec=odd), 32, False, "none", residual=True).epilogue_beta == 1.0
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40, spec=odd)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    y = l2c.matmul(a, w.t())
    assert dispatcher.stats["tuned"] == 1 and y.dtype == torch.float16
    torch.testing.assert_close(y.float(), a.float() @ w.float().t(), atol=2e-2, rtol=2e-2)
    set_tuned_table(None)


def test_replace_linears_keeps_the_modules_parameters_and_hooks():
    """The swap changes only the class: tied weights stay one Parameter, frozen ones frozen, hooks still run."""
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10, bias=False), torch.nn.Linear(8, 8))
    model[1].weight = model[0].weight                    # tied, as a language model's head and embedding
    model[2].requires_grad_(False)
    seen = []
    model[2].register_forward_hook(lambda module, args, out: seen.append(out.shape))
    l2c.nn.replace_linears(model)
    assert type(model[1]) is l2c.nn.Linear and type(model[2]) is l2c.nn.Linear
    assert model[1].weight is model[0].weight and not model[2].weight.requires_grad
    model[2](torch.randn(3, 8))
    assert seen == [torch.Size([3, 8])]
    copy = l2c.nn.Linear.from_linear(torch.nn.Linear(8, 8).requires_grad_(False))
    assert not copy.weight.requires_grad and copy.weight.device.type == "cpu"


def test_autocast_to_another_dtype_is_torchs_in_a_compiled_graph_too():
    """torch.compile traces l2c.matmul as torch's op where autocast would cast (the custom op would run in the
    operands' dtype): the compiled result has autocast's dtype, as eager l2c and torch do."""
    torch._dynamo.reset()
    set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    f = torch.compile(lambda x, y: l2c.matmul(x, y.t()), backend="aot_eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, expect = f(a, w), torch.matmul(a, w.t())
    assert y.dtype == expect.dtype == torch.bfloat16
    torch.testing.assert_close(y, expect)
    assert f(a, w).dtype == torch.float16
    set_tuned_table(None)
    torch._dynamo.reset()


def test_autocast_of_mixed_operands_is_torchs_in_a_compiled_graph():
    """Activations already in autocast's dtype with float32 weights and bias (mixed precision after the first layer):
    autocast casts b and the bias too, so a compiled call is traced as torch's ops and returns autocast's dtype, as
    eager l2c and torch do; with an activation, the bias is still added by addmm (cast, not promoted)."""
    torch._dynamo.reset()
    set_tuned_table(TunedTable([entry(32, 48, 40, dtype="bf16")]), allow_cpu=True, prepare="inline")
    x = torch.randn(32, 40, dtype=torch.bfloat16)
    w, bias = torch.randn(48, 40), torch.randn(48)
    layer = l2c.nn.Linear(40, 48, activation="relu")
    layer.load_state_dict({"weight": w, "bias": bias})
    calls = {"bias": lambda x: l2c.matmul(x, w.t(), bias=bias), "plain": lambda x: l2c.matmul(x, w.t()),
             "layer": layer}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expect = {"bias": F.linear(x, w, bias), "plain": F.linear(x, w), "layer": F.relu(F.linear(x, w, bias))}
        for name, call in calls.items():
            torch._dynamo.reset()
            y = torch.compile(call, fullgraph=True, backend="aot_eager")(x)
            assert y.dtype == torch.bfloat16, name
            torch.testing.assert_close(y, expect[name], rtol=2e-2, atol=2e-2)
    set_tuned_table(None)
    torch._dynamo.reset()


def test_inline_preparation_verifies_a_kernel_at_every_shape_it_serves(monkeypatch, tmp_path):
    """L2C_PREPARE=inline: a kernel built and verified at one M of a range is verified again at each other M before
    it serves there; a kernel wrong at the new shape is not served (torch is), and the user's result is right."""
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40, m_range=(16, 40))]), allow_cpu=True,
                                 prepare="inline")
    w = torch.randn(48, 40, dtype=torch.float16)
    a = torch.randn(32, 40, dtype=torch.float16)
    l2c.matmul(a, w.t())
    assert dispatcher.stats == {"tuned": 1, "fallback": 0}
    (key, kernel), = [(k, v) for k, v in dispatcher._kernels.items() if v is not None]

    class WrongElsewhere:   # the built kernel, off by one at every M but the one it was verified at
        valid = kernel.valid

        def __call__(self, a, b, c=None, bias=None, out=None):
            y = kernel(a, b, c=c, bias=bias, out=out)
            if a.shape[0] != 32:
                y[0, 0] += 1
            return y

        def call_planned(self, key, a, b, bias=None):
            return self(a, b, bias=bias)

    dispatcher._kernels[key] = WrongElsewhere()
    other = torch.randn(24, 40, dtype=torch.float16)
    y = l2c.matmul(other, w.t())
    torch.testing.assert_close(y, torch.matmul(other, w.t()))
    assert dispatcher.stats == {"tuned": 1, "fallback": 1}
    set_tuned_table(None)


def test_inline_preparation_verifies_nothing_inside_a_capture_even_for_a_kernel_built_already(monkeypatch, tmp_path):
    """A verification synchronizes, which would end the user's CUDA-graph capture: a kernel built at one M of its
    range is not verified at another M while the stream captures (the capture is simulated: this machine has no
    GPU); torch serves that call and a later eager call prepares it."""
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40, m_range=(16, 40))]), allow_cpu=True,
                                 prepare="inline")
    w, a = torch.randn(48, 40, dtype=torch.float16), torch.randn(32, 40, dtype=torch.float16)
    l2c.matmul(a, w.t())   # built and verified at M = 32, eagerly
    (built,) = [key for key, kernel in dispatcher._kernels.items() if kernel is not None]
    job = dispatcher._job(dispatcher.table.lookup("f16", "row,col,row", 24, 48, 40),
                          ("f16", "row,col,row", 24, 48, 40, False, "none", "cuda"))
    assert (job.spec_text, job.target, job.arch) == built and job.device == "cuda"
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert dispatcher._prepared(job) == (None, False)
    set_tuned_table(None)


def test_a_failure_while_preparing_a_kernel_leaves_the_call_to_torch(monkeypatch, tmp_path, caplog):
    """Preparing a kernel never fails the user's call: with a cache that cannot be written (a file where a folder
    must be, as a read-only or full disk), l2c.matmul returns torch's result, warns once, and keeps torch for that
    signature."""
    import logging
    (tmp_path / "verified").write_text("not a folder")
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    with caplog.at_level(logging.WARNING, logger="l2c.dispatch"):
        for _ in range(2):
            torch.testing.assert_close(l2c.matmul(a, w.t()), torch.matmul(a, w.t()))
    assert caplog.text.count("preparing its kernel failed") == 1
    assert dispatcher.stats["fallback"] == 2
    set_tuned_table(None)


def test_a_job_past_the_preparation_timeout_stops_its_worker_and_leaves_torch(tmp_path, monkeypatch):
    """A job that takes longer than L2C_PREPARE_TIMEOUT_S (here the worker's own start: Python and torch) ends
    failed, its worker stopped, so waiting never hangs and torch serves; the next job gets a new worker."""
    from l2c.prepare import FAILED, READY
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("L2C_PREPARE_TIMEOUT_S", "0.3")
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40), entry(16, 48, 40)]), allow_cpu=True,
                                 prepare="background")
    w = torch.randn(48, 40, dtype=torch.float16)
    l2c.matmul(torch.randn(32, 40, dtype=torch.float16), w.t())
    assert dispatcher.wait(timeout=120)
    (job,) = dispatcher.preparer.replies
    assert dispatcher.preparer._state[job] == FAILED and "L2C_PREPARE_TIMEOUT_S" in dispatcher.preparer._reasons[job]
    monkeypatch.setenv("L2C_PREPARE_TIMEOUT_S", "300")
    a = torch.randn(16, 40, dtype=torch.float16)
    l2c.matmul(a, w.t())
    assert dispatcher.wait(timeout=300)
    assert sorted(dispatcher.preparer._state.values()) == sorted([FAILED, READY])
    torch.testing.assert_close(l2c.matmul(a, w.t()).float(), a.float() @ w.float().t(), atol=2e-2, rtol=2e-2)
    assert dispatcher.stats["tuned"] == 1
    set_tuned_table(None)


def test_an_online_job_the_worker_failed_on_is_no_persisted_decision(tmp_path, monkeypatch):
    """A worker that fails an online-tuning job (here it runs out of L2C_PREPARE_TIMEOUT_S) leaves torch serving in
    this process and no decision on disk: a later process tunes the shape again, as a crash or an out-of-memory
    candidate is no evidence that torch is faster."""
    from l2c.online import Decisions, decision_settings
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("L2C_TUNE_TARGETS", "cutlass,triton")
    monkeypatch.setenv("L2C_PREPARE_TIMEOUT_S", "0.3")
    dispatcher = set_tuned_table(None, allow_cpu=True, online=True)
    a, w = torch.randn(2, 64, dtype=torch.float16), torch.randn(48, 64, dtype=torch.float16)
    for _ in range(2):
        torch.testing.assert_close(l2c.matmul(a, w.t()), torch.matmul(a, w.t()))
        assert dispatcher.wait(timeout=120)
    assert dispatcher.stats == {"tuned": 0, "fallback": 2}
    assert not Decisions("cpu", "none", **decision_settings()).entries
    set_tuned_table(None)


def test_a_kernel_that_declines_a_signature_is_not_asked_again_for_it(monkeypatch, tmp_path):
    """A kernel that declines what a call's signature fixes (SignatureDeclined: strides TMA cannot take) declines
    every call of that signature: torch serves the later ones without the kernel's checks. A decline of one call (a
    misaligned pointer: a plain ValueError) is asked again at the next call."""
    from l2c.errors import SignatureDeclined
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    l2c.matmul(a, w.t())
    (key, kernel), = [(k, v) for k, v in dispatcher._kernels.items() if v is not None]
    asked = []

    class Declining:
        valid = kernel.valid

        def __init__(self, error):
            self.error = error

        def __call__(self, a, b, c=None, bias=None, out=None):
            asked.append(self.error)
            raise self.error("declined")

        def call_planned(self, key, a, b, bias=None):
            return self(a, b, bias=bias)

    for error, calls in ((SignatureDeclined, 1), (ValueError, 3)):
        asked.clear()
        dispatcher._kernels[key] = Declining(error)
        dispatcher._by_call.clear()
        dispatcher._served.clear()
        for _ in range(3):
            torch.testing.assert_close(l2c.matmul(a, w.t()), torch.matmul(a, w.t()), rtol=0, atol=0)
        assert len(asked) == calls, error
    set_tuned_table(None)


def test_a_cutlass_kernel_declines_by_signature_what_its_signature_fixes():
    """What the CUTLASS runtime checks from shapes and strides alone is SignatureDeclined (the dispatcher stops
    asking); a misaligned pointer only declines that call."""
    from l2c.errors import SignatureDeclined
    from l2c.targets.cutlass.kernel import _leading_dims
    wide = torch.zeros(64, 72, dtype=torch.float16)
    with pytest.raises(SignatureDeclined, match="multiples of 16 bytes"):
        _leading_dims("b", torch.zeros(64, 77, dtype=torch.float16)[:, :4], "row")   # leading dimension 154 bytes
    with pytest.raises(SignatureDeclined, match="row-major"):
        _leading_dims("b", wide.t(), "row")
    with pytest.raises(ValueError) as caught:
        _leading_dims("b", torch.zeros(64 * 72 + 1, dtype=torch.float16)[1:].view(64, 72), "row")
    assert not isinstance(caught.value, SignatureDeclined)


def test_a_cutlass_kernel_declines_sizes_its_c_entry_points_cannot_hold():
    """M, N, K and batch are C ints in the CUTLASS entry points: a size of 2^31 or more is declined (ctypes would
    wrap it silently to a small one)."""
    from l2c.errors import SignatureDeclined
    from l2c.targets.cutlass.kernel import _check_sizes
    _check_sizes(2 ** 31 - 1, 8, 8, 1)
    for sizes in ((2 ** 31, 8, 8, 1), (8, 2 ** 32 + 8, 8, 1), (8, 8, 2 ** 40, 1), (8, 8, 8, 2 ** 31)):
        with pytest.raises(SignatureDeclined, match="below 2"):
            _check_sizes(*sizes)


def test_the_shipped_table_serves_only_the_gpu_it_was_measured_on(monkeypatch, caplog):
    """The shipped sm_90 table's wins are H200 measurements: on an sm_90 GPU no table ships for (an H20) l2c runs
    torch, with one warning naming both and how to time its kernels there (online choice, which then has them as
    its candidates); L2C_TUNED_TABLE uses a table as it is."""
    import logging
    from l2c.dispatch import default_table_path, table_for_arch
    monkeypatch.delenv("L2C_TUNED_TABLE", raising=False)
    shipped, kernels = table_for_arch("sm_90", "NVIDIA H200")
    assert shipped is not None and shipped is kernels and shipped.gpu == "NVIDIA H200" and len(shipped) > 0
    for online in (False, True):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="l2c.dispatch"):
            serving, kernels = table_for_arch("sm_90", "NVIDIA H20", online)
        assert serving is None and kernels is not None and len(kernels) == len(shipped)
        assert len(caplog.records) == 1 and "measured on NVIDIA H200, not this NVIDIA H20" in caplog.text
        assert ("online choice times its kernels on this GPU" if online else "L2C_TUNE=online") in caplog.text
    monkeypatch.setenv("L2C_TUNED_TABLE", str(default_table_path("sm_90")))
    assert table_for_arch("sm_90", "NVIDIA H20").serving is not None


def test_a_gpu_gets_the_table_shipped_for_it_and_online_choice_times_the_arch_tables_kernels(monkeypatch, caplog):
    """Where a table ships for this GPU's name (l2c/tuned/<arch>.<gpu slug>.json) it serves, with no warning; with
    online choice the candidates are the arch's table (every kernel it ships, not only those that won on this
    GPU); L2C_TUNED_TABLE still wins over both."""
    import logging
    from l2c.dispatch import default_table_path, gpu_slug, shipped_table_path, table_for_arch
    monkeypatch.delenv("L2C_TUNED_TABLE", raising=False)
    h100 = "NVIDIA H100 80GB HBM3"
    assert gpu_slug(h100) == "nvidia-h100-80gb-hbm3"
    assert shipped_table_path("sm_90", h100).name == "sm_90.nvidia-h100-80gb-hbm3.json"
    assert shipped_table_path("sm_90", "NVIDIA H200").name == shipped_table_path("sm_90").name == "sm_90.json"
    assert shipped_table_path("sm_100", h100) is None
    with caplog.at_level(logging.WARNING, logger="l2c.dispatch"):
        serving, kernels = table_for_arch("sm_90", h100)
        assert serving is not None and kernels is serving and serving.gpu == h100
        served = json.loads(shipped_table_path("sm_90", h100).read_text())["entries"][0]
        assert serving.lookup(served["dtype"], served["layout"], served["m"], served["n"], served["k"]) is not None
        serving, kernels = table_for_arch("sm_90", h100, online=True)
    assert not caplog.records
    general = table_for_arch("sm_90", "NVIDIA H200").serving
    assert serving.gpu == h100 and kernels.gpu == "NVIDIA H200" and len(kernels) == len(general)
    monkeypatch.setenv("L2C_TUNED_TABLE", str(default_table_path("sm_90")))
    assert default_table_path("sm_90", h100) == shipped_table_path("sm_90")
    serving, kernels = table_for_arch("sm_90", h100, online=True)
    assert serving.gpu == "NVIDIA H200" and kernels is serving


def test_every_gpu_table_shipped_names_the_gpu_of_its_file_name():
    """A table shipped as <arch>.<gpu slug>.json is what that GPU reads, so its recorded arch and GPU must be the
    file name's: a table filed under another GPU's name would be found there and then serve no call."""
    from l2c.dispatch import gpu_slug
    from l2c.pack import shipped_tables
    from l2c.tuned_table import load_table
    named = [p for p in shipped_tables() if p.name.count(".") == 2]
    assert named, "no GPU's own table ships"
    for path in named:
        arch, slug, _ = path.name.split(".")
        table = load_table(path)
        assert table.arch == arch and table.gpu is not None and gpu_slug(table.gpu) == slug, path.name


def test_a_table_measured_on_another_gpu_serves_nothing_but_its_kernels_are_online_candidates(tmp_path,
                                                                                               monkeypatch):
    """With the table only as online choice's candidates, its exact entry does not serve its shape (the first call
    is torch's and a tuning job goes to the worker, whose candidates are the table's kernel), and the decision's
    settings name that table; the same table serving, its entry serves the call."""
    from l2c.online import decision_settings
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("L2C_TUNE_TARGETS", "triton")
    only = entry(64, 48, 64)
    table = TunedTable([only])
    a, w = torch.randn(64, 64, dtype=torch.float16), torch.randn(48, 64, dtype=torch.float16)
    dispatcher = set_tuned_table(None, allow_cpu=True, online=True, candidates=table)
    torch.testing.assert_close(l2c.matmul(a, w.t()), a @ w.t())
    jobs = [job for key, job in dispatcher._jobs.items() if key[0] == "online"]
    assert dispatcher.stats == {"tuned": 0, "fallback": 1} and len(jobs) == 1
    assert [text.split()[1] for text in jobs[0].candidates] == [only.spec_text.split()[1]]
    assert dispatcher.decisions.records.key["table"] == decision_settings(table)["table"]
    assert dispatcher.wait(timeout=600)
    serving = set_tuned_table(table, allow_cpu=True, online=True, prepare="inline")
    out = l2c.matmul(a, w.t())
    torch.testing.assert_close(out.float(), a.float() @ w.float().t(), atol=2e-2, rtol=2e-2)
    assert serving.stats == {"tuned": 1, "fallback": 0} and not any(key[0] == "online" for key in serving._jobs)
    set_tuned_table(None)


def test_an_entry_is_served_by_the_figure_its_table_admitted_it_by():
    """The loader judges an entry by its row's `speedup` (what `l2c table` admitted it by: paired per repetition),
    not by the ratio of its median rates, which may fall either side of 1.0 for a tie; a row without one, by the
    ratio."""
    from l2c.tuned_table import entry_from_row
    row = {"m": 8, "n": 64, "k": 32, "dtype": "f16", "layout": "row,col,row", "target": "triton",
           "spec": KernelSpec(name="t", problem_m=8, problem_n=64, problem_k=32).to_l2(), "tflops": 0.996,
           "baseline_tflops": 1.0}
    admitted = TunedTable([entry_from_row(dict(row, speedup=1.0065))])
    assert admitted.lookup("f16", "row,col,row", 8, 64, 32).speedup == 1.0065
    assert TunedTable([entry_from_row(row)]).lookup("f16", "row,col,row", 8, 64, 32) is None
    assert TunedTable([entry_from_row(dict(row, tflops=1.2, speedup=0.99))]).lookup(
        "f16", "row,col,row", 8, 64, 32) is None


def test_a_persisted_decision_that_does_not_compute_its_calls_is_tuned_again(tmp_path, monkeypatch):
    """A decision record whose kernel computes something else than its signature's calls (a ReLU, an alpha: an
    edited or copied file) is no decision: those calls are tuned again, never served by it."""
    from l2c.online import Decisions, candidate_specs, decision_settings
    from l2c.parser import parse_one
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("L2C_TUNE_TARGETS", "cutlass,triton")
    signature = Decisions.signature("f16", "row,col,row", 2, 48, 64, False, "none")
    plain = candidate_specs("f16", "row,col,row", 2, 48, 64, targets=("triton",))[0]
    assert Decisions.fits(plain, "f16", "row,col,row", False, "none")
    for wrong in (dict(epilogue_activation="relu"), dict(epilogue_alpha=2.0), dict(types_c="f32")):
        text = parse_one(plain).replace(**wrong).to_l2()
        assert not Decisions.fits(text, "f16", "row,col,row", False, "none")
    Decisions("cpu", "none", **decision_settings()).record(
        signature, parse_one(plain).replace(epilogue_activation="relu").to_l2(), 1.2)
    dispatcher = set_tuned_table(None, allow_cpu=True, online=True)
    a, w = torch.randn(2, 64, dtype=torch.float16), -torch.ones(48, 64, dtype=torch.float16)
    for _ in range(2):
        torch.testing.assert_close(l2c.matmul(a, w.t()), a @ w.t())   # a ReLU kernel would zero the negatives
        assert dispatcher.wait(timeout=600)
    assert not dispatcher._kernels or all(k is None or "relu" not in k.valid.spec.to_l2()
                                          for k in dispatcher._kernels.values())
    set_tuned_table(None)


def test_an_online_job_that_timed_nothing_persists_no_decision(tmp_path, monkeypatch):
    """When every candidate is skipped (a CUTLASS library neither built nor packed) the job measured nothing: torch
    serves in this process and no "torch" decision is kept for later processes."""
    from l2c.online import Decisions, decision_settings
    from tests.test_pack import _hide_nvcc
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("L2C_PACK", str(tmp_path / "no_pack.zip"))
    _hide_nvcc(monkeypatch, tmp_path)
    spec = KernelSpec(name="unbuilt", target="cutlass", tile_m=64, tile_n=64, tile_k=64, layout_b="col")
    dispatcher = set_tuned_table(TunedTable([entry(64, 48, 64, spec=spec, target="cutlass")]), allow_cpu=True,
                                 online=True)
    a, w = torch.randn(32, 64, dtype=torch.float16), torch.randn(48, 64, dtype=torch.float16)
    for _ in range(2):
        torch.testing.assert_close(l2c.matmul(a, w.t()), a @ w.t())
        assert dispatcher.wait(timeout=600)
    assert not Decisions("cpu", "none", **decision_settings(dispatcher.table)).entries
    set_tuned_table(None)


def test_online_choice_with_a_cache_that_cannot_be_made_warns_and_runs_torch(tmp_path, monkeypatch, caplog):
    """L2C_TUNE=online with a cache folder that cannot be made (a file where it must be): one warning, online
    choice off, every call torch's; never an exception in the user's call."""
    import logging
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path / "file" / "cache"))
    with caplog.at_level(logging.WARNING, logger="l2c.dispatch"):
        dispatcher = set_tuned_table(None, allow_cpu=True, online=True)
    assert not dispatcher.online and "online choice off" in caplog.text
    a, w = torch.randn(2, 64, dtype=torch.float16), torch.randn(48, 64, dtype=torch.float16)
    torch.testing.assert_close(l2c.matmul(a, w.t()), a @ w.t())
    set_tuned_table(None)


@pytest.mark.parametrize("dynamic", [True, None])
def test_a_bias_free_layer_served_by_a_range_compiles_with_a_symbolic_token_count(tmp_path, monkeypatch, dynamic):
    """torch.compile of a bias-free l2c.nn.Linear whose (N, K) a token-count range serves, with dynamic shapes (or
    the automatic ones from the second token count on): the first test traces with a symbolic M, and the results
    are torch's at every token count, served or not."""
    monkeypatch.setenv("L2C_CACHE_DIR", str(tmp_path))
    set_tuned_table(TunedTable([entry(8, 48, 64, m_range=(1, 12))]), allow_cpu=True, prepare="inline")
    layer = l2c.nn.Linear(64, 48, bias=False, dtype=torch.float16)
    compiled = torch.compile(layer, dynamic=dynamic)
    with torch.no_grad():
        for m in (5, 9, 13):
            x = torch.randn(m, 64, dtype=torch.float16)
            torch.testing.assert_close(compiled(x), x @ layer.weight.t(), rtol=2e-3, atol=2e-2)
    set_tuned_table(None)


def test_online_decisions_are_kept_per_table_file(tmp_path, monkeypatch):
    """The table whose kernels were the candidates is part of a decision's key, by its file's content: the shipped
    table gives one key, another table file another, a table made in memory its name."""
    from l2c.dispatch import default_table_path
    from l2c.online import decision_settings
    from l2c.tuned_table import load_table
    monkeypatch.delenv("L2C_TUNED_TABLE", raising=False)
    shipped = decision_settings(load_table(default_table_path("sm_90")))["table"]
    assert isinstance(shipped, str) and len(shipped) == 16
    other = tmp_path / "t.json"
    other.write_text(json.dumps({"entries": []}))
    assert decision_settings(load_table(other))["table"] not in (shipped, None)
    assert decision_settings(TunedTable([]))["table"] == "<memory>" and decision_settings(None)["table"] is None


def test_a_served_call_saves_only_what_its_backward_needs():
    """With a frozen weight (x requires grad, the weight not), a served call keeps only the weight for its backward,
    as torch's mm does: changing the activations in place after the layer is no error, and the gradient is right."""
    set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    w = torch.randn(48, 40, dtype=torch.float16)
    grads = []
    for mm in (torch.matmul, l2c.matmul):
        x = torch.randn(32, 40, dtype=torch.float16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        h = x * 2
        y = mm(h, w.t())
        h.add_(1)
        y.float().sum().backward()
        grads.append(x.grad)
    assert l2c.dispatch.default_dispatcher().stats["tuned"] >= 1
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-2, atol=1e-2)
    set_tuned_table(None)


@pytest.mark.parametrize("how", ["compiled", "custom_op"])
def test_the_custom_ops_backward_refuses_inputs_changed_in_place(how):
    """The custom op's backward (compiled graphs, or torch.ops.l2c.matmul called directly) checks its saved inputs'
    versions as torch's ops do: an input changed in place after the forward is an error, never a gradient computed
    from the changed values."""
    torch._dynamo.reset()
    set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    call = {"compiled": torch.compile(lambda a, w: l2c.matmul(a, w.t()), fullgraph=True, backend="eager"),
            "custom_op": lambda a, w: torch.ops.l2c.matmul(a, w.t(), None, "none")}[how]
    a = torch.randn(32, 40, dtype=torch.float16)
    w = torch.randn(48, 40, dtype=torch.float16, requires_grad=True)
    y = call(a, w)
    a.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.float().sum().backward()
    set_tuned_table(None)
    torch._dynamo.reset()


def test_a_residual_broadcast_over_tokens_gives_one_shape_eager_compiled_and_scripted():
    """`l2c.nn.Linear(x, residual=r)` with r of shape (N,) (broadcast) or (tokens, N) for a 3-D x returns x's leading
    shape with N columns, eager, compiled and under TorchScript alike."""
    set_tuned_table(None)
    torch._dynamo.reset()
    layer = l2c.nn.Linear(40, 48)
    x = torch.randn(2, 16, 40)
    scripted = torch.jit.script(layer)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    for residual in (torch.randn(48), torch.randn(32, 48)):
        with torch.no_grad():
            want = F.linear(x, layer.weight, layer.bias) + residual.reshape(-1, 48).reshape(
                (2, 16, 48) if residual.dim() == 2 else (48,))
            for run in (layer, compiled, scripted):
                torch.testing.assert_close(run(x, residual=residual), want)
    torch._dynamo.reset()


def test_a_residual_broadcasts_as_torch_adds_it_and_a_misshapen_one_is_refused():
    """`l2c.nn.Linear(x, residual=r)` and `GatedMLP` add any r that broadcasts against the output as `r + layer(x)`
    does ((1, tokens, N), (batch, 1, N), (tokens, N) of a 3-D x), eager, compiled and scripted; an r of the output's
    size in another shape is refused with a ValueError, never added to other tokens' rows."""
    set_tuned_table(None)
    torch._dynamo.reset()
    layer, gated = l2c.nn.Linear(40, 48), l2c.nn.GatedMLP(40, 24)
    x = torch.randn(2, 16, 40)
    runs = [layer, torch.compile(layer, fullgraph=True, backend="eager"), torch.jit.script(layer)]
    with torch.no_grad():
        y = F.linear(x, layer.weight, layer.bias)
        for residual in (torch.randn(1, 16, 48), torch.randn(2, 1, 48), torch.randn(16, 48), torch.randn(1)):
            for run in runs:
                torch.testing.assert_close(run(x, residual=residual), residual + y)
        r = torch.randn(2, 1, 40)
        torch.testing.assert_close(gated(x, residual=r), r + gated(x))
        for run in runs:
            with pytest.raises(Exception, match="does not broadcast"):
                run(x, residual=torch.randn(16, 2, 48))
        with pytest.raises(ValueError, match="does not broadcast"):
            gated(x.transpose(0, 1), residual=torch.randn(2, 16, 40))
    torch._dynamo.reset()


def test_an_unknown_activation_is_refused_when_traced_too():
    """activation="" is refused eagerly and under torch.compile alike (never read as no activation)."""
    torch._dynamo.reset()
    set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    with pytest.raises(ValueError, match="activation must be one of"):
        l2c.matmul(a, w.t(), activation="")
    with pytest.raises(Exception, match="activation must be one of"):
        torch.compile(lambda a, w: l2c.matmul(a, w.t(), activation=""), backend="eager")(a, w)
    set_tuned_table(None)
    torch._dynamo.reset()


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_a_fused_activation_keeps_nan_as_torch_does(activation):
    """A NaN in A reaches the output through a served fused activation as through torch's (relu's max must propagate
    NaN: a NaN hidden as 0 would hide a diverging model)."""
    set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    a[3, 5] = float("nan")
    y = l2c.matmul(a, w.t(), activation=activation)
    want = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}[activation](torch.matmul(a.float(), w.t().float()))
    assert l2c.dispatch.default_dispatcher().stats["tuned"] >= 1
    assert torch.equal(y.isnan(), want.isnan()) and y.isnan().sum() == 48
    set_tuned_table(None)


def test_an_entry_whose_spec_layouts_are_not_its_own_serves_nothing(caplog):
    """A hand-written entry labelled row,col,row whose spec writes a column-major C is a bad entry: torch serves its
    calls (contiguous results, as torch.matmul's), with a warning naming the layouts."""
    spec = KernelSpec(name="colc", problem_m=32, problem_n=48, problem_k=40, tile_m=16, tile_n=16, tile_k=16,
                      layout_b="col", layout_c="col", swizzle_group=1, launch_warps=4)
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40, spec=spec)]), allow_cpu=True, prepare="inline")
    a, w = torch.randn(32, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    with caplog.at_level(logging.WARNING):
        y = l2c.matmul(a, w.t())
    assert y.is_contiguous() and dispatcher.stats == {"tuned": 0, "fallback": 1}
    assert "spec's layout is row,col,col" in caplog.text
    set_tuned_table(None)


def test_from_linear_refuses_a_parametrized_linear():
    """A Linear under weight_norm computes its weight: from_linear says so instead of a TypeError from assignment."""
    from torch.nn.utils.parametrizations import weight_norm
    with pytest.raises(ValueError, match="without parametrizations"):
        l2c.nn.Linear.from_linear(weight_norm(torch.nn.Linear(8, 8)))


@pytest.mark.parametrize("make", ["constructed", "replaced", "gated"])
def test_a_layer_compiles_in_one_graph_before_any_eager_call(monkeypatch, make):
    """torch.compile(fullgraph=True) of an l2c layer in a process that has not made its default dispatcher yet (no
    eager call before it; on a GPU, before the warm start made it): the layer made it when it was built or swapped
    in, since tracing cannot make it (its lock is a graph break)."""
    from l2c import dispatch
    torch._dynamo.reset()
    monkeypatch.setattr(dispatch, "_default", None)
    x = torch.randn(3, 8)
    layer = {"constructed": lambda: l2c.nn.Linear(8, 6),
             "replaced": lambda: l2c.nn.replace_linears(torch.nn.Sequential(torch.nn.Linear(8, 6))),
             "gated": lambda: l2c.nn.GatedMLP(8, 12)}[make]()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(layer, fullgraph=True, backend="eager")(x), layer(x))
    torch._dynamo.reset()
