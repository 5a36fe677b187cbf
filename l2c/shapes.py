"""Problem-shape sets that `l2c bench` measures on, and the FLOP buckets results are broken down by.

Sets (see ../shared/BENCHMARKING.md):

- ``grid``: the 1,000 shapes M, N, K in {64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384}^3,
  the public HGEMM benchmark grid.
- ``llm``: the linear layers of common open LLMs as ``Y = X @ W^T`` with M = tokens, K = in-features,
  N = out-features, at token counts 1, 16, 128, 512, 2048, 8192. Models (dims from their published
  configs; models with identical linear dims are listed once):

  ====================  ======  ============  =====  ========  ========  ===========
  model                 hidden  intermediate  heads  kv heads  head dim  fused QKV N
  ====================  ======  ============  =====  ========  ========  ===========
  Llama-3.2-1B          2048    8192          32     8         64        3072
  Llama-3.2-3B          3072    8192          24     8         128       5120
  Llama-3.1-8B          4096    14336         32     8         128       6144
  (Mistral-7B has the same linear dims as Llama-3.1-8B)
  Qwen2.5-7B            3584    18944         28     4         128       4608
  Qwen2.5-14B           5120    13824         40     8         128       7168
  Llama-3.1-70B         8192    28672         64     8         128       10240
  ====================  ======  ============  =====  ========  ========  ===========

  Per model five layers: fused QKV (N = (heads + 2 kv heads) x head dim, K = hidden), attention output
  (N = K = hidden), MLP up or gate alone (N = intermediate, K = hidden; what HF eager runs), fused
  gate+up (N = 2 x intermediate, K = hidden; what vLLM runs) and MLP down (N = hidden, K = intermediate).
- ``square``: M = N = K over the grid sizes plus 1000, 3000, 5000 (off the power-of-two tiles, still
  16-byte aligned for f16).
- ``offgrid``: shapes no table was tuned on, the check that the dispatcher never makes a call slower:
  240 drawn from a fixed seed (M log-uniform in 1-16384, N and K multiples of 8 log-uniform in 64-16384)
  and 60 ``llm`` weights at token counts drawn from 3-6000 outside ``LLM_TOKENS`` and ``SERVE_TOKENS``.
- ``between`` and ``heldout``: 200 shapes under 1 GFLOP each, from two more fixed seeds (M log-uniform in
  16-16384, N and K multiples of 8 log-uniform in 64-16384), how often a cell's kernel loses inside its box (its
  false-win rate): ``between`` was drawn after the cells were made from measured corners and showed where they
  lose (ragged N under wide tiles); ``heldout`` was drawn after that rule was fixed, to check it.
- ``points``: about 1,200 shapes of ``offgrid``'s distribution under 2 GFLOP from a fourth seed, none of them an
  ``offgrid`` shape: the measured points that ``l2c table --near`` makes neighbourhood cells from (``offgrid``
  stays the held-out check of that rule).
- ``points2``: about 540 more such shapes under 1 GFLOP from a fifth seed, none of them an ``offgrid`` or ``points``
  shape: denser points where small calls are decided.
- ``serve``: LLM decoding and batched decoding, memory-bound for small M: the weights of Llama-3.1-8B,
  Llama-3.1-70B, Qwen2.5-7B, Qwen2.5-32B and Mistral-7B (q, kv, o, fused qkv, gate/up, fused gate_up,
  down, lm_head) at ``SERVE_TOKENS`` tokens.
- ``decode``: the ``serve`` weights at the ``SERVE_TOKENS`` up to 64 (1-64 tokens, where the weight's read is the
  cost): what a GPU's own table measures for decoding (``scripts/gpu.py gpu_serve``).
- ``decode_between``: the same weights at ``DECODE_BETWEEN_TOKENS`` (3-56 tokens, none a ``SERVE_TOKENS`` count): the
  held-out check of the entries made from ``decode``, served only by their token ranges.
- ``decode_batched``: the ``serve`` weights at the ``SERVE_TOKENS`` above 64 (96-512 tokens, batched decoding):
  ``serve`` less ``decode``.
- a file: one ``M N K`` (optionally ``M N K BATCH``) per line, separated by spaces or commas; ``#``
  starts a comment. A bad line is reported as ``file:line: ...``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

from .knobs import MAX_DIM

GRID_DIMS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
LLM_TOKENS = (1, 16, 128, 512, 2048, 8192)
SQUARE_EXTRA = (1000, 3000, 5000)

# name -> (hidden, intermediate, attention heads, kv heads, head dim)
LLM_MODELS: Dict[str, Tuple[int, int, int, int, int]] = {
    "Llama-3.2-1B": (2048, 8192, 32, 8, 64),
    "Llama-3.2-3B": (3072, 8192, 24, 8, 128),
    "Llama-3.1-8B": (4096, 14336, 32, 8, 128),
    "Qwen2.5-7B": (3584, 18944, 28, 4, 128),
    "Qwen2.5-14B": (5120, 13824, 40, 8, 128),
    "Llama-3.1-70B": (8192, 28672, 64, 8, 128),
}

# name -> (hidden, intermediate, attention heads, kv heads, head dim, vocabulary): the decoding set's models
SERVE_MODELS: Dict[str, Tuple[int, int, int, int, int, int]] = {
    "Llama-3.1-8B": (4096, 14336, 32, 8, 128, 128256),
    "Llama-3.1-70B": (8192, 28672, 64, 8, 128, 128256),
    "Qwen2.5-7B": (3584, 18944, 28, 4, 128, 152064),
    "Qwen2.5-32B": (5120, 27648, 40, 8, 128, 152064),
    "Mistral-7B": (4096, 14336, 32, 8, 128, 32768),
}
SERVE_TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
DECODE_MAX_TOKENS = 64
DECODE_BETWEEN_TOKENS = (3, 6, 12, 20, 28, 40, 56)
OFFGRID_SEED = 20261201
BETWEEN_SEED = 20261202
HELDOUT_SEED = 20261203
POINTS_SEED = 20261204
POINTS2_SEED = 20261205

# FLOP bucket edges (decimal units): label, lower bound inclusive.
BUCKETS: Tuple[Tuple[str, float], ...] = (
    ("<1 GFLOP", 0.0),
    ("1-64 GFLOP", 1e9),
    ("64 GFLOP-1 TFLOP", 64e9),
    (">=1 TFLOP", 1e12),
)
BUCKET_LABELS = tuple(label for label, _ in BUCKETS)


@dataclass(frozen=True, order=True)
class Shape:
    """One GEMM problem: (batch of) M x K times K x N. `label` says where it came from (not compared)."""
    m: int
    n: int
    k: int
    batch: int = 1
    label: str = field(default="", compare=False)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def key(self) -> Tuple[int, int, int, int]:
        return (self.m, self.n, self.k, self.batch)

    def __str__(self) -> str:
        dims = f"{self.m}x{self.n}x{self.k}"
        return dims if self.batch == 1 else f"{self.batch}x{dims}"


def bucket(flops: float) -> str:
    """The FLOP bucket label of a problem of `flops` floating-point operations (2*M*N*K*batch)."""
    label = BUCKETS[0][0]
    for name, lower in BUCKETS:
        if flops >= lower:
            label = name
    return label


def grid_shapes() -> List[Shape]:
    return [Shape(m, n, k, label="grid") for m in GRID_DIMS for n in GRID_DIMS for k in GRID_DIMS]


def llm_layers() -> List[Tuple[str, int, int]]:
    """(model/layer label, N, K) of every linear layer in LLM_MODELS, before token counts are applied."""
    layers = []
    for model, (hidden, inter, heads, kv_heads, head_dim) in LLM_MODELS.items():
        layers += [
            (f"{model} qkv", (heads + 2 * kv_heads) * head_dim, hidden),
            (f"{model} o_proj", hidden, hidden),
            (f"{model} up", inter, hidden),
            (f"{model} gate_up", 2 * inter, hidden),
            (f"{model} down", hidden, inter),
        ]
    return layers


def _at_token_counts(tokens: Tuple[int, ...], layers: List[Tuple[str, int, int]]) -> List[Shape]:
    """Every (tokens, layer); a shape shared by several layers is listed once, labelled with all of them."""
    by_key: Dict[Tuple[int, int, int], List[str]] = {}
    for m in tokens:
        for label, n, k in layers:
            by_key.setdefault((m, n, k), []).append(f"{label} T={m}")
    return [Shape(m, n, k, label="; ".join(labels)) for (m, n, k), labels in by_key.items()]


def llm_shapes() -> List[Shape]:
    """Every (tokens, layer) of the LLM set."""
    return _at_token_counts(LLM_TOKENS, llm_layers())


def serve_layers() -> List[Tuple[str, int, int]]:
    """(model/layer label, N, K) of every weight of SERVE_MODELS as nn.Linear holds it (out, in)."""
    layers = []
    for model, (hidden, inter, heads, kv_heads, head_dim, vocab) in SERVE_MODELS.items():
        layers += [
            (f"{model} q", heads * head_dim, hidden),
            (f"{model} k/v", kv_heads * head_dim, hidden),
            (f"{model} o", hidden, heads * head_dim),
            (f"{model} qkv", (heads + 2 * kv_heads) * head_dim, hidden),
            (f"{model} gate/up", inter, hidden),
            (f"{model} gate_up", 2 * inter, hidden),
            (f"{model} down", hidden, inter),
            (f"{model} lm_head", vocab, hidden),
        ]
    return layers


def serve_shapes() -> List[Shape]:
    """Every (tokens, weight) of the decoding set."""
    return _at_token_counts(SERVE_TOKENS, serve_layers())


def decode_shapes() -> List[Shape]:
    """The decoding weights at the SERVE_TOKENS up to DECODE_MAX_TOKENS."""
    return _at_token_counts(tuple(m for m in SERVE_TOKENS if m <= DECODE_MAX_TOKENS), serve_layers())


def decode_batched_shapes() -> List[Shape]:
    """The decoding weights at the SERVE_TOKENS above DECODE_MAX_TOKENS."""
    return _at_token_counts(tuple(m for m in SERVE_TOKENS if m > DECODE_MAX_TOKENS), serve_layers())


def decode_between_shapes() -> List[Shape]:
    """The decoding weights at DECODE_BETWEEN_TOKENS: token counts between those `decode` measures."""
    return _at_token_counts(DECODE_BETWEEN_TOKENS, serve_layers())


def _offgrid_draws(seed: int, count: int, label: str, max_flops: float = float("inf")) -> List[Shape]:
    """`count` shapes of `offgrid`'s distribution (module docstring) from `seed`, four in five drawn at random and
    one in five an `llm` or `serve` weight at a token count outside LLM_TOKENS and SERVE_TOKENS, each under
    `max_flops`."""
    import math
    import random
    rng = random.Random(seed)

    def log_uniform(lo: int, hi: int) -> float:
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))

    shapes: List[Shape] = []
    layers = llm_layers() + [(name, n, k) for name, n, k in serve_layers()]
    taken = set(LLM_TOKENS) | set(SERVE_TOKENS)
    drawn = round(count * 0.8)
    while len(shapes) < drawn:
        m = max(1, min(16384, round(log_uniform(1, 16384))))
        n, k = (max(64, min(16384, 8 * round(log_uniform(64, 16384) / 8))) for _ in range(2))
        if 2 * m * n * k < max_flops:
            shapes.append(Shape(m, n, k, label=label))
    while len(shapes) < count:
        name, n, k = layers[rng.randrange(len(layers))]
        m = round(log_uniform(3, 6000))
        if m not in taken and 2 * m * n * k < max_flops:
            shapes.append(Shape(m, n, k, label=f"{name} T={m}" if label == "offgrid" else label))
    return shapes


def offgrid_shapes() -> List[Shape]:
    """300 shapes from a fixed seed that no table was tuned on (module docstring)."""
    return _offgrid_draws(OFFGRID_SEED, 300, "offgrid")


def points_shapes() -> List[Shape]:
    """Shapes of `offgrid`'s distribution under 2 GFLOP from another seed, none of them an `offgrid` shape: where the
    neighbourhood cells' points are measured (module docstring)."""
    held_out = {s.key for s in offgrid_shapes()}
    return [s for s in _offgrid_draws(POINTS_SEED, 1200, "points", max_flops=2e9) if s.key not in held_out]


