"""Register report of gemv kernels compiled by Triton's sm_90 compiler on the CPU (no GPU, no interpreter).

`python -m tests.gemv_registers "1,32,256,4;4,16,256,4"` prints, per (tile m, tile n, tile k, warps) of an fp16
nn.Linear-layout spec: registers per thread, spilled bytes (stack + local) and the count of 16-byte global loads.
The kernel is specialized as a call on the GPU would specialize it (Triton turns an integer argument equal to 1
into a constant and marks pointers and 16-divisible integers as such), unlike l2c.targets.triton.build.compile_ahead,
which compiles the unspecialized variant to check that a kernel compiles at all.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from l2c.build import build
from l2c.ir import KernelSpec
from l2c.validate import validate

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32"}


def compile_specialized(jit, args, meta):
    """Triton's compiled kernel for these launch arguments, specialized as the JIT would on a GPU."""
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, x) in enumerate(zip(jit.arg_names, args)):
        if isinstance(x, torch.Tensor):
            signature[name] = "*" + _DTYPES[x.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif x == 1:
            signature[name], constexprs[name] = "constexpr", 1
        else:
            signature[name] = "i32"
            if x % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    for name in jit.arg_names[len(args):]:
        signature[name], constexprs[name] = "constexpr", meta[name]
    options = {k: meta[k] for k in ("num_warps", "num_stages") if k in meta}
    return triton.compile(ASTSource(jit, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                          options=options)


def report(tile_m: int, tile_n: int, tile_k: int, warps: int):
    """(name, registers, spilled bytes, 16-byte global loads) of the main gemv kernel of this configuration."""
    spec = KernelSpec(name=f"gemv_{tile_m}x{tile_n}x{tile_k}_w{warps}", target="triton", launch_family="gemv",
                      tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, launch_warps=warps, layout_b="col",
                      launch_evict="first")
    kernel = build(validate(spec, "triton"))
    a = torch.randn(4, 512).half()
    b = torch.randn(256, 512).half().T   # nn.Linear's weight: B column-major
    _, _, launches = kernel.module.prepare(a, b)
    jit, _, args, meta = launches[0]
    compiled = compile_specialized(jit, args, meta)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    spilled = int(re.search(r"STACK:(\d+)", usage).group(1)) + int(re.search(r"LOCAL:(\d+)", usage).group(1))
    wide = len(re.findall(r"ld\.global\S*\.v4\.b32", compiled.asm["ptx"]))
    return spec.name, regs, spilled, wide


def main(argv) -> int:
    print("kernel registers spilled_bytes 16B_loads")
    for config in argv[0].split(";"):
        print(*report(*map(int, config.split(","))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
