"""The direct-store A/B inputs on the CPU: scripts/table_variant.py picks the same shapes on both sides of the shipped
tables' plain CUTLASS GEMM entries and changes only the epilogue store, gpu.py's stage selects what it says, and
scripts/variant_pairs.py pairs the two sides' rows shape by shape."""
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gpu  # noqa: E402
import table_variant  # noqa: E402
import variant_pairs  # noqa: E402

from l2c.parser import parse_one  # noqa: E402
from l2c.validate import validate  # noqa: E402

WHERE = [tuple(w.split("=")) for w in gpu._DIRECT_STORE_WHERE[1::2]]


def _sides(table_name, extra_where=(), **select):
    table = json.loads((ROOT / "l2c" / "tuned" / table_name).read_text())
    where = WHERE + list(extra_where)
    return (table, table_variant.variant(table, where, None, **select),
            table_variant.variant(table, where, ("epilogue_store", "direct"), **select))


def _shape(e):
    return e["m"], e["n"], e["k"], e.get("batch", 1), e["dtype"], e["layout"]


def test_both_sides_hold_the_same_shapes_and_differ_only_in_the_store():
    for table_name, (_, select) in gpu.DIRECT_STORE_SETS.items():
        args = dict(zip(select[::2], select[1::2]))
        extra = [tuple(args.pop("--where").split("="))] if "--where" in args else []
        table, a, b = _sides(gpu.DIRECT_STORE_SETS[table_name][0], extra,
                             max_gflop=float(args["--max-gflop"]) if "--max-gflop" in args else None,
                             per_spec=int(args["--per-spec"]))
        assert a["entries"] and [_shape(e) for e in a["entries"]] == [_shape(e) for e in b["entries"]]
        per_spec = {}
        for ea, eb in zip(a["entries"], b["entries"]):
            sa, sb = parse_one(ea["spec"]), parse_one(eb["spec"])
            assert ea["target"] == "cutlass" and sa.epilogue_store == "tma" and sb.epilogue_store == "direct"
            assert sa.epilogue_bias == sa.epilogue_activation == "none" and sa.launch_family == "gemm"
            assert sb.replace(name=sa.name, epilogue_store="tma") == sa and sb.name != sa.name
            assert validate(sb, "cutlass").spec.epilogue_store == "direct"
            if "--max-gflop" in args:
                assert 2 * ea["m"] * ea["n"] * ea["k"] < float(args["--max-gflop"]) * 1e9
            for field, value in extra:
                assert str(getattr(sa, field)) == value
            per_spec[ea["spec"]] = per_spec.get(ea["spec"], 0) + 1
        assert max(per_spec.values()) <= int(args["--per-spec"])
        assert "near" not in a and a["changed"] is None and b["changed"] == ["epilogue_store", "direct"]


def test_per_spec_keeps_the_smallest_and_the_largest():
    table, a, _ = _sides("sm_90.json", per_spec=2)
    sizes = {}
    for e in table["entries"]:
        spec = parse_one(e["spec"])
        if all(str(e["target"] if f == "target" else getattr(spec, f)) == v for f, v in WHERE):
            sizes.setdefault(e["spec"], []).append(e["m"] * e["n"] * e["k"])
    kept = {}
    for e in a["entries"]:
        kept.setdefault(e["spec"], []).append(e["m"] * e["n"] * e["k"])
    assert kept.keys() == sizes.keys()
    for spec, all_sizes in sizes.items():
        assert sorted(kept[spec]) == sorted({min(all_sizes), max(all_sizes)} if len(all_sizes) > 1 else all_sizes) \
            or len(kept[spec]) == 2 and min(kept[spec]) == min(all_sizes) and max(kept[spec]) == max(all_sizes)


def test_pairs_compare_each_entry_with_its_twin():
    def row(source, index, m, protocol, speedup, status="ok"):
        return {"type": "result", "kernel": f"{source}#{index}:k{index}@cutlass", "source": source,
                "protocol": protocol, "m": m, "n": 64, "k": 64, "batch": 1, "dtype": "f16", "layout": "row,row,row",
                "status": status, "speedup": speedup}
    rows = [row("A", 0, 1, "kernel", 1.0), row("B", 0, 1, "kernel", 1.1),     # B 10% faster
            row("A", 1, 1, "kernel", 1.3), row("B", 1, 1, "kernel", 1.3),     # another entry at the same shape
            row("A", 2, 32, "kernel", 1.2), row("B", 2, 32, "kernel", 1.0),   # B 20% slower
            row("A", 3, 4, "kernel", 1.0), row("B", 3, 4, "kernel", None, status="wrong"),
            row("A", 4, 8, "call", 1.0), row("C", 4, 8, "call", 2.0)]         # no B row: not paired
    out = variant_pairs.pairs(rows, "A", "B", ["basic", "basic", "cooperative", "basic", "basic"])
    kernel = out["protocols"]["kernel"]
    assert kernel["all"]["shapes"] == 3 and kernel["all"]["b_faster"] == 1 and kernel["all"]["b_slower"] == 1
    assert math.isclose(kernel["all"]["b_over_a_time_geomean"], round((1 / 1.1 * 1.2) ** (1 / 3), 4))
    assert kernel["schedule=basic"]["shapes"] == 2 and kernel["schedule=cooperative"]["b_slower"] == 1
    assert kernel["m<=4"]["shapes"] == 2 and kernel["m<=64"]["shapes"] == 1
    assert "call" not in out["protocols"]
    assert out["failed"] == [{"protocol": "kernel", "entry": 3, "shape": [4, 64, 64, 1], "dtype": "f16",
                              "layout": "row,row,row", "a": "ok", "b": "wrong", "b_reason": None}]


def test_the_schedules_come_from_the_a_table():
    _, a, _ = _sides("sm_90_graphs.json", per_spec=1)
    schedules = variant_pairs.schedules(a)
    assert len(schedules) == len(a["entries"])
    assert set(schedules) <= {"basic", "pingpong", "cooperative", "auto"}
