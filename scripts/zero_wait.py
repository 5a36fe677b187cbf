#!/usr/bin/env python
"""Issue #19's done-when, measured with empty user caches: what the first calls of l2c.matmul cost, how soon they
are served tuned, and how long new CUTLASS kernels and a tune of one new shape take (GPU).

    python scripts/zero_wait.py --out OUT/zero_wait_h200.json     # all five parts: about 5 minutes, at most 10

Each part runs in a fresh subprocess (its own process group, killed when the part ends) with its own empty
temporary caches: L2C_CACHE_DIR (CUTLASS libraries, the call-plan shim, Triton modules, online decisions),
TRITON_HOME and TRITON_CACHE_DIR (Triton's binaries), XDG_CACHE_HOME and XDG_DATA_HOME (the user cache and data
dirs: l2c's default cache, and the tuner's results store, study journal and policy) and CUDA_CACHE_PATH; every other
L2C_* setting but L2C_NVCC is removed, so each part sees l2c's defaults (background preparation, the shipped pack).

 (a) prebuilt: per call, l2c.matmul on a shipped-table CUTLASS shape whose kernel the pack holds against torch.matmul
     on the same operands in the same process (torch first warmed on another shape, so cuBLAS's start-up is charged
     to neither), synchronized wall times, and whether the dispatcher's tuned kernel served the call (its `stats`
     counter). Criterion: the first call costs <= 50 ms more than torch's and the kernel serves from call 1 or 2.
 (a') later: (a) again in a second fresh process that keeps the caches (a) left (its verification record and the
     installed library), as a user's next run would. Criterion: the first call costs <= 50 ms more than torch's and
     the kernel serves from call 1. Runs after (a) (`--parts prebuilt,later`).
 (b) unbuilt: the same with a one-entry table whose spec is (a)'s with one knob changed (checked to validate and to
     be absent from the pack), so the kernel is compiled by the background worker. Criterion: no call costs more
     than 50 ms extra, and the kernel serves once built and verified (the time until then is reported).
 (c) build: `l2c build -j J` of N of the pack's kernels (spread over its names) with the pack disabled, so nvcc
     compiles every one. Criterion: <= 10 s of one core (user + sys of the whole process tree) per kernel.
 (d) tune: the issue's `l2c tune` command of one new shape with a fresh store. Criterion: <= 60 s wall, exit 0.

The JSON is rewritten after each part, so a run cut short keeps the parts that finished; the environment is added at
the end. Exit status 0 when every part ran (pass or fail is in the JSON), 1 when a part could not be measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARCH = "sm_90"
EXTRA_MS = 50.0          # (a), (b): the most a call may cost over torch.matmul
BUILD_CPU_S = 10.0       # (c): CPU seconds per new CUTLASS kernel
TUNE_WALL_S = 60.0       # (d)
TUNE_ARGS = ("tune", "--shapes", "16x14336x4096", "--layout", "row,col,row", "--trials", "16",
             "--target", "triton,cutlass")
PARTS = ("prebuilt", "later", "unbuilt", "build", "tune")
# Knob changes tried in order to make (b)'s spec: each keeps the kernel correct and valid for every shape.
VARIANTS = (("swizzle_raster", "n"), ("swizzle_raster", "m"), ("swizzle_group", 4), ("swizzle_group", 2),
            ("swizzle_group", 16), ("swizzle_group", 1))
RAW_CALLS = 10           # calls kept whole at the start of a part, and around the first served call
SLOW_MS = 5.0            # calls costing more than this over torch are kept whole too (at most MAX_SLOW)
MAX_SLOW = 50


def shipped(*parts: str) -> Path:
    return Path(str(resources.files("l2c").joinpath(*parts)))


# ---- choosing what to measure (no GPU needed)

def served_kernel(entry) -> Tuple[str, str, str]:
    """(spec text, pack key, name) of the kernel the dispatcher prepares for `entry` at its own M, no bias: what a
    plain `l2c.matmul` at the entry's shape asks the worker to build."""
    from l2c.lower import render
    from l2c.targets.cutlass.toolchain import pack_key
    from l2c.tuned_table import served_spec
    from l2c.validate import validate
    spec = served_spec(entry, entry.m, False, "none")
    return spec.to_l2(), pack_key(render(validate(spec, "cutlass", ARCH))), spec.name


