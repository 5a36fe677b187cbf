#!/usr/bin/env python
"""Shapes drawn inside a table's cells, for the cells' held-out check (CPU; writes a shape file for `l2c bench`).

    python scripts/cell_inside.py TABLE.json OUT.txt [--count 30] [--seed 20261202] [--min-tile-n 17]

Cells serve shapes nobody measured, so their false-win rate is measured on shapes drawn after they were made: per
dtype, `--count` shapes, each from a cell picked uniformly among the cells whose kernel is at least `--min-tile-n`
wide along N (17: the wide kernels' cells, `l2c table`'s WIDE_CELL_MIN_TILES), with M uniform in the cell's M range
and N, K multiples of 8 uniform in its ranges, never all three at a corner. Measure them with
`l2c bench dispatch:TABLE --shapes OUT.txt --dtype DTYPE --protocol kernel,call`.
"""
import argparse
import json
import random
import re


def tile_n(spec: str) -> int:
    return int(re.search(r"tile\s+m=\d+\s+n=(\d+)", spec).group(1))


def draw(table: dict, count: int, seed: int, min_tile_n: int):
    rng = random.Random(seed)
    shapes = []
    for dtype in sorted({e["dtype"] for e in table["entries"]}):
        cells = [e for e in table["entries"]
                 if "n_range" in e and e["dtype"] == dtype and tile_n(e["spec"]) >= min_tile_n]
        drawn = 0
        while cells and drawn < count:
            cell = rng.choice(cells)
            m = rng.randint(*cell["m_range"])
            n, k = (8 * rng.randint(-(-lo // 8), hi // 8) for lo, hi in (cell["n_range"], cell["k_range"]))
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
    p.add_argument("--seed", type=int, default=20261202)
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
