"""The direct- and staged-store A/B inputs on the CPU: scripts/table_variant.py picks the same entries on both sides
of the shipped tables' plain CUTLASS GEMM entries and changes only the epilogue store, gpu.py's stages select what
they say, and scripts/variant_pairs.py pairs the two sides' rows entry by entry."""
import pytest
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


def _selection(args):
    """(--where pairs, --max-gflop, --per-spec) of table_variant.py arguments."""
    where, options = [], {}
    for flag, value in zip(args[::2], args[1::2]):
        if flag == "--where":
            where.append(tuple(value.split("=")))
        else:
            options[flag] = value
    max_gflop = float(options["--max-gflop"]) if "--max-gflop" in options else None
    per_spec = int(options["--per-spec"]) if "--per-spec" in options else None
    return where, max_gflop, per_spec


def _sides(table_file, where, max_gflop=None, per_spec=None, store="direct"):
    table = json.loads((ROOT / "l2c" / "tuned" / table_file).read_text())
    return (table, table_variant.variant(table, where, None, max_gflop, per_spec),
            table_variant.variant(table, where, ("epilogue_store", store), max_gflop, per_spec))


def _shape(e):
    return e["m"], e["n"], e["k"], e.get("batch", 1), e["dtype"], e["layout"]


@pytest.mark.parametrize("store", ["direct", "staged"])
def test_both_sides_hold_the_same_entries_and_differ_only_in_the_store(store):
    for table_file, select in gpu.STORE_SETS[store].values():
        where, max_gflop, per_spec = _selection(gpu.STORE_WHERE + select)
        _, a, b = _sides(table_file, where, max_gflop, per_spec, store)
        assert a["entries"] and [_shape(e) for e in a["entries"]] == [_shape(e) for e in b["entries"]]
        per_spec_count = {}
        for ea, eb in zip(a["entries"], b["entries"]):
            sa, sb = parse_one(ea["spec"]), parse_one(eb["spec"])
            assert ea["target"] == "cutlass" and sa.epilogue_store == "tma" and sb.epilogue_store == store
            assert sa.epilogue_bias == sa.epilogue_activation == "none" and sa.launch_family == "gemm"
            assert sb.replace(name=sa.name, epilogue_store="tma") == sa and sb.name != sa.name
            assert validate(sb, "cutlass").spec.epilogue_store == store
            if max_gflop is not None:
                assert 2 * ea["m"] * ea["n"] * ea["k"] < max_gflop * 1e9
            assert all(str(getattr(sa, field)) == value for field, value in where if field != "target")
            per_spec_count[ea["spec"]] = per_spec_count.get(ea["spec"], 0) + 1
        assert max(per_spec_count.values()) <= per_spec
        assert "near" not in a and a["changed"] is None and b["changed"] == ["epilogue_store", store]


def test_per_spec_keeps_the_smallest_and_the_largest_entry_of_each_spec():
    where = [tuple(w.split("=")) for w in gpu.STORE_WHERE[1::2]]
    table, a, _ = _sides("sm_90.json", where, per_spec=2)
    sizes, kept = {}, {}
    for e in table["entries"]:
        if table_variant._matches(e, parse_one(e["spec"]), where):
            sizes.setdefault(e["spec"], []).append(e["m"] * e["n"] * e["k"])
    for e in a["entries"]:
        kept.setdefault(e["spec"], []).append(e["m"] * e["n"] * e["k"])
    assert kept.keys() == sizes.keys()
    for spec, all_sizes in sizes.items():
        expected = 1 if len(all_sizes) == 1 else 2
        assert len(kept[spec]) == expected
        assert min(kept[spec]) == min(all_sizes) and max(kept[spec]) == max(all_sizes)


def test_where_compares_values_as_the_knob_holds_them():
    e = {"target": "cutlass", "spec": "kernel a { epilogue beta=0.0 } "}
    spec = parse_one(e["spec"])
    assert table_variant._matches(e, spec, [("epilogue_beta", "0"), ("tile_m", "128"), ("target", "cutlass")])
    assert not table_variant._matches(e, spec, [("target", "triton")])


