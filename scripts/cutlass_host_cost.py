#!/usr/bin/env python
"""Where a CUTLASS kernel's per-call host time goes, inside its own translation unit (GPU).

    python scripts/cutlass_host_cost.py OUT.json [--iters 400]

The served kernel of `scripts/served_path.py` (the CUDA-graphs table's first CUTLASS fp16 entry under 256 MFLOP) is
rendered as the dispatcher renders it and compiled twice with l2c's nvcc flags, each time with a probe appended that
times, in C++ (steady_clock, `--iters` back-to-back calls, best of 5), every step of the `_run` entry point: the
whole entry, the device query, the arguments, `can_implement`, the workspace size and initialisation,
`to_underlying_arguments` (which encodes the TMA descriptors), `Gemm::run` and the template's own `launch` with
parameters made once (the launch alone), an empty kernel's launch (the floor), the driver entry-point lookup CUTLASS
makes for every descriptor it encodes, and `cuTensorMapReplaceAddress` (what replaying kept parameters would cost
per tensor). The second build resolves `cuTensorMapEncodeTiled` once per process instead of once per descriptor
(CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL with a forwarder): how much of `to_underlying_arguments` that lookup is.
"""
import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PIECES = ("run", "prepare_device", "make_arguments", "can_implement", "get_workspace_size", "initialize_workspace",
          "to_underlying_arguments", "gemm_run_kept_params", "empty_kernel_launch", "driver_entry_point_lookup",
          "tensor_map_replace_address", "cuda_get_device", "l2c_launch_kept_params")

FORWARDER = r"""
#define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL 1
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
// cuTensorMapEncodeTiled resolved once per process; CUTLASS's default wrapper asks the runtime for the driver's
// entry point on every descriptor it encodes.
extern "C" CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address, const cuuint64_t* dims,
    const cuuint64_t* strides, const cuuint32_t* box, const cuuint32_t* element_strides,
    CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion promotion,
    CUtensorMapFloatOOBfill fill) {
  static PFN_cuTensorMapEncodeTiled_v12000 const encode = [] {
    void* found = nullptr;
    cudaDriverEntryPointQueryResult query;
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &found, 12000, cudaEnableDefault,
                                                       &query);
    return (err == cudaSuccess && query == cudaDriverEntryPointSuccess)
        ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(found) : nullptr;
  }();
  if (encode == nullptr) {
    return CUDA_ERROR_NOT_FOUND;
  }
  return encode(map, type, rank, address, dims, strides, box, element_strides, interleave, swizzle, promotion, fill);
}
"""

