#!/usr/bin/env python
"""Where does an eager cuBLAS call's host time go, and how lean can a call of cuBLAS's own kernel be? (GPU)

    python scripts/host_path_probe.py OUT.json

Compiles a small probe extension (torch.utils.cpp_extension, CUDA headers and cuBLAS from NVIDIA's wheels beside
torch) and, per shape, times in a C++ loop (400 back-to-back calls, best of 7, no synchronization: host time):
at::empty alone; at::cuda::mm (torch's CUDA kernel entry, below the dispatcher); torch's handle and workspace
(at::cuda::getCurrentCUDABlasHandle) then cublasGemmEx as aten::mm calls it; and cublasLtMatmul with its
descriptors and algorithm found once per shape (heuristic with torch's cuBLAS workspace size). Also from Python:
torch.matmul and the probe's functions through their bindings. Each result is checked bitwise against torch.matmul,
and the kernels each runs are named (torch.profiler).
"""
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/mm_cuda_dispatch.h>
#include <c10/cuda/CUDAStream.h>
#include <cublasLt.h>
#include <chrono>
#include <map>
#include <tuple>

namespace {
at::Tensor out_for(at::Tensor const& a, at::Tensor const& b) { return at::empty({a.size(0), b.size(1)}, a.options()); }

at::Tensor gemmex(at::Tensor const& a, at::Tensor const& b) {
  at::Tensor c = out_for(a, b);
  cublasHandle_t h = at::cuda::getCurrentCUDABlasHandle();
  float alpha = 1.f, beta = 0.f;
  int m = b.size(1), n = a.size(0), k = a.size(1);
  auto t = a.scalar_type() == at::kHalf ? CUDA_R_16F : CUDA_R_16BF;
  TORCH_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, b.data_ptr(), t, m, a.data_ptr(), t, k, &beta,
                           c.data_ptr(), t, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP) == 0, "gemmex");
  return c;
}

struct LtPlan {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
};
cublasLtHandle_t lt_handle = nullptr;
at::Tensor workspace;
size_t workspace_bytes = 0;
std::map<std::tuple<int64_t, int64_t, int64_t, int>, LtPlan> plans;

LtPlan const& plan_for(at::Tensor const& a, at::Tensor const& b) {
  auto key = std::make_tuple(a.size(0), b.size(1), a.size(1), static_cast<int>(a.scalar_type()));
  auto found = plans.find(key);
  if (found != plans.end()) return found->second;
  if (lt_handle == nullptr) {
    TORCH_CHECK(cublasLtCreate(&lt_handle) == 0, "cublasLtCreate");
  }
  LtPlan p{};
  int64_t m = b.size(1), n = a.size(0), k = a.size(1);
  auto t = a.scalar_type() == at::kHalf ? CUDA_R_16F : CUDA_R_16BF;
  TORCH_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0, "desc");
  TORCH_CHECK(cublasLtMatrixLayoutCreate(&p.la, t, m, k, m) == 0, "la");
  TORCH_CHECK(cublasLtMatrixLayoutCreate(&p.lb, t, k, n, k) == 0, "lb");
  TORCH_CHECK(cublasLtMatrixLayoutCreate(&p.lc, t, m, n, m) == 0, "lc");
  cublasLtMatmulPreference_t pref;
  TORCH_CHECK(cublasLtMatmulPreferenceCreate(&pref) == 0, "pref");
  TORCH_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                   sizeof(workspace_bytes)) == 0, "pref ws");
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  TORCH_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_handle, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &result, &count) == 0
              && count > 0, "heuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  p.algo = result.algo;
  return plans.emplace(key, p).first->second;
}

at::Tensor lt(at::Tensor const& a, at::Tensor const& b) {
  LtPlan const& p = plan_for(a, b);
  at::Tensor c = out_for(a, b);
  float alpha = 1.f, beta = 0.f;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  TORCH_CHECK(cublasLtMatmul(lt_handle, p.desc, &alpha, b.data_ptr(), p.la, a.data_ptr(), p.lb, &beta, c.data_ptr(),
                             p.lc, c.data_ptr(), p.lc, &p.algo, workspace.data_ptr(), workspace_bytes, stream) == 0,
              "lt matmul");
  return c;
}

