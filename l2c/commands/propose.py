"""`l2c propose`: ask a language model for kernel specs for one problem, constrained by grammar/l2.lark.

Prints the valid proposals as .l2 text on stdout and a summary of the dropped ones on stderr. Without a
configured model it says how to configure one and exits 2.
"""
from __future__ import annotations

import logging
import math
import sys

from ..cli import seed


def add_parser(sub) -> None:
    p = sub.add_parser("propose", help="grammar-constrained LLM proposals of kernel specs for one problem")
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", choices=["f16", "bf16", "f32"], default="f16")
    p.add_argument("--layout", default="row,row,row", help="layouts of A,B,C (default row,row,row)")
    p.add_argument("--target", choices=["triton", "cutlass"], default="cutlass")
    p.add_argument("--arch", default="sm_90")
    src = p.add_argument_group("model (one of; or L2C_LLM_MODEL_DIR, or L2C_LLM_URL + L2C_LLM_MODEL)")
    src.add_argument("--model-dir", help="local Hugging Face model directory (needs the llm extra)")
    src.add_argument("--server", help="OpenAI-compatible server URL, e.g. http://localhost:8000/v1 (vLLM)")
    src.add_argument("--model", help="model name on the server")
    p.add_argument("--history", help="measured results, JSON lines with spec, tflops, baseline_tflops")
    p.add_argument("-n", dest="count", type=int, default=4, help="number of proposals (default 4)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="server request timeout in seconds")
    p.add_argument("--retries", type=int, default=3, help="server retries on timeouts and 5xx")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..cli import UsageError
    try:
        from ..search.llm import NOT_CONFIGURED, InfeasibleProblem, LLMProposer, backend_from_config, \
            history_from_jsonl
        from ..search.space import Problem
    except ImportError as err:  # pragma: no cover - the search package ships with l2c
        raise UsageError(f"the search package is unavailable: {err}")
    layouts = args.layout.split(",")
    if len(layouts) != 3 or any(x not in ("row", "col") for x in layouts):
        raise UsageError(f"--layout must be three of row/col separated by commas, not {args.layout!r}")
    if args.count < 1:
        raise UsageError("-n must be at least 1")
    from ..arch import ARCHS
    from ..knobs import MAX_DIM
    if args.arch not in ARCHS:
        raise UsageError(f"--arch {args.arch!r}: l2c knows {', '.join(sorted(ARCHS))}")
    for name in ("m", "n", "k", "batch"):
        if not 1 <= getattr(args, name) <= MAX_DIM:
            raise UsageError(f"--{name} must be from 1 to {MAX_DIM}")
    if not 0 < args.timeout < math.inf or args.retries < 0 or not 0 <= args.temperature < math.inf:
        raise UsageError("--timeout must be a positive number of seconds, --retries 0 or more, --temperature a "
                         "finite number 0 or more")
    problem = Problem(args.m, args.n, args.k, batch=args.batch, dtype=args.dtype, layout_a=layouts[0],
                      layout_b=layouts[1], layout_c=layouts[2], arch=args.arch)
    try:
        backend = backend_from_config(args.model_dir, args.server, args.model, timeout_s=args.timeout,
                                      retries=args.retries)
    except ImportError as err:
        raise UsageError(f"a local model needs the llm extra (pip install 'l2c[llm]'): {err}")
    except (ValueError, OSError) as err:
        raise UsageError(str(err))
    if backend is None:
        print(f"l2c propose: {NOT_CONFIGURED}", file=sys.stderr)
        return 2
    try:
        history = history_from_jsonl(args.history, problem, args.target) if args.history else []
    except (OSError, ValueError) as err:
        raise UsageError(str(err))
    logging.basicConfig(level=logging.ERROR)   # drops are summarised below, not logged one by one
    proposer = LLMProposer(backend, target=args.target, temperature=args.temperature, seed=args.seed)
    try:
        proposals = proposer.propose(problem, history, args.count)
    except InfeasibleProblem as err:
        raise UsageError(str(err))
    for prop in proposals:
        print(f"# {prop.source} for {problem.key()} on {prop.target}")
        print(prop.spec.to_l2())
    print(f"l2c propose: {len(proposals)} valid proposal(s) from {proposer.source}; "
          f"{len(proposer.dropped)} dropped", file=sys.stderr)
    for reason, count in proposer.counts.most_common():
        example = next(d.reason for d in proposer.dropped if d.reason.split(":", 1)[0] == reason)
        print(f"  {count} x {reason}  (e.g. {example})", file=sys.stderr)
    return 0 if proposals else 1
