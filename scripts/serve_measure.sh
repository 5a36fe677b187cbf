#!/usr/bin/env bash
# Measure the serve tables through what users call, on the H200 (the figures the README cites):
#   bash scripts/serve_measure.sh GRAPHS_TABLE.json EAGER_TABLE.json SERVE_F16.json OUTDIR INSIDE_SHAPES.txt
# - l2c.nn.Linear's path with GRAPHS_TABLE on the `serve` set, f16 and bf16, `kernel` protocol, cold weights and
#   fraction of roofline; with EAGER_TABLE in the `call` protocol; at token counts inside the tables' ranges;
# - l2c.matmul (row-major B) and l2c.nn.Linear's path with EAGER_TABLE on `offgrid` (kernel, call);
# - examples/decode_step.py with GRAPHS_TABLE; scripts/dispatch_check.py (served kernels, autograd) on SERVE_F16.
# L2C_CACHE_DIR should already hold the tables' CUTLASS libraries (or the pack); Triton kernels are compiled first.
set -u
graphs=$1; eager=$2; serve=$3; out=$4; inside=${5:-}; mkdir -p "$out"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
# bench SECONDS ARGS...: one `l2c bench`, stopped at its time limit (rows written so far stay in the file)
bench() { local limit=$1; shift; PYTHONUNBUFFERED=1 timeout "$limit" python3 -m l2c bench "$@" 2>&1 \
  | grep -E "geomean|roofline|served|error" | head -8; }
python3 scripts/serve_sweep.py --out /tmp --warm-table "$graphs" --shapes "serve,offgrid,$inside" --workers 12 \
  2>&1 | grep -v -i warn; stamp warmed
for d in f16 bf16; do
  bench 130 "linear:$graphs" --shapes serve --dtype $d --protocol kernel --roofline --reps 7 -o "$out/serve_kernel_$d.jsonl"
  stamp serve kernel $d
done
bench 80 "dispatch:$eager" --shapes offgrid --protocol kernel,call --reps 5 --iters 10 -o "$out/dispatch_offgrid.jsonl"
stamp offgrid dispatch
L2C_TUNED_TABLE=$graphs timeout 70 python3 examples/decode_step.py --out "$out/decode_step_f16.json" 2>&1 | grep -v -i warn
stamp decode
L2C_TUNED_TABLE=$serve timeout 45 python3 scripts/dispatch_check.py --count 10 --out "$out/dispatch_check.json" 2>&1 | tail -4
stamp dispatch_check
bench 30 "linear:$graphs" --shapes "$inside" --protocol kernel --roofline --reps 7 -o "$out/serve_inside_f16.jsonl"
stamp inside
bench 60 "linear:$eager" --shapes serve --dtype f16 --protocol call --iters 20 -o "$out/serve_call_f16.jsonl"
stamp serve call f16
bench 40 "linear:$eager" --shapes offgrid --protocol kernel --reps 5 -o "$out/linear_offgrid.jsonl"
stamp offgrid linear
