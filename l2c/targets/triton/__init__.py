"""The Triton target: tensor-core (`gemm`) and CUDA-core (`gemv`) kernel families, run by Triton's JIT (or its
CPU interpreter under TRITON_INTERPRET=1)."""
from __future__ import annotations

from typing import List

from .. import Target
from . import rules as target_rules


class TritonTarget(Target):
    name = "triton"
    rules = target_rules
    suffix = ".py"
    templates = {"gemm": "triton/gemm.py.j2", "gemv": "triton/gemv.py.j2"}

    def toolchain_id(self) -> str:
        from importlib import metadata
        return f"triton {metadata.version('triton')}"

    def native_libraries(self) -> List[str]:
        """Triton's compiler library (`triton/_C/libtriton*.so`, about 500 MB), which `import triton` loads."""
        import importlib.util
        from pathlib import Path
        spec = importlib.util.find_spec("triton")
        if spec is None or not spec.submodule_search_locations:
            return []
        return sorted(str(p) for folder in spec.submodule_search_locations
                      for p in Path(folder, "_C").glob("libtriton*.so"))

    def build(self, valid):
        from .build import build_triton
        return build_triton(valid)

    def built(self, valid) -> bool:
        """Only under the interpreter, where nothing compiles: on a GPU the JIT compiles at the first launch, or
        loads its own cache's binary, and which of the two l2c cannot tell beforehand."""
        from .build import interpreting
        return interpreting()

    def prebuild(self, valid) -> str:
        """Generated, imported and, unless Triton is interpreting, compiled for the spec's arch with Triton's own
        compiler, so a kernel the GPU compiler rejects fails here."""
        from .build import build_triton, compile_ahead, interpreting
        kernel = build_triton(valid)
        if not interpreting():
            compile_ahead(kernel)
        return str(kernel.path)


TARGET = TritonTarget()