def points2_shapes() -> List[Shape]:
    """A second draw of `points`' distribution under 1 GFLOP from another seed, none of them an `offgrid` or `points`
    shape (module docstring)."""
    taken = {s.key for s in offgrid_shapes()} | {s.key for s in points_shapes()}
    return [s for s in _offgrid_draws(POINTS2_SEED, 600, "points2", max_flops=1e9) if s.key not in taken]


def between_shapes(seed: int = BETWEEN_SEED, label: str = "between") -> List[Shape]:
    """200 shapes under 1 GFLOP from a fixed seed, for the cells' held-out checks (module docstring)."""
    import math
    import random
    rng = random.Random(seed)

    def log_uniform(lo: int, hi: int) -> float:
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))

    shapes = []
    while len(shapes) < 200:
        m = round(log_uniform(16, 16384))
        n, k = (max(64, min(16384, 8 * round(log_uniform(64, 16384) / 8))) for _ in range(2))
        if 2 * m * n * k < 1e9:
            shapes.append(Shape(m, n, k, label=label))
    return shapes


def heldout_shapes() -> List[Shape]:
    return between_shapes(HELDOUT_SEED, "heldout")


def square_shapes() -> List[Shape]:
    return [Shape(d, d, d, label="square") for d in sorted(GRID_DIMS + SQUARE_EXTRA)]