PROBE = r"""
#include <chrono>
#include <cuda.h>
#include <cudaTypedefs.h>

__global__ void l2c_probe_empty_kernel() {}

template <class F>
static double ns_per_call(F&& f, int n, cudaStream_t stream) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    f();
    cudaStreamSynchronize(stream);
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      f();
    }
    auto stop = std::chrono::steady_clock::now();
    cudaStreamSynchronize(stream);
    double ns = std::chrono::duration<double, std::nano>(stop - start).count() / n;
    best = ns < best ? ns : best;
  }
  return best;
}

template <class T>
static void keep(T const& value) { asm volatile("" : : "r"(&value) : "memory"); }

extern "C" int l2c_probe_host_cost(void const* A, void const* B, void* D, int M, int N, int K, int64_t lda,
                                   int64_t ldb, int64_t ldd, void* workspace, size_t workspace_bytes,
                                   cudaStream_t stream, int n, double* ns) {
  int device = 0, sm_count = 0;
  if (prepare_device(&device, &sm_count) != kOk) return 1;
  auto make = [&] {
    return make_arguments(A, B, nullptr, nullptr, D, M, N, K, 1, lda, int64_t(M) * K, ldb, int64_t(K) * N,
                          ldd, int64_t(M) * N, ldd, int64_t(M) * N, device, sm_count);
  };
  typename Gemm::Arguments args = make();
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return 2;
  if (Gemm::get_workspace_size(args) > workspace_bytes) return 3;
  typename GemmKernel::Params params = GemmKernel::to_underlying_arguments(args, workspace);
  decltype(&cuTensorMapReplaceAddress) replace = nullptr;
  {
    void* found = nullptr;
    cudaDriverEntryPointQueryResult query;
    cudaGetDriverEntryPointByVersion("cuTensorMapReplaceAddress", &found, 12000, cudaEnableDefault, &query);
    replace = reinterpret_cast<decltype(&cuTensorMapReplaceAddress)>(found);
  }
  CUtensorMap map = *reinterpret_cast<CUtensorMap const*>(params.mainloop.tma_load_a.get_tma_descriptor());
  ns[0] = ns_per_call([&] { {{RUN}}(A, B, nullptr, nullptr, D, M, N, K, 1, lda, int64_t(M) * K, ldb,
                                   int64_t(K) * N, ldd, int64_t(M) * N, ldd, int64_t(M) * N, workspace,
                                   workspace_bytes, stream); }, n, stream);
  ns[1] = ns_per_call([&] { int d, s; prepare_device(&d, &s); keep(s); }, n, stream);
  ns[2] = ns_per_call([&] { auto a = make(); keep(a); }, n, stream);
  ns[3] = ns_per_call([&] { auto s = Gemm::can_implement(args); keep(s); }, n, stream);
  ns[4] = ns_per_call([&] { auto s = Gemm::get_workspace_size(args); keep(s); }, n, stream);
  ns[5] = ns_per_call([&] { auto s = GemmKernel::initialize_workspace(args, workspace, stream); keep(s); }, n, stream);
  ns[6] = ns_per_call([&] { auto p = GemmKernel::to_underlying_arguments(args, workspace); keep(p); }, n, stream);
  ns[7] = ns_per_call([&] { Gemm::run(params, stream); }, n, stream);
  ns[8] = ns_per_call([&] { l2c_probe_empty_kernel<<<1, 1, 0, stream>>>(); }, n, stream);
  ns[9] = ns_per_call([&] {
    void* found = nullptr;
    cudaDriverEntryPointQueryResult query;
    cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &found, 12000, cudaEnableDefault, &query);
    keep(found);
  }, n, stream);
  ns[10] = ns_per_call([&] { replace(&map, const_cast<void*>(A)); keep(map); }, n, stream);
  ns[11] = ns_per_call([&] { int d; cudaGetDevice(&d); keep(d); }, n, stream);
  ns[12] = ns_per_call([&] { launch(params, stream); }, n, stream);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--iters", type=int, default=400)
    a = p.parse_args()
    import torch
    from l2c.lower import render
    from l2c.tuned_table import load_table, served_spec
    from l2c.validate import validate
    from l2c.targets.cutlass import toolchain

    table = load_table(ROOT / "l2c" / "tuned" / "sm_90_graphs.json")
    e = next(x for x in table.exact.values() if x.dtype == "f16" and x.layout == "row,row,row"
             and x.target == "cutlass" and x.m * x.n * x.k <= 256 * 1024 * 1024)
    valid = validate(served_spec(e, e.m, False, "none"), "cutlass")
    source = render(valid)
    probe = PROBE.replace("{{RUN}}", f"l2c_{valid.name}_run")
    variants = {"cutlass_default": source + probe, "encode_resolved_once": FORWARDER + source + probe}
    work = Path(tempfile.mkdtemp(prefix="l2c_host_cost."))
    nvcc = toolchain.find_nvcc()

    def build(name):
        cu, so = work / f"{name}.cu", work / f"{name}.so"
        cu.write_text(variants[name])
        done = subprocess.run(toolchain.nvcc_command(nvcc, cu, so), capture_output=True, text=True)
        return name, so, done.returncode, (done.stdout + done.stderr)[-3000:]

    out = {"spec": valid.spec.to_l2(), "shape": [e.m, e.n, e.k], "iters": a.iters, "results": {}}
    with ThreadPoolExecutor(2) as pool:
        built = list(pool.map(build, variants))
    x = torch.randn(e.m, e.k, device="cuda", dtype=torch.float16)
    w = torch.randn(e.k, e.n, device="cuda", dtype=torch.float16)
    y = torch.empty(e.m, e.n, device="cuda", dtype=torch.float16)
    workspace = torch.empty(1 << 24, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    for name, so, rc, log in built:
        if rc != 0:
            out["results"][name] = {"build_failed": log}
            continue
        lib = ctypes.CDLL(str(so))
        fn = lib.l2c_probe_host_cost
        fn.restype = ctypes.c_int
        ns = (ctypes.c_double * len(PIECES))()
        status = fn(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                    e.m, e.n, e.k, ctypes.c_int64(e.k), ctypes.c_int64(e.n), ctypes.c_int64(e.n),
                    ctypes.c_void_p(workspace.data_ptr()), ctypes.c_size_t(workspace.numel()),
                    ctypes.c_void_p(stream), a.iters, ns)
        torch.cuda.synchronize()
        reference = x.float() @ w.float()
        out["results"][name] = {"status": status, "ns_per_call": {k: round(v, 1) for k, v in zip(PIECES, ns)},
                                "max_abs_error": float((y.float() - reference).abs().max())}
    print(json.dumps(out, indent=1))
    Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
