"""`l2c verify spec.l2 --shape MxNxK`: build each kernel and check it against a float reference.

Fresh random inputs, NaN-poisoned output, relative error against the spec's tolerance and an elementwise bound
(l2c.verify). On a machine without a GPU, `--device cpu` runs Triton kernels under the Triton interpreter (slow;
small shapes); CUTLASS kernels need the GPU. Exits 1 if any check fails.
"""
from __future__ import annotations

import os
import sys

from . import validated_kernels
from ..cli import seed


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="build kernels and verify them against a float reference")
    p.add_argument("specs", nargs="+", help=".l2 files")
    p.add_argument("--shape", default="127x65x33",
                   help="MxNxK[,MxNxK...]; a dimension the spec fixes is taken from the spec (default 127x65x33)")
    p.add_argument("--batch", type=int, default=1, help="batch for specs with problem batch=any")
    p.add_argument("--target", choices=["triton", "cutlass", "all"], default="all")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--seed", type=seed, default=None)
    p.set_defaults(func=run)


def _shapes(text: str):
    from ..cli import UsageError
    try:
        return [tuple(int(x) for x in part.lower().split("x")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--shape wants MxNxK[,MxNxK...], got {text!r}") from None


def run(args) -> int:
    from ..cli import UsageError
    shapes = _shapes(args.shape)
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise UsageError(f"--shape wants positive MxNxK triples, got {args.shape!r}")
    if args.batch < 1:
        raise UsageError(f"--batch wants a positive count, got {args.batch}")
    valids = validated_kernels(args.specs, args.target, args.arch)
    if args.device == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise UsageError("--device cpu needs TRITON_INTERPRET=1 set before l2c starts")
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("no CUDA GPU is visible; use --device cpu (Triton interpreter) on a CPU-only machine")
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise UsageError("no CUDA GPU is visible: run Triton kernels on the CPU with --device cpu")
    from ..build import build
    from ..errors import BuildError
    from ..verify import verify
    _check_memory(valids, shapes, args.batch, device)
    failed = checked = 0
    for valid in valids:
        if device == "cpu" and valid.target == "cutlass":
            print(f"skip {valid.name} [cutlass]: CUTLASS kernels run only on the GPU (`l2c build` compiles them)")
            continue
        if device == "cpu" and "bf16" in (valid.spec.types_a, valid.spec.types_b):
            print(f"skip {valid.name} [triton]: bf16 tl.dot is wrong in the Triton interpreter (a known Triton bug); "
                  f"verify bf16 kernels on the GPU")
            continue
        try:
            kernel = build(valid)
        except BuildError as err:
            failed += 1
            print(f"FAIL {valid.name} [{valid.target}]: build failed: {err}")
            continue
        batch = valid.spec.problem_batch if valid.spec.problem_batch != "any" else args.batch
        for m, n, k in spec_shapes(valid.spec, shapes):
            res = verify(kernel, m, n, k, batch=batch, device=device, seed=args.seed)
            failed += not res.ok
            checked += 1
            print(f"{'ok  ' if res.ok else 'FAIL'} {valid.name} [{valid.target}] {m}x{n}x{k}"
                  f"{f' batch {batch}' if batch != 1 else ''} on {device}: rel error {res.rel_error:.2e} "
                  f"(tolerance {res.tolerance:.1e}){'' if res.ok else ': ' + res.reason}")
    if not failed and not checked:
        print("nothing was verified: every kernel was skipped on this device", file=sys.stderr)
        return 1
    return 1 if failed else 0


def spec_shapes(spec, shapes):
    """The shapes a kernel is verified at: each of `shapes` with the dimensions the spec fixes set to its values
    (a decode kernel fixes N and K and takes any M), once each."""
    out = []
    for shape in shapes:
        fixed = tuple(d if f == "any" else int(f) for d, f in zip(shape, (spec.problem_m, spec.problem_n,
                                                                           spec.problem_k)))
        if fixed not in out:
            out.append(fixed)
    return out


def _available_bytes(device: str) -> int:
    """Memory free for the check now: MemAvailable on the CPU (Linux), what CUDA reports free on the GPU."""
    if device == "cuda":
        import torch
        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _check_memory(valids, shapes, batch: int, device: str) -> None:
    """Refuse, before building anything, a shape whose check cannot fit in memory: allocating it would fail, or,
    where the system overcommits memory, succeed and get the process killed when the inputs are written."""
    from ..cli import UsageError
    from ..verify import memory_needed
    available = _available_bytes(device)
    for valid in valids:
        spec = valid.spec
        spec_batch = spec.problem_batch if spec.problem_batch != "any" else batch
        for m, n, k in spec_shapes(spec, shapes):
            need = memory_needed(spec, m, n, k, spec_batch)
            if need > available:
                raise UsageError(f"verifying {valid.name} at {m}x{n}x{k} needs about {need / 2 ** 30:.3g} GiB on "
                                 f"{device}; {available / 2 ** 30:.3g} GiB are available")