class ShapeFileError(ValueError):
    """A line of a shapes file that is not `M N K [BATCH]`; the message starts with file:line."""


def read_shape_file(path: str | Path) -> List[Shape]:
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ShapeFileError(f"{path}: cannot read shapes file: {err}") from None
    shapes: List[Shape] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].replace(",", " ").strip()
        if not line:
            continue
        fields = line.split()
        where = f"{path}:{lineno}"
        if len(fields) not in (3, 4):
            raise ShapeFileError(f"{where}: expected 'M N K' or 'M N K BATCH', got {raw.strip()!r}")
        try:
            dims = [int(f) for f in fields]
        except ValueError:
            raise ShapeFileError(f"{where}: dimensions must be whole numbers, got {raw.strip()!r}") from None
        if any(d < 1 for d in dims):
            raise ShapeFileError(f"{where}: dimensions must be positive, got {raw.strip()!r}")
        if any(d > MAX_DIM for d in dims):   # the kernels, and every reader of results, take 32-bit dimensions
            raise ShapeFileError(f"{where}: dimensions must be at most {MAX_DIM}, got {raw.strip()!r}")
        shapes.append(Shape(*dims, label=where))
    if not shapes:
        raise ShapeFileError(f"{path}: no shapes in file")
    return shapes


SETS = {"grid": grid_shapes, "llm": llm_shapes, "square": square_shapes, "offgrid": offgrid_shapes,
        "between": between_shapes, "heldout": heldout_shapes, "serve": serve_shapes, "decode": decode_shapes,
        "decode_between": decode_between_shapes, "decode_batched": decode_batched_shapes, "points": points_shapes,
        "points2": points2_shapes}


def load_shapes(name: str) -> List[Shape]:
    """A named set (SETS: grid, llm, square, offgrid, between, heldout, serve, decode, decode_between,
    decode_batched, points, points2) or, for anything else, a file of shapes. Duplicates are dropped."""
    shapes = SETS[name]() if name in SETS else read_shape_file(name)
    seen, unique = set(), []
    for s in shapes:
        if s.key not in seen:
            seen.add(s.key)
            unique.append(s)
    return unique
