"""`l2c tune`: search the spec space per shape (Optuna + learned policy + optional LLM proposals).

Measures on the GPU (`--runner gpu`, the default). `--runner interpreter` runs real Triton kernels
under the CPU interpreter (a test of the machinery; its figures mean nothing) and `--runner model` uses
the analytic cost model of search/costmodel.py (a CPU demo; figures are a model, not measurements).
Rerunning the same command resumes: finished trials are kept, lost ones are retried. After the search,
each shape's stored leader is measured again (`--confirm`), so the exported winner is a figure of this run.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from ..errors import DataFileError


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="search for the fastest correct kernel per shape and export a tuned table")
    p.add_argument("--shapes", required=True, help="grid | llm | square | FILE | MxNxK,MxNxK,...")
    p.add_argument("--dtype", default="f16", choices=["f16", "bf16", "f32"])
    p.add_argument("--layout", default="row,row,row", help="layouts of A,B,C (row|col each)")
    p.add_argument("--gate", default="none", choices=["none", "silu", "gelu_tanh"],
                   help="tune the gated MLP projection act(A @ B_gate) * (A @ B_up) (`epilogue gate`): N is its "
                        "output width, B has 2N columns (the gate's, then the up projection's; nn.Linear's weight "
                        "is --layout row,col,row); the export's entries serve l2c.gated_matmul and l2c.nn.GatedMLP")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--trials", type=int, default=50, help="evaluated candidates per shape (default 50)")
    p.add_argument("--target", default="triton,cutlass", help="comma-separated targets to search over")
    p.add_argument("--protocol", default="kernel", choices=["kernel", "call", "server"])
    p.add_argument("--runner", default="gpu", choices=["gpu", "interpreter", "model"])
    p.add_argument("--storage", default=None,
                   help="Optuna storage: an RDB URL (sqlite:///..., postgresql://...), journal:PATH, or :memory: "
                        "(default: journal file studies.journal next to the store)")
    p.add_argument("--store", default=None, help="results store (SQLite file; default in the user data dir)")
    p.add_argument("--workers", type=int, default=1, help="worker processes, one per GPU (CUDA_VISIBLE_DEVICES)")
    p.add_argument("--compile-workers", type=int, default=None,
                   help="CPU processes compiling ahead of measurement (default: up to 8 when CUTLASS is searched on the GPU)")
    p.add_argument("--sampler", default="auto", choices=["auto", "tpe", "random", "policy"])
    p.add_argument("--policy", default="auto",
                   help="policy file, `auto` (policy.pt next to the store, trained on the store once it holds 20 "
                        "results for this GPU and protocol; until then, on the GPU, the policy shipped for --arch) "
                        "or `off`")
    p.add_argument("--policy-fraction", type=float, default=0.5, help="share of trials the policy samples")
    p.add_argument("--warm-start", type=int, default=8, help="policy/LLM proposals enqueued per new study")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--seed-specs", nargs="*", default=[], metavar="FILE.l2",
                   help="specs enqueued first in every new study (e.g. a prebuilt pool); their problem knobs are "
                        "ignored, the study's problem is used")
    p.add_argument("--confirm", type=int, default=3, metavar="N",
                   help="after the search, measure each shape's stored leader again (up to N times per shape) until "
                        "the leader is a result of this run; the summary and --export use only such results "
                        "(default 3; 0: the store's best as it stands, which may be stale or a lucky draw)")
    p.add_argument("--export", default=None, metavar="DIR",
                   help="write the tuned table (<arch>.json) and the winning .l2 specs here")
    p.add_argument("--trial-timeout", type=float, default=300.0, metavar="S",
                   help="stop (and restart) a GPU worker that evaluates one trial for longer than S seconds: a "
                        "kernel that hangs; its trial is retried once, then failed; a leader hanging in "
                        "confirmation is failed at once (default 300, which covers an in-process nvcc build)")
    p.add_argument("--reclaim", choices=["dead", "all"], default="dead",
                   help="trials left running: retry those of dead local workers (default) or all of them "
                        "(when no other worker anywhere is running)")
    p.add_argument("--no-llm", action="store_true", help="do not ask an LLM even when one is configured")
    p.add_argument("--llm-model-dir", default=None, help="local HF model for LLM proposals (L2C_LLM_MODEL_DIR)")
    p.add_argument("--llm-server", default=None, help="OpenAI-compatible server URL (L2C_LLM_URL)")
    p.add_argument("--llm-model", default=None, help="model name on the server (L2C_LLM_MODEL)")
    p.set_defaults(func=run)


MIN_STORE_RESULTS = 20   # results a store needs before a policy is trained on it
MAX_SEED = 2 ** 31 - 1   # the samplers take seeds below 2^32, offset per worker and shape (study.make_sampler)

_CAVEAT = {"model": "; analytic cost MODEL, not a measurement",
           "interpreter": "; CPU interpreter, not a performance figure"}


def policy_source(policy_arg: str, file_exists: bool, stored: int, shipped_trained_on: Optional[int]) -> str:
    """Which policy a tune starts from: "file" (`--policy PATH` that exists), "store" (trained on the store's
    results for this GPU and protocol), "shipped" or "none". A policy trained on the store replaces the shipped one
    only once the store holds as many results as that one learned from: one tune's few dozen results would
    otherwise undo thousands."""
    if policy_arg != "auto" and file_exists:
        return "file"
    if stored >= max(MIN_STORE_RESULTS, shipped_trained_on or 0):
        return "store"
    return "shipped" if shipped_trained_on is not None else "none"


def _shipped_policy(args, log):
    """(policy, its file) shipped for --arch, for a GPU tune whose store is too small to train on; (None, None)
    for the interpreter and model runners (their figures are not the GPU measurements it learned from), for an
    architecture with none, or for one the current search space cannot load (logged)."""
    from l2c.search.policy import Policy, shipped_policy_path
    path = shipped_policy_path(args.arch) if args.runner == "gpu" else None
    if path is None:
        return None, None
    try:
        return Policy.load(path), path
    except ValueError as err:
        log(f"policy: the shipped policy does not fit the current search space ({err}); not used")
        return None, None


def _llm(args, targets, log):
    if args.no_llm:
        return None
    from l2c.search.llm import LLMProposer, backend_from_config
    from ..cli import UsageError
    try:
        backend = backend_from_config(args.llm_model_dir, args.llm_server, args.llm_model)
    except ImportError as err:
        raise UsageError(f"a local model needs the llm extra (pip install 'l2c[llm]'): {err}") from None
    except (ValueError, OSError) as err:   # no model name, not an http(s) URL, not a model folder
        raise UsageError(f"LLM: {err}") from None
    if backend is None:
        log("no LLM configured; searching without LLM proposals")
        return None
    return LLMProposer(backend, target=targets[0])


def run(args) -> int:
    import optuna

    from ..cli import UsageError
    from l2c.search.confirm import confirm
    from l2c.search.driver import tune
    from l2c.search.export import check_export, export
    from ..parser import parse_file
    from l2c.search.space import check_targets, problems, shapes_from_arg
    from l2c.search.store import Store
    from l2c.search.study import TuneConfig

    log = lambda s: print(s, file=sys.stderr, flush=True)   # noqa: E731
    try:
        targets = check_targets([t.strip() for t in args.target.split(",") if t.strip()])
        probs = problems(shapes_from_arg(args.shapes), dtype=args.dtype, layout=args.layout, arch=args.arch,
                         gate=args.gate)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if not probs:
        raise UsageError("no shapes to tune")
    from ..arch import ARCHS
    if args.arch not in ARCHS:
        raise UsageError(f"--arch {args.arch!r}: l2c knows {', '.join(sorted(ARCHS))}")
    if args.trials < 1 or args.workers < 1:
        raise UsageError("--trials and --workers must be at least 1")
    if args.confirm < 0:
        raise UsageError("--confirm must be 0 or more")
    if not args.trial_timeout > 0:
        raise UsageError("--trial-timeout must be a positive number of seconds")
    if not 0 <= args.policy_fraction <= 1 or args.warm_start < 0 or (
            args.compile_workers is not None and args.compile_workers < 1):
        raise UsageError("--policy-fraction must be from 0 to 1, --warm-start 0 or more, --compile-workers 1 or more")
    if args.seed is not None and not 0 <= args.seed <= MAX_SEED:
        raise UsageError(f"--seed must be between 0 and {MAX_SEED} (each worker and shape adds its own offset)")
    if args.runner == "gpu":
        import torch
        if not torch.cuda.is_available():
            print("l2c tune: error: no CUDA GPU on this machine; tuning measures kernels on a GPU. "
                  "Use --runner interpreter to exercise the machinery on CPU (tiny shapes; figures mean nothing) "
                  "or --runner model for the analytic cost-model demo.", file=sys.stderr)
            return 2
        if torch.cuda.device_count() < args.workers:
            raise UsageError(f"--workers {args.workers} but only {torch.cuda.device_count()} GPU(s) are visible")
    elif args.workers > 1:
        raise UsageError("--workers > 1 is for GPU runs (one process per GPU)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    store = Store(args.store)
    compile_workers = args.compile_workers
    if compile_workers is None:
        import os
        # Triton compiles on first call, in the measuring process: a pool only pays for nvcc (CUTLASS).
        compile_workers = min(8, os.cpu_count() or 1) if args.runner == "gpu" and "cutlass" in targets else 0
    cfg = TuneConfig(targets=targets, n_trials=args.trials, protocol=args.protocol, sampler=args.sampler,
                     policy_fraction=args.policy_fraction, warm_start=args.warm_start, seed=args.seed,
                     compile_workers=compile_workers, trial_timeout_s=args.trial_timeout,
                     seed_specs=tuple(spec for path in args.seed_specs for spec in parse_file(path)))

    from l2c.search.runners import make_runner
    # GPU measurements run in worker processes (a faulting kernel costs a restart, not the tune)
    runner = args.runner if args.runner == "gpu" else make_runner(args.runner, args.protocol)
    if args.runner == "gpu":
        import torch
        gpu = torch.cuda.get_device_name(0)
    else:
        gpu = runner.gpu
    if args.export:   # before the search: a table the export must not replace, or a folder it cannot write
        try:
            check_export(Path(args.export), probs, gpu, args.protocol)
        except DataFileError as err:
            raise UsageError(str(err)) from None

    # policy_path: the file the policy is read from (worker processes load it); save_path: where the policy
    # trained on this store is written, after the run as well
    policy, policy_path, save_path = None, None, None
    if args.policy != "off":
        from l2c.search.policy import Policy, default_policy_path
        save_path = default_policy_path(store.path) if args.policy == "auto" else Path(args.policy)
        n = sum(1 for _ in store.results(gpu=gpu, protocol=args.protocol)) if gpu else 0
        shipped, shipped_path = _shipped_policy(args, log) if args.policy == "auto" else (None, None)
        source = policy_source(args.policy, save_path.exists(), n, shipped.trained_on if shipped else None)
        if source == "file":
            try:
                policy, policy_path = Policy.load(save_path), save_path
            except ValueError as err:   # a policy of another search space: Policy.load says so
                raise UsageError(f"--policy: {err}") from None
            except Exception as err:  # noqa: BLE001 - any other file: torch's reader raises many kinds
                raise UsageError(f"--policy {save_path}: not a policy file written by l2c (reading it as one "
                                 f"failed: {type(err).__name__})") from None
            log(f"policy loaded from {save_path} (trained on {policy.trained_on} results)")
        elif source == "store":
            policy = Policy(seed=args.seed or 0)
            policy.fit_store(store, gpu=gpu, protocol=args.protocol)
            policy.save(save_path)
            policy_path = save_path
            log(f"policy trained on {n} stored results for {gpu}/{args.protocol}; saved to {save_path}")
        elif source == "shipped":
            policy, policy_path = shipped, shipped_path
            log(f"policy: {n} stored results for this GPU and protocol, fewer than the {shipped.trained_on} "
                f"measured results the policy shipped for {args.arch} learned from; starting from it ({policy_path})")
        else:
            log(f"policy: only {n} stored results for this GPU and protocol; searching with "
                f"{'TPE' if args.sampler in ('auto', 'policy') else args.sampler} alone until there are "
                f"{MIN_STORE_RESULTS}")
        if policy is None and cfg.sampler == "policy":
            cfg.sampler = "tpe"

    llm = _llm(args, targets, log)
    log(f"tuning {len(probs)} shape(s) x {args.trials} trials, targets {','.join(targets)}, "
        f"protocol {args.protocol}, runner {args.runner}; store {store.path}")
    studies = tune(probs, cfg, runner, store, storage_arg=args.storage, workers=args.workers, policy=policy,
                   policy_path=policy_path, llm=llm, log=log, reclaim_all=args.reclaim == "all")

    since = None
    if args.confirm:
        log(f"confirming each shape's leader: up to {args.confirm} re-measurement(s) per shape")
        since = confirm(probs, runner, store, args.protocol, args.confirm, workers=args.workers, log=log,
                        compile_workers=compile_workers, trial_timeout_s=args.trial_timeout)
    if save_path is not None:   # learn from this run for the next one
        from l2c.search.policy import Policy
        fresh = Policy(seed=args.seed or 0)
        n = fresh.fit_store(store, gpu=gpu, protocol=args.protocol)
        if n:
            fresh.save(save_path)
            log(f"policy retrained on {n} results; saved to {save_path}")
    for p in probs:
        best = store.best(p.key(), gpu, args.protocol, confirmed_since=since)
        if best is None:
            print(f"{p.shape}: no verified kernel" + (" confirmed in this run" if since is not None else ""))
        else:
            print(f"{p.shape}: {best.speedup:.3f}x vs torch.matmul ({best.tflops:.4g} vs {best.baseline_tflops:.4g} "
                  f"TFLOP/s, {best.target}, {args.protocol}{_CAVEAT.get(args.runner, '')})")
    if args.export:
        for arch, path in export(store, probs, gpu, args.protocol, Path(args.export), confirmed_since=since).items():
            print(f"wrote {path} and {Path(args.export) / 'specs'}/*.l2")
    return 0