def test_pairs_compare_each_entry_with_its_twin():
    text = "kernel k{i} {{ target cutlass tile m=64 n=64 launch schedule={s} }}"
    shapes = [(1, 64, 64), (1, 64, 64), (32, 64, 64), (4, 64, 64), (8, 64, 64)]
    schedules = ["basic", "basic", "pingpong", "basic", "basic"]

    def table(side):
        return {"entries": [{"m": m, "n": n, "k": k, "dtype": "f16", "layout": "row,row,row", "target": "cutlass",
                             "spec": parse_one(text.format(i=f"{side}{i}", s=s)).to_l2()}
                            for i, ((m, n, k), s) in enumerate(zip(shapes, schedules))]}

    def row(source, index, protocol, speedup, status="ok", m=None):
        m = shapes[index][0] if m is None else m
        return {"type": "result", "kernel": f"{source}#{index}:k{source.lower()}{index}@cutlass", "source": source,
                "protocol": protocol, "m": m, "n": 64, "k": 64, "batch": 1, "dtype": "f16", "layout": "row,row,row",
                "status": status, "speedup": speedup}
    rows = [row("A", 0, "kernel", 1.0), row("B", 0, "kernel", 1.1),     # B 10% faster
            row("A", 1, "kernel", 1.3), row("B", 1, "kernel", 1.3),     # another entry at the same shape
            row("A", 2, "kernel", 1.2), row("B", 2, "kernel", 1.0),     # B 20% slower
            row("A", 3, "kernel", 1.0), row("B", 3, "kernel", None, status="wrong"),
            row("A", 4, "call", 1.0),                                   # no B row: unpaired
            row("B", 4, "kernel", 2.0, m=9)]                            # another shape at that index: not ours
    out = variant_pairs.pairs(rows, "A", "B", table("a"), table("b"))
    kernel = out["protocols"]["kernel"]
    assert kernel["all"]["shapes"] == 3 and kernel["all"]["b_faster"] == 1 and kernel["all"]["b_slower"] == 1
    assert math.isclose(kernel["all"]["b_over_a_time_geomean"], round((1 / 1.1 * 1.2) ** (1 / 3), 4))
    assert kernel["schedule=basic"]["shapes"] == 2 and kernel["schedule=pingpong"]["b_slower"] == 1
    assert kernel["m<=4"]["shapes"] == 2 and kernel["m<=64"]["shapes"] == 1
    assert "call" not in out["protocols"]
    assert out["failed"] == [{"protocol": "kernel", "entry": 3, "shape": [4, 64, 64, 1], "dtype": "f16",
                              "layout": "row,row,row", "a": "ok", "b": "wrong", "b_reason": None}]
    assert out["unpaired_rows"] == 1 and out["rows_of_other_tables"] == 1


def test_the_schedules_come_from_the_a_table_resolved():
    where = [tuple(w.split("=")) for w in gpu.STORE_WHERE[1::2]]
    _, a, _ = _sides("sm_90_graphs.json", where, per_spec=1)
    schedules = variant_pairs.schedules(a)
    assert len(schedules) == len(a["entries"]) and set(schedules) <= {"basic", "pingpong", "cooperative"}


def test_the_whole_variant_keeps_every_entry_and_serves_the_staged_twins(tmp_path):
    """`table_variant.py --whole` (gpu.py's staged_tables stage): every entry stays, in order, with its ranges, cells
    and figures; each CUTLASS GEMM entry with the TMA store gets its staged twin, the rest are untouched; the specs
    written for building are exactly the changed ones; the dispatcher loads the result and serves the twins."""
    from l2c.tuned_table import TunedTable
    stage = gpu.STAGES["staged_tables"].commands(gpu.argparse.Namespace(
        out=str(tmp_path), eager_table=str(ROOT / "l2c" / "tuned" / "sm_90.json"),
        graphs_table=str(ROOT / "l2c" / "tuned" / "sm_90_graphs.json")))
    variants = [command for command in stage if "table_variant.py" in " ".join(command)]
    assert len(variants) == 2 and any("bench" in c and f"dispatch:{tmp_path}/staged_whole_default.json" in c
                                      for c in stage)
    for command in variants:
        assert table_variant.main(command[2:]) == 0
        source = json.loads(Path(command[2]).read_text())
        out = Path(command[command.index("-o") + 1])
        whole = json.loads(out.read_text())
        assert len(whole["entries"]) == len(source["entries"]) and whole["kept"] == []
        changed, exact = [], None
        for old, new in zip(source["entries"], whole["entries"]):
            assert {k: v for k, v in old.items() if k != "spec"} == {k: v for k, v in new.items() if k != "spec"}
            spec = parse_one(old["spec"])
            if old["target"] == "cutlass" and spec.launch_family == "gemm" and spec.epilogue_store == "tma":
                twin = parse_one(new["spec"])
                assert twin.epilogue_store == "staged" and twin.replace(name=spec.name, epilogue_store="tma") == spec
                changed.append(new["spec"])
                exact = exact or (new if "m_range" not in new else None)
            else:
                assert new["spec"] == old["spec"]
        assert whole["changed_entries"] > 0 and whole.get("near") == source.get("near")
        assert Path(command[command.index("--specs-out") + 1]).read_text() == "\n".join(dict.fromkeys(changed))
        served = TunedTable.load(out).lookup(exact["dtype"], exact["layout"], exact["m"], exact["n"], exact["k"])
        assert served is not None and parse_one(served.spec_text).epilogue_store == "staged"