at::Tensor cuda_mm(at::Tensor const& a, at::Tensor const& b) { return at::cuda::mm(a, b); }
at::Tensor empty(at::Tensor const& a, at::Tensor const& b) { return out_for(a, b); }

void set_workspace(int64_t bytes) {
  workspace_bytes = bytes;
  workspace = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
}

double loop(std::string const& name, at::Tensor const& a, at::Tensor const& b, int64_t n) {
  auto f = name == "at::empty" ? empty : name == "at::cuda::mm" ? cuda_mm : name == "cublasGemmEx" ? gemmex : lt;
  f(a, b);
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) f(a, b);
  auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(end - start).count() / n;
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gemmex", &gemmex);
  m.def("lt", &lt);
  m.def("cuda_mm", &cuda_mm);
  m.def("set_workspace", &set_workspace);
  m.def("loop", &loop);
}
"""


def main(out_path):
    site = Path(torch.__file__).resolve().parents[1]
    includes = [str(p) for p in sorted(site.glob("nvidia/*/include"))]
    libs = [str(p) for p in sorted(site.glob("nvidia/*/lib"))]
    t0 = time.time()
    probe = load_inline("l2c_host_path_probe", cpp_sources=[SOURCE], extra_include_paths=includes, with_cuda=True,
                        extra_ldflags=[*[f"-L{p}" for p in libs], *[f"-Wl,-rpath,{p}" for p in libs], "-lcublasLt",
                                       "-lcublas"], verbose=False)
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "build_s": round(time.time() - t0, 1)}
    probe.set_workspace(32 * 1024 * 1024)
    shapes = [(4, 264, 88), (64, 64, 1024), (128, 1000, 360), (16, 4096, 4096), (1, 4096, 4096), (333, 4096, 11008)]
    names = ["at::empty", "at::cuda::mm", "cublasGemmEx", "cublasLtMatmul"]
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for m, n, k in shapes:
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            ref = torch.matmul(a, b)
            row = {"shape": [m, n, k], "dtype": str(dtype),
                   "equal": {"gemmex": torch.equal(probe.gemmex(a, b), ref), "lt": torch.equal(probe.lt(a, b), ref),
                             "cuda_mm": torch.equal(probe.cuda_mm(a, b), ref)}}
            best = {name: min(probe.loop(name, a, b, 400) for _ in range(7)) for name in names}
            row["cxx_loop_us"] = {k2: round(v, 2) for k2, v in best.items()}
            py = {"torch.matmul": lambda: torch.matmul(a, b), "probe.cuda_mm": lambda: probe.cuda_mm(a, b),
                  "probe.gemmex": lambda: probe.gemmex(a, b), "probe.lt": lambda: probe.lt(a, b)}
            timing = {name: float("inf") for name in py}
            for _ in range(7):
                for name, fn in py.items():
                    torch.cuda.synchronize()
                    s = time.perf_counter()
                    for _ in range(400):
                        fn()
                    timing[name] = min(timing[name], (time.perf_counter() - s) / 400)
            torch.cuda.synchronize()
            row["python_us"] = {name: round(v * 1e6, 2) for name, v in timing.items()}
            kernels = {}
            for name, fn in (("torch.matmul", py["torch.matmul"]), ("lt", py["probe.lt"]),
                             ("gemmex", py["probe.gemmex"])):
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    fn()
                    torch.cuda.synchronize()
                kernels[name] = sorted(e.name for e in prof.events()
                                       if e.device_type == torch.autograd.DeviceType.CUDA)
            row["kernels"] = kernels
            row["same_kernels_lt"] = kernels["lt"] == kernels["torch.matmul"]
            print(json.dumps(row), flush=True)
            rows.append(row)
    out["rows"] = rows
    Path(out_path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
