"""The CUTLASS target: CUDA C++ instantiating CUTLASS 3.x sm90 warp-specialized GEMMs, and plain CUDA GEMV kernels
for decoding (`gemv.py`), compiled with nvcc into shared libraries (or taken from the prebuilt pack) and called
through ctypes with one set of C entry points."""
from __future__ import annotations

from typing import Dict

from .. import Target
from . import gemv
from . import rules as target_rules


class CutlassTarget(Target):
    name = "cutlass"
    rules = target_rules
    suffix = ".cu"
    templates = {"gemm": "cutlass/gemm.cu.j2", "gemv": "cutlass/gemv.cu.j2"}

    def context(self, valid) -> Dict[str, object]:
        """The GEMM CUTLASS instantiates (transposed under launch swap=yes, the partials' GEMM under parallel
        split-K) and the column blocks of its staged epilogue, or a gemv kernel's block geometry."""
        if valid.spec.launch_family == "gemv":
            return {"g": gemv.geometry(valid.spec)}
        gemm = target_rules.cutlass_gemm_spec(valid.spec)
        return {"gemm": gemm, "staged_halves": target_rules.staged_column_halves(gemm.tile_n)}

    def toolchain_id(self) -> str:
        """Flags, CUTLASS version and the local nvcc's version (none where nvcc is missing: then the prebuilt pack's
        libraries are what runs, keyed without it)."""
        from ...errors import BuildError
        from .toolchain import NVCC_FLAGS, cutlass_version, find_nvcc, nvcc_version
        try:
            compiler = nvcc_version(find_nvcc())
        except BuildError:
            compiler = "no nvcc"
        return "\n".join((" ".join(NVCC_FLAGS), f"cutlass {cutlass_version()}", compiler))

    def build(self, valid):
        from .build import build_cutlass
        return build_cutlass(valid)

    def prebuild(self, valid) -> str:
        """Compiled with nvcc (no GPU needed)."""
        from ...lower import render
        from .build import compile_source
        return str(compile_source(render(valid), valid.name))

    def built(self, valid) -> bool:
        """The library is in the build cache or the prebuilt pack (an install decompresses one library)."""
        from ...lower import render
        from .build import loads_without_compiler
        return loads_without_compiler(render(valid), valid.name)

    def prebuild_many(self, valids, workers: int, done=None):
        """Several kernels per nvcc run where there are more kernels than workers (`build.compile_many`)."""
        from .build import prebuild_many
        return prebuild_many(valids, workers, done)


TARGET = CutlassTarget()