def in_pack(entry, pack) -> bool:
    _, key, name = served_kernel(entry)
    held = pack.entries.get(key)
    return held is not None and held.name == name


def pick_prebuilt(table, pack, shape: Optional[Tuple[int, int, int]] = None, dtype: Optional[str] = None,
                  layout: Optional[str] = None):
    """(a)'s entry: a plain exact CUTLASS entry of the table whose kernel the pack holds; by default nn.Linear's
    layout (row,col,row: B the transposed weight) in f16 with the fewest FLOPs (its verification costs least),
    else the fewest-FLOP entry of any layout. `shape`, `dtype`, `layout` narrow the choice."""
    from l2c.tuned_table import served_entries
    found = [e for e in served_entries(table) if e.target == "cutlass" and not e.serves_range and e.gate == "none"
             and e.batch == 1 and e.layout.endswith(",row")
             and (shape is None or (e.m, e.n, e.k) == shape) and (dtype is None or e.dtype == dtype)
             and (layout is None or e.layout == layout)]
    found = [e for e in found if in_pack(e, pack)]
    if not found:
        raise SystemExit("no plain CUTLASS entry of the table matches the choice and is in the pack")
    chosen = shape is not None or dtype is not None or layout is not None
    linear = [e for e in found if (e.layout, e.dtype) == ("row,col,row", "f16")]
    if linear and not chosen:
        found = linear
    return min(found, key=lambda e: (e.m * e.n * e.k, e.dtype, e.layout, e.m, e.n))


def unbuilt_variant(entry, pack):
    """(b)'s entry and what changed: `entry` with its spec's first VARIANTS change that validates and whose kernel
    the pack does not hold, renamed after its knobs as the tuner names specs."""
    from l2c.errors import L2Error
    from l2c.ir import config_name
    from l2c.parser import parse_one
    spec = parse_one(entry.spec_text, file="<tuned table>")
    for field, value in VARIANTS:
        if getattr(spec, field) == value:
            continue
        changed = spec.replace(**{field: value})
        changed = changed.replace(name=config_name(changed))
        variant = dataclasses.replace(entry, spec_text=changed.to_l2())
        try:
            if not in_pack(variant, pack):
                return variant, f"{field}: {getattr(spec, field)} -> {value}"
        except L2Error:
            continue
    raise SystemExit(f"no variant of {spec.name} is both valid and absent from the pack")


