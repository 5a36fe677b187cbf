"""The CUTLASS target's toolchain: nvcc and its flags, the CUTLASS headers, and the keys built from them.

`pack_key` (source, flags, CUTLASS version) names a library in the prebuilt pack and needs no nvcc;
`library_digest` adds the version of the nvcc that built it and names the build-cache file.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import threading
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ... import settings
from ... import cache
from ...errors import BuildError

ARCH = "sm_90"   # what NVCC_FLAGS compile for; names the pack that is asked before compiling
# CUTLASS_GDC_ENABLED: CUTLASS's sm90 kernels wait (griddepcontrol.wait) before their first global memory access,
# so a launch with programmatic dependent launch is safe; the basic schedule lets the next kernel start after its
# main loop, the persistent ones when they exit. CUTLASS's own switch, CUTLASS_ENABLE_GDC_FOR_SM90, sets this one and
# also adds an early trigger to the persistent kernels, which does not compile with the stream-K tile scheduler
# (split-K and stream-K) in CUTLASS 4.2. A flag rather than a #define in the source, so that it reaches the headers
# in a batched build too.
NVCC_FLAGS: Tuple[str, ...] = (
    "-O3", "-DNDEBUG", "-std=c++17", "--expt-relaxed-constexpr", "-DCUTLASS_GDC_ENABLED",
    "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC",
)
# ptxas C7510-C7519: performance warnings such as "wgmma.mma_async instructions are serialized". A kernel
# built with one runs, but up to 40% slower than it should: for a tuner that is a broken candidate.
FORBIDDEN_PTXAS_WARNING = re.compile(r"\bC751\d\b")
# Compiler output kept in a BuildError; CUTLASS template errors run to megabytes.
MAX_MESSAGE_CHARS = 20_000

def cutlass_include_dirs() -> List[Path]:
    """CUTLASS and CUTLASS-util headers shipped inside the pinned `nvidia-cutlass` wheel (cutlass_library)."""
    try:
        import cutlass_library
    except ImportError as err:
        raise BuildError("the CUTLASS headers come from the `nvidia-cutlass` wheel: "
                         "pip install nvidia-cutlass==4.2.0.0") from err
    source = Path(cutlass_library.__file__).resolve().parent / "source"
    dirs = [source / "include", source / "tools" / "util" / "include"]
    if not (dirs[0] / "cutlass" / "cutlass.h").is_file():
        raise BuildError(f"the installed cutlass_library has no headers under {dirs[0]}; reinstall nvidia-cutlass")
    return dirs


def missing_headers() -> Optional[str]:
    """Why no CUTLASS-target kernel can be built here (None: the headers are installed). A sweep that times
    kernels outside the prebuilt pack asks first, so that it stops instead of recording every candidate as failed."""
    try:
        cutlass_include_dirs()
    except BuildError as err:
        return str(err)
    return None


def find_nvcc() -> str:
    """$L2C_NVCC if set (then the only one looked for), else nvcc from PATH, else from $CUDA_HOME/bin or
    /usr/local/cuda/bin."""
    chosen = settings.value("L2C_NVCC")
    if chosen:
        if os.path.isfile(chosen) and os.access(chosen, os.X_OK):
            return chosen
        raise BuildError(f"nvcc not found: L2C_NVCC={chosen} is not an executable file")
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(Path(root) / "bin" / "nvcc", os.X_OK):
            return str(Path(root) / "bin" / "nvcc")
    raise BuildError("nvcc not found: the CUTLASS target compiles with the CUDA toolkit's nvcc (12.3 or newer, "
                     "for sm_90a). Install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads) or "
                     "put its bin/ folder on PATH.")


_versions: Dict[str, str] = {}
_versions_lock = threading.Lock()


def nvcc_version(nvcc: str) -> str:
    """`nvcc --version` (a subprocess of 20-50 ms), asked once per process and remembered in the cache for that
    nvcc binary (its resolved path, size and modification time), so a later process's first tuned call does not
    wait for it. A caller arriving while another thread asks (l2c.dispatch asks at import) waits for that answer
    rather than starting a second nvcc."""
    with _versions_lock:
        if nvcc not in _versions:
            real = os.path.realpath(nvcc)
            stat = os.stat(real)
            records = cache.KeyedRecords("toolchain", "nvcc", {"path": real, "size": str(stat.st_size),
                                                               "mtime_ns": str(stat.st_mtime_ns)})
            known = records.entries.get("version")
            if not isinstance(known, str):
                done = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
                if done.returncode != 0:
                    raise BuildError(f"{nvcc} --version failed: {done.stderr.strip()}")
                known = done.stdout.strip()
                records.put("version", known)
            _versions[nvcc] = known
        return _versions[nvcc]


def cuda_release(version: str) -> str:
    """The CUDA release ("13.0") that `nvcc --version` output names, or "unknown"."""
    found = re.search(r"release (\d+\.\d+)", version)
    return found.group(1) if found else "unknown"


@functools.lru_cache(maxsize=1)
def cutlass_version() -> str:
    """The installed CUTLASS package's version (part of every key; read once: a metadata scan costs ~20 ms)."""
    try:
        return metadata.version("nvidia-cutlass")
    except metadata.PackageNotFoundError:
        return "unknown"


def nvcc_command(nvcc: str, source: Path, output: Path) -> List[str]:
    includes = [f"-I{d}" for d in cutlass_include_dirs()]
    return [nvcc, *NVCC_FLAGS, *includes, str(source), "-o", str(output)]


def clip(text: str) -> str:
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return text[:MAX_MESSAGE_CHARS] + f"\n... ({len(text) - MAX_MESSAGE_CHARS} more characters of compiler output)"


def forbidden_ptxas_warnings(output: str) -> List[str]:
    """The lines of compiler output that carry a C751x ptxas performance warning."""
    return [line for line in output.splitlines() if FORBIDDEN_PTXAS_WARNING.search(line)]


def pack_key(source: str) -> str:
    """The key of a library in the prebuilt pack: a hash of what determines it apart from the compiler's build
    (source, flags, CUTLASS version), so that a machine without nvcc can compute it."""
    return cache.content_hash(source, " ".join(NVCC_FLAGS), cutlass_version())


def library_digest(key: str, compiler: str) -> str:
    """The build cache's key of a library: its pack key (`pack_key`) and the version of the nvcc that built it, so
    that a pack entry's cache name is known without rendering its spec."""
    return cache.content_hash(key, compiler)[:24]
