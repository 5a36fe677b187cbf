#!/usr/bin/env python
"""How many thread-block clusters of each size the GPU runs at once (cudaOccupancyMaxActiveClusters), one block per
SM (a block with the shared memory of an l2c GEMM), and how many blocks that is: what a clustered kernel's waves
are counted in (l2c.arch's `max_active_clusters`).

    python scripts/cluster_occupancy.py --out cluster_occupancy.json     # on the GPU machine; needs nvcc
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#include <cstdio>
#include <cuda_runtime.h>
__global__ void probe(int *x) { extern __shared__ int s[]; if (x) x[0] = s[0]; }
int main() {
  int device = 0; cudaDeviceProp prop; cudaGetDeviceProperties(&prop, device);
  printf("{\"gpu\": \"%s\", \"sm_count\": %d, \"clusters\": [", prop.name, prop.multiProcessorCount);
  cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  const int smem[] = {200 * 1024, 100 * 1024, 48 * 1024};
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  bool first = true;
  for (int s = 0; s < 3; ++s) {
    for (int size = 1; size <= 16; size *= 2) {
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(size * 64, 1, 1); config.blockDim = dim3(384, 1, 1);
      config.dynamicSmemBytes = smem[s];
      cudaLaunchAttribute attribute; attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = size; attribute.val.clusterDim.y = 1; attribute.val.clusterDim.z = 1;
      config.attrs = &attribute; config.numAttrs = 1;
      int clusters = -1;
      cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, (void *)probe, &config);
      printf("%s{\"size\": %d, \"smem_bytes\": %d, \"max_active_clusters\": %d, \"error\": \"%s\"}",
             first ? "" : ", ", size, smem[s], err == cudaSuccess ? clusters : -1, cudaGetErrorString(err));
      first = false;
    }
  }
  printf("]}\n");
  return 0;
}
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "probe.cu", Path(tmp) / "probe"
        src.write_text(SOURCE)
        subprocess.run(["nvcc", "-O2", "-gencode=arch=compute_90a,code=sm_90a", "-o", str(exe), str(src)], check=True)
        result = json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for c in result["clusters"]:
        print(f"cluster {c['size']:>2}, {c['smem_bytes'] // 1024:>3} KiB: {c['max_active_clusters']} clusters "
              f"({c['max_active_clusters'] * c['size']} blocks) {c['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
