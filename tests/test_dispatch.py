"""`l2c.matmul` / `l2c.nn.Linear`: table lookup, fallback correctness, and the tuned path (interpreter)."""
import json

import pytest
import torch
import torch.nn.functional as F

import l2c
from l2c.dispatch import Dispatcher, TunedEntry, TunedTable, set_tuned_table
from l2c.ir import KernelSpec


def entry(m, n, k, tflops=2.0, baseline=1.0, spec=None, layout="row,col,row", target="triton"):
    spec = spec or KernelSpec(name=f"t{m}x{n}x{k}", problem_m=m, problem_n=n, problem_k=k, tile_m=16,
                              tile_n=16, tile_k=16, layout_b="col", swizzle_group=1, launch_warps=4)
    return TunedEntry(m=m, n=n, k=k, batch=1, dtype="f16", layout=layout, target=target,
                      spec_text=spec.to_l2(), tflops=tflops, baseline_tflops=baseline)


def test_lookup_exact_then_nearest_m_at_or_above():
    table = TunedTable([entry(16, 64, 32), entry(128, 64, 32), entry(1024, 64, 32)])
    assert table.lookup("f16", "row,col,row", 128, 64, 32).m == 128
    assert table.lookup("f16", "row,col,row", 100, 64, 32).m == 128
    assert table.lookup("f16", "row,col,row", 1, 64, 32).m == 16
    assert table.lookup("f16", "row,col,row", 5000, 64, 32).m == 1024
    assert table.lookup("f16", "row,col,row", 128, 64, 64) is None
    assert table.lookup("bf16", "row,col,row", 128, 64, 32) is None
    assert table.lookup("f16", "row,row,row", 128, 64, 32) is None


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


def test_matmul_under_torch_compile():
    set_tuned_table(None)
    f = torch.compile(lambda a, b: l2c.matmul(a, b, activation="relu"))
    a, b = torch.randn(6, 4), torch.randn(4, 3)
    torch.testing.assert_close(f(a, b), F.relu(a @ b))


def test_tuned_path_runs_the_tuned_kernel_on_the_interpreter():
    """The real dispatcher path: lookup, epilogue specialisation (bias + gelu), build, call."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True)
    a = torch.randn(30, 40, dtype=torch.float16)                     # M=30: served by the M=32 entry
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


def test_steady_state_resolution_still_tells_signatures_apart():
    """The per-call cache keys on shapes, strides, dtypes and devices: a call that differs in any of them from
    an earlier one (same M, N, K) is resolved afresh, not served by the earlier call's kernel."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True)
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
    set_tuned_table(None)


def test_linear_serves_3d_inputs_from_the_table_and_is_torch_elsewhere():
    """Eager l2c.nn.Linear: a (batch, tokens, in) input is flattened to M = batch*tokens for the table lookup and
    the tuned kernel's output reshaped back; an unserved shape runs torch.nn.Linear's own F.linear."""
    dispatcher = set_tuned_table(TunedTable([entry(32, 48, 40)]), allow_cpu=True)
    ref = torch.nn.Linear(40, 48).half()
    lin = l2c.nn.Linear.from_linear(ref, activation="gelu")
    x = torch.randn(2, 16, 40, dtype=torch.float16)
    y = lin(x)
    assert y.shape == (2, 16, 48) and dispatcher.stats == {"tuned": 1, "fallback": 0}
    expect = F.gelu(x.double() @ ref.weight.double().t() + ref.bias.double())
    assert ((y.double() - expect).norm() / expect.norm()).item() < 5e-3
    lin(torch.randn(3, 40, dtype=torch.float16))          # M=3: the nearest tuned M at or above (32) serves it
    assert dispatcher.stats == {"tuned": 2, "fallback": 0}
    plain = l2c.nn.Linear.from_linear(torch.nn.Linear(40, 7).half())   # N=7: no entry, torch's F.linear
    x7 = torch.randn(5, 40, dtype=torch.float16)
    assert torch.equal(plain(x7), F.linear(x7, plain.weight, plain.bias))
    assert dispatcher.stats["fallback"] == 1
    set_tuned_table(None)