def batch_specs(pack, count: int, store: str = "tma") -> List[str]:
    """(c)'s kernels: `count` of the pack's specs spread evenly over its kernel names in name order (a mix of tiles,
    schedules and split-K modes like the shipped tables'), one spec per name (a name twice in one file is refused);
    never l2c's checker, which is no spec. With `store` other than tma, each spec that is valid with that epilogue
    store (a plain CUTLASS GEMM: rules direct-store and staged-store) is built with it, the others as they are."""
    from l2c import checker
    from l2c.errors import L2ValidationError
    from l2c.parser import parse_one
    from l2c.validate import validate
    by_name: Dict[str, str] = {}
    for e in sorted(pack.entries.values(), key=lambda e: (e.name, e.key)):
        if e.name != checker.NAME:
            by_name.setdefault(e.name, e.spec)
    names = sorted(by_name)
    count = max(1, min(count, len(names)))
    specs = [by_name[names[i * len(names) // count]] for i in range(count)]
    if store == "tma":
        return specs
    changed = []
    for text in specs:
        spec = parse_one(text)
        try:
            variant = spec.replace(epilogue_store=store)
            validate(variant, "cutlass", ARCH)
            changed.append(variant.to_l2())
        except L2ValidationError:
            changed.append(text)
    return changed


def queued_job(entry, device: str):
    """The job the dispatcher queues for a plain call at the entry's shape (`Dispatcher._job`), whose state, reason
    and worker seconds its `preparer` records."""
    from l2c.prepare import Job
    return Job(served_kernel(entry)[0], entry.target, ARCH, entry.m, entry.n, entry.k, device)


# ---- fresh processes with empty caches

TRITON_DIRS = ("TRITON_HOME", "TRITON_CACHE_DIR", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR", "TRITON_INTERPRET")
CACHE_VARS = ("L2C_CACHE_DIR", "TRITON_HOME", "TRITON_CACHE_DIR", "XDG_CACHE_HOME", "XDG_DATA_HOME", "CUDA_CACHE_PATH")


def fresh_env(root: Path, **settings: str) -> Dict[str, str]:
    """The environment of one part: this one without L2C_* settings (but L2C_NVCC) or Triton's directories, every
    cache under `root` (created empty), then `settings`."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("L2C_") and k != "L2C_NVCC") and k not in TRITON_DIRS}
    for name in CACHE_VARS:
        path = root / name.lower()
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(settings)
    return env


def run_tree(command: List[str], env: Dict[str, str], cwd: Path, timeout_s: float) -> Dict[str, object]:
    """Run `command` in a process group of its own; kill the group after `timeout_s` (exit 124) and, in any case,
    when it ends (a background worker or nvcc left behind must not load the next part). Wall seconds and CPU seconds
    (user + sys of the process and every descendant it waited for), with the output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = 124
    wall = time.perf_counter() - start
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"command": " ".join(command), "rc": rc, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "stdout": out, "stderr": err}


def tail(text: str, chars: int = 4000) -> str:
    return text if len(text) <= chars else "..." + text[-chars:]


# ---- (a) and (b): inside the fresh process

def serve_part(entry_row: dict, timeout_s: float, after: int, gap_s: float) -> dict:
    """Call torch.matmul, then l2c.matmul, on the entry's shape until the tuned kernel has served `after` calls or
    `timeout_s` passed: per call (index, seconds since the first l2c call began, torch ms, l2c ms, served)."""
    import torch
    import l2c
    from l2c.dispatch import default_dispatcher
    from l2c.tuned_table import entry_from_row

    entry = entry_from_row(entry_row)
    device = "cuda" if torch.cuda.is_available() else "cpu"   # cpu: a smoke run, never served
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dt = {"f16": torch.float16, "bf16": torch.bfloat16}[entry.dtype]
    warm = torch.randn(256, 256, device=device, dtype=dt)
    torch.matmul(warm, warm)   # cuBLAS's handle and workspace: charged to neither side
    sync()
    m, n, k = entry.m, entry.n, entry.k
    la, lb, _ = entry.layout.split(",")
    a = torch.randn(m, k, device=device, dtype=dt) if la == "row" else torch.randn(k, m, device=device, dtype=dt).t()
    b = torch.randn(k, n, device=device, dtype=dt) if lb == "row" else torch.randn(n, k, device=device, dtype=dt).t()
    sync()

    import gc
    paused = [0.0, None]   # Python's garbage collector: ms paused so far, and when the running pass began

    def collector(phase, info):
        if phase == "start":
            paused[1] = time.perf_counter()
        elif paused[1] is not None:
            paused[0] += (time.perf_counter() - paused[1]) * 1e3
            paused[1] = None

    gc.callbacks.append(collector)

    def timed(fn) -> Tuple[float, float]:
        """(wall ms, of which the garbage collector's pauses)"""
        sync()
        before = paused[0]
        t0 = time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - t0) * 1e3, paused[0] - before

    # `l2c.matmul` imports l2c.ops on first access: timed apart from the calls (README usage pays it in call 1)
    t0 = time.perf_counter()
    matmul = l2c.matmul
    import_ms = (time.perf_counter() - t0) * 1e3

    calls, dispatcher, first_served = [], None, None
    start = time.perf_counter()
    while True:
        torch_ms, torch_gc_ms = timed(lambda: torch.matmul(a, b))
        tuned_before = dispatcher.stats["tuned"] if dispatcher is not None else 0
        began = time.perf_counter() - start
        l2c_ms, l2c_gc_ms = timed(lambda: matmul(a, b))
        dispatcher = default_dispatcher()   # made by the first call (its table load is charged to that call)
        served = dispatcher.stats["tuned"] > tuned_before
        calls.append((len(calls) + 1, round(began, 4), round(torch_ms, 4), round(l2c_ms, 4), served,
                      round(torch_gc_ms, 4), round(l2c_gc_ms, 4)))
        if served and first_served is None:
            first_served = len(calls)
        if first_served is not None and len(calls) - first_served >= after:
            break
        if time.perf_counter() - start > timeout_s:
            break
        time.sleep(gap_s)

    job = queued_job(entry, device)
    preparer = dispatcher.preparer
    from l2c import background
    first_l2c_call = start + calls[0][1]   # l2c's start-up steps, in ms from the first l2c call's start
    startup = [(step, thread, round((t - first_l2c_call) * 1e3, 1)) for step, thread, t in background.timeline()]
    result = {"device": device, "torch_device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "import_l2c_ops_ms": round(import_ms, 3), "table": dispatcher.table.source if dispatcher.table else None,
              "job": {"state": preparer.state(job), "reason": preparer.reason(job) or None,
                      "worker_s": round(preparer.seconds[job.key], 2) if job.key in preparer.seconds else None},
              "stats": dict(dispatcher.stats), "calls": calls, "startup_ms_from_first_call": startup}
    if first_served is not None:   # the served kernel's answer, against torch's
        got, ref = matmul(a, b).float(), torch.matmul(a, b).float()
        result["rel_error_vs_torch"] = ((got - ref).norm() / ref.norm()).item()
    return result


def summarise(calls: List[tuple]) -> dict:
    """The per-call numbers of a serve part, summarised; the first calls, those around the first served one and the
    slow ones kept whole."""
    if not calls:
        return {"calls": 0}
    extra = [c[3] - c[2] for c in calls]
    served = [i for i, c in enumerate(calls) if c[4]]
    first = served[0] if served else None
    worst = max(range(len(calls)), key=lambda i: extra[i])

    def spread(idx: List[int]) -> dict:
        if not idx:
            return {"calls": 0}
        e = sorted(extra[i] for i in idx)
        return {"calls": len(idx), "median_extra_ms": round(statistics.median(e), 4), "max_extra_ms": round(e[-1], 4),
                "median_torch_ms": round(statistics.median(calls[i][2] for i in idx), 4),
                "median_l2c_ms": round(statistics.median(calls[i][3] for i in idx), 4)}

    out = {"calls": len(calls),
           "first_call": {"torch_ms": calls[0][2], "l2c_ms": calls[0][3], "extra_ms": round(extra[0], 4),
                          "served": calls[0][4]},
           "first_served_call": None if first is None else first + 1,
           "seconds_until_served": None if first is None else
           round(calls[first][1] + calls[first][3] / 1e3 - calls[0][1], 3),
           "max_extra_ms": round(extra[worst], 4), "max_extra_call": worst + 1,
           "max_extra_call_gc_ms": calls[worst][6] if len(calls[worst]) > 6 else None,
           "calls_over_50ms_extra": sum(e > EXTRA_MS for e in extra),
           "before_served": spread(list(range(len(calls) if first is None else first))),
           "after_served": spread([] if first is None else list(range(first, len(calls)))),
           "served_calls": len(served), "fallback_calls_after_first_served":
           0 if first is None else sum(not c[4] for c in calls[first:])}
    around = [] if first is None else calls[max(0, first - 2): first + RAW_CALLS - 2]
    out["raw"] = {"fields": ["call", "t_s", "torch_ms", "l2c_ms", "served", "torch_gc_ms", "l2c_gc_ms"],
                  "first": calls[:RAW_CALLS],
                  "around_first_served": around,
                  "slow": [c for c, e in zip(calls, extra) if e > SLOW_MS][:MAX_SLOW]}
    return out


# ---- the parts, from the orchestrating process

def run_serve(kind: str, entry, root: Path, args, settings: Dict[str, str], timeout_s: float) -> dict:
    """(a) or (b) in a fresh process (`serve_part`), its calls summarised. The process gets a minute over
    `timeout_s` for starting (torch, CUDA) and for its last calls."""
    part_out = root / "part.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--part-serve", json.dumps(entry.to_row()),
               "--part-out", str(part_out), "--part-timeout-s", str(timeout_s),
               "--after-served", str(args.after_served), "--gap-ms", str(args.gap_ms)]
    ran = run_tree(command, fresh_env(root, **settings), root, timeout_s + 60)
    part = {"entry": {"m": entry.m, "n": entry.n, "k": entry.k, "dtype": entry.dtype, "layout": entry.layout,
                      "spec": entry.spec_text}, "settings": settings, "rc": ran["rc"], "wall_s": ran["wall_s"],
            "stderr_tail": tail(ran["stderr"])}
    if ran["rc"] != 0 or not part_out.exists():
        part["error"] = f"the {kind} part exited with status {ran['rc']}"
        return part
    measured = json.loads(part_out.read_text())
    calls = measured.pop("calls")
    part.update(measured)
    part["summary"] = summarise(calls)
    return part


def judge_prebuilt(part: dict) -> dict:
    s = part.get("summary") or {}
    first = (s.get("first_call") or {}).get("extra_ms")
    served_from = s.get("first_served_call")
    ok = first is not None and first <= EXTRA_MS and served_from is not None and served_from <= 2
    return {"criterion": f"first l2c.matmul <= {EXTRA_MS:g} ms over torch.matmul, served tuned from call 1 or 2",
            "first_call_extra_ms": first, "first_served_call": served_from,
            "first_call_extra_ms_with_import": None if first is None else
            round(first + part.get("import_l2c_ops_ms", 0.0), 3),
            "max_extra_ms": s.get("max_extra_ms"), "pass": bool(ok)}


def judge_later(part: dict) -> dict:
    s = part.get("summary") or {}
    first = (s.get("first_call") or {}).get("extra_ms")
    ok = first is not None and first <= EXTRA_MS and s.get("first_served_call") == 1
    return {"criterion": f"a later process with (a)'s caches: first l2c.matmul <= {EXTRA_MS:g} ms over torch.matmul "
                         f"and served tuned from call 1", "first_call_extra_ms": first,
            "first_served_call": s.get("first_served_call"), "max_extra_ms": s.get("max_extra_ms"), "pass": bool(ok)}


def judge_unbuilt(part: dict) -> dict:
    s = part.get("summary") or {}
    worst = s.get("max_extra_ms")
    ok = worst is not None and worst <= EXTRA_MS and s.get("first_served_call") is not None
    return {"criterion": f"no call > {EXTRA_MS:g} ms over torch.matmul; served once built and verified",
            "max_extra_ms": worst, "max_extra_call": s.get("max_extra_call"),
            "max_extra_call_gc_ms": s.get("max_extra_call_gc_ms"),
            "seconds_until_served": s.get("seconds_until_served"), "first_served_call": s.get("first_served_call"),
            "worker_s": (part.get("job") or {}).get("worker_s"), "pass": bool(ok)}


def run_build(pack, root: Path, args) -> dict:
    specs = batch_specs(pack, args.build_kernels, args.build_store)
    pool = root / "batch.l2"
    pool.write_text("\n".join(specs))
    env = fresh_env(root, L2C_PACK=str(root / "no_pack.zip"))   # a pack that does not exist: nvcc builds all
    ran = run_tree([sys.executable, "-m", "l2c", "build", str(pool), "--target", "cutlass", "-j",
                    str(args.build_jobs)], env, root, args.build_timeout_s)
    lines = ran["stdout"].splitlines()
    built = [line for line in lines if line.startswith("built ")]
    sizes = [int(line.split("(one of ", 1)[1].split()[0]) if "(one of " in line else 1
             for line in built if "(cached)" not in line]   # per kernel: how many its nvcc run compiled
    per_kernel = ran["cpu_s"] / len(specs)
    stored = sum(f"store={args.build_store}" in text for text in specs) if args.build_store != "tma" else len(specs)
    return {"kernels": len(specs), "store": args.build_store, "kernels_with_store": stored, "built": len(built),
            "failed": sum(line.startswith("FAILED ") for line in lines),
            "cached": sum("(cached)" in line for line in built), "jobs": args.build_jobs, "rc": ran["rc"],
            "wall_s": ran["wall_s"], "cpu_s": ran["cpu_s"], "cpu_s_per_kernel": round(per_kernel, 2),
            "cpu_share": round(ran["cpu_s"] / ran["wall_s"], 2) if ran["wall_s"] else None,
            "nvcc_runs_by_size": {size: sizes.count(size) // size for size in sorted(set(sizes))},
            "names": [s.split()[1] for s in specs],
            "command": ran["command"], "stdout_tail": tail(ran["stdout"]), "stderr_tail": tail(ran["stderr"]),
            "criterion": f"<= {BUILD_CPU_S:g} s of one core per new CUTLASS kernel (user + sys of the process tree, "
                         f"including the l2c process itself)",
            "pass": ran["rc"] == 0 and len(built) == len(specs) and per_kernel <= BUILD_CPU_S}


def run_tune(root: Path, args) -> dict:
    ran = run_tree([sys.executable, "-m", "l2c", *TUNE_ARGS], fresh_env(root), root, args.tune_timeout_s)
    return {"command": "l2c " + " ".join(TUNE_ARGS), "rc": ran["rc"], "wall_s": ran["wall_s"],
            "cpu_s": ran["cpu_s"], "timed_out": ran["rc"] == 124, "stdout_tail": tail(ran["stdout"]),
            "stderr_tail": tail(ran["stderr"]),
            "criterion": f"<= {TUNE_WALL_S:g} s wall from a fresh store and caches, exit status 0",
            "pass": ran["rc"] == 0 and ran["wall_s"] <= TUNE_WALL_S}


def toolchain_facts(pack) -> dict:
    """The local nvcc against the pack's: the pack serves a kernel only to the nvcc version that built it."""
    from l2c.errors import BuildError
    from l2c.targets.cutlass.toolchain import find_nvcc, nvcc_version
    local, why = None, None
    try:
        local = nvcc_version(find_nvcc())
    except BuildError as err:
        why = str(err)
    pack_nvcc = sorted({e.nvcc_version for e in pack.entries.values()})
    return {"nvcc": local, "nvcc_error": why, "pack": pack.path,
            "pack_entries": len(pack.entries), "pack_nvcc": pack_nvcc,
            "pack_usable_here": local is None or local in pack_nvcc}


def environment_row(command: str, args) -> dict:
    import torch
    from l2c.devices import get_device
    from l2c.results_file import environment
    env = environment(get_device("cuda" if torch.cuda.is_available() else "cpu"), [], command,
                      {k: v for k, v in vars(args).items() if not k.startswith("part_")})
    env["cpu_count"] = os.cpu_count()
    env["cpus_usable"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    try:
        with open("/proc/meminfo") as f:
            env["mem_total_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return env


def parse_shape(text: str) -> Tuple[int, int, int]:
    m, n, k = (int(x) for x in text.lower().split("x"))
    return m, n, k


def main(argv=None) -> int:
    from l2c.search.space import NEW_KERNEL_STORE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="zero_wait_h200.json")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--table", default=str(shipped("tuned", f"{ARCH}.json")),
                    help="the table (a)'s entry is chosen from and served by (default: the shipped eager table)")
    ap.add_argument("--pack", default=None, help="the pack (a) and (b) install from (default: the shipped one)")
    ap.add_argument("--shape", type=parse_shape, default=None, help="MxNxK of (a)'s entry (default: see pick_prebuilt)")
    ap.add_argument("--dtype", choices=["f16", "bf16"], default=None)
    ap.add_argument("--layout", default=None, help="a,b,c layouts of (a)'s entry, e.g. row,col,row")
    ap.add_argument("--prebuilt-timeout-s", type=float, default=60.0, help="(a): stop calling after this long")
    ap.add_argument("--unbuilt-timeout-s", type=float, default=120.0, help="(b): stop calling after this long")
    ap.add_argument("--after-served", type=int, default=20, help="(a), (b): calls measured once served")
    ap.add_argument("--gap-ms", type=float, default=10.0, help="(a), (b): pause between calls")
    ap.add_argument("--build-kernels", type=int, default=32, help="(c): kernels compiled")
    ap.add_argument("--build-jobs", type=int, default=4, help="(c): l2c build -j (kernels per nvcc run follow)")
    ap.add_argument("--build-store", choices=("tma", "direct", "staged"), default=NEW_KERNEL_STORE,
                    help="(c): the epilogue store of the kernels built, where their spec is valid with it (default: "
                         "the tuner's for new kernels)")
    ap.add_argument("--build-timeout-s", type=float, default=180.0)
    ap.add_argument("--tune-timeout-s", type=float, default=150.0, help="(d): killed after this long (a fail)")
    ap.add_argument("--tmp", default=None, help="where the parts' temporary caches go (default: the system's)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary caches")
    ap.add_argument("--part-serve", help=argparse.SUPPRESS)   # internal: run (a) or (b) in this process
    ap.add_argument("--part-out", help=argparse.SUPPRESS)
    ap.add_argument("--part-timeout-s", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.part_serve:
        result = serve_part(json.loads(args.part_serve), args.part_timeout_s, args.after_served, args.gap_ms / 1e3)
        Path(args.part_out).write_text(json.dumps(result) + "\n")
        return 0

    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if set(parts) - set(PARTS):
        ap.error(f"unknown part(s) {', '.join(sorted(set(parts) - set(PARTS)))}")
    if "later" in parts and ("prebuilt" not in parts or parts.index("prebuilt") > parts.index("later")):
        ap.error("the later part reuses the caches of the prebuilt part: list prebuilt before it")
    from l2c.targets.cutlass.pack import read_pack
    from l2c.tuned_table import load_table
    pack_path = Path(args.pack).resolve() if args.pack else shipped("packs", f"{ARCH}.zip")
    pack = read_pack(pack_path)
    pack_settings = {"L2C_PACK": str(pack_path)} if args.pack else {}
    table_path = Path(args.table).resolve()
    table_settings = {} if table_path == shipped("tuned", f"{ARCH}.json").resolve() else \
        {"L2C_TUNED_TABLE": str(table_path)}
    prebuilt = pick_prebuilt(load_table(table_path), pack, args.shape, args.dtype, args.layout)
    unbuilt, change = unbuilt_variant(prebuilt, pack)

    command = " ".join(["scripts/zero_wait.py"] + (sys.argv[1:] if argv is None else list(argv)))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"issue": 19, "command": command, "toolchain": toolchain_facts(pack), "cache_vars": list(CACHE_VARS),
              "parts": {}, "criteria": {}, "environment": None}

    def save():
        out.write_text(json.dumps(result, indent=1) + "\n")

    tmp = Path(tempfile.mkdtemp(prefix="l2c_zero_wait_", dir=args.tmp))
    incomplete = 0
    try:
        for name in parts:
            root = tmp / ("prebuilt" if name == "later" else name)
            root.mkdir(exist_ok=name == "later")
            print(f"[{name}] ...", flush=True)
            if name == "prebuilt":
                part = run_serve(name, prebuilt, root, args, {**table_settings, **pack_settings},
                                 args.prebuilt_timeout_s)
                part.update(kernel=served_kernel(prebuilt)[2], in_pack=in_pack(prebuilt, pack))
                verdict = judge_prebuilt(part)
            elif name == "later":
                part = run_serve(name, prebuilt, root, args, {**table_settings, **pack_settings},
                                 args.prebuilt_timeout_s)
                part.update(kernel=served_kernel(prebuilt)[2], in_pack=in_pack(prebuilt, pack))
                verdict = judge_later(part)
            elif name == "unbuilt":
                table = root / "unbuilt_table.json"
                table.write_text(json.dumps({"format": 1, "arch": ARCH, "protocol": "call",
                                             "note": f"(a)'s entry with {change}: a kernel the pack does not hold",
                                             "entries": [unbuilt.to_row()]}, indent=1) + "\n")
                part = run_serve(name, unbuilt, root, args, {"L2C_TUNED_TABLE": str(table), **pack_settings},
                                 args.unbuilt_timeout_s)
                part.update(changed=change, kernel=served_kernel(unbuilt)[2], in_pack=in_pack(unbuilt, pack))
                verdict = judge_unbuilt(part)
            elif name == "build":
                part = run_build(pack, root, args)
                verdict = {k: part[k] for k in ("criterion", "kernels", "built", "jobs", "wall_s", "cpu_s",
                                                "cpu_s_per_kernel", "pass")}
            else:
                part = run_tune(root, args)
                verdict = {k: part[k] for k in ("criterion", "command", "rc", "wall_s", "pass")}
            incomplete += bool(part.get("error")) or part.get("rc") not in (0, 1, 124)   # 124: over its time
            result["parts"][name] = part
            result["criteria"][name] = verdict
            save()
            print(f"[{name}] {json.dumps(verdict)}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"temporary caches kept in {tmp}")
    result["environment"] = environment_row(command, args)
    result["all_pass"] = all(v["pass"] for v in result["criteria"].values()) and len(result["criteria"]) == len(PARTS)
    save()
    print(f"wrote {out}: " + ", ".join(f"{k} {'pass' if v['pass'] else 'FAIL'}" for k, v in result["criteria"].items()))
    return 1 if incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
