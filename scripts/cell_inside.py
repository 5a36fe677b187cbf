#!/usr/bin/env python
"""Shapes drawn inside a table's cells, for the cells' held-out check (CPU; writes a shape file for `l2c bench`).

    python scripts/cell_inside.py TABLE.json OUT.txt [--count 30] [--seed 20261203] [--min-tile-n 17]

Cells serve shapes nobody measured, so their false-win rate is measured on shapes drawn after they were made: per
dtype, `--count` shapes, each from a cell picked uniformly among the cells whose kernel is at least `--min-tile-n`
wide along N (17: wider than `l2c table`'s MAX_CELL_TILE_N, the wide kernels' cells), with M uniform in the cell's M
range and N, K multiples of 8 uniform in its ranges, never all three at a corner (cells with no such shape are
passed over). The file holds the shapes only; measure it in each dtype with
`l2c bench dispatch:TABLE --shapes OUT.txt --dtype DTYPE --protocol kernel,call` (a shape drawn from one dtype's
cells may fall outside the other's: `served_by` says).
"""
import argparse
import json
import random

from l2c.parser import parse_one


def multiples_of_8(lo: int, hi: int) -> range:
    return range(-(-lo // 8) * 8, hi // 8 * 8 + 1, 8)


def has_inside(cell: dict) -> bool:
    """Whether the cell holds a shape with N and K multiples of 8 that is not one of its corners."""
    ns, ks = multiples_of_8(*cell["n_range"]), multiples_of_8(*cell["k_range"])
    if not ns or not ks:
        return False
    return (cell["m_range"][1] - cell["m_range"][0] > 1 or any(n not in cell["n_range"] for n in ns)
            or any(k not in cell["k_range"] for k in ks))


def draw(table: dict, count: int, seed: int, min_tile_n: int):
    rng = random.Random(seed)
    shapes = []
    for dtype in sorted({e["dtype"] for e in table["entries"]}):
        cells = [e for e in table["entries"] if "n_range" in e and e["dtype"] == dtype
                 and parse_one(e["spec"]).tile_n >= min_tile_n and has_inside(e)]
        drawn = 0
        while cells and drawn < count:
            cell = rng.choice(cells)
            m = rng.randint(*cell["m_range"])
            n, k = (rng.choice(multiples_of_8(lo, hi)) for lo, hi in (cell["n_range"], cell["k_range"]))
            if m in cell["m_range"] and n in cell["n_range"] and k in cell["k_range"]:
                continue
            shapes.append((m, n, k, dtype))
            drawn += 1
    return shapes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("table")
    p.add_argument("out")
    p.add_argument("--count", type=int, default=30)
    p.add_argument("--seed", type=int, default=20261203)
    p.add_argument("--min-tile-n", type=int, default=17)
    a = p.parse_args()
    shapes = draw(json.load(open(a.table)), a.count, a.seed, a.min_tile_n)
    with open(a.out, "w") as f:
        f.write(f"# {len(shapes)} shapes inside the cells of {a.table} with kernels at least {a.min_tile_n} wide along "
                f"N, {a.count} per dtype's cells (scripts/cell_inside.py, seed {a.seed}); measured in both dtypes\n")
        for m, n, k, _ in shapes:
            f.write(f"{m} {n} {k}\n")


if __name__ == "__main__":
    main()
