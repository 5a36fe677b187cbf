"""The CUTLASS target's builder: compile the rendered .cu with nvcc into a cached .so and load it (`kernel.py`).

Compiling needs only a CPU and nvcc (CI builds kernels without a GPU); calling a loaded kernel needs the GPU.
Builds are keyed by a content hash of (source, flags, nvcc version, CUTLASS version) in the user cache
directory, guarded by a file lock and published by atomic rename, so concurrent builders of the same kernel
compile it once and nobody loads a half-written .so. On a cache miss the prebuilt pack shipped with l2c
(`pack.py`) is asked first: a library built there from the same source, flags and CUTLASS version, by the local
nvcc's version (or by any nvcc when there is none here), is checked against its sha256 and installed into the
cache instead of compiling, so a machine without the CUDA toolkit still gets every kernel the pack holds.
A compiler failure, or any ptxas C751x warning (the wgmma pipeline got serialized), is a `BuildError` carrying
the compiler's message.
"""
from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional, Sequence, Union

from ... import cache
from ...errors import BuildError
from ...lower import render
from ...rules import ValidSpec
from . import pack
from .kernel import CutlassKernel, load_cutlass
from .toolchain import (ARCH, clip, find_nvcc, forbidden_ptxas_warnings, library_digest, nvcc_command, nvcc_version,
                        pack_key)

log = logging.getLogger("l2c.cutlass")


def compile_source(source: str, name: str) -> Path:
    """Compile CUDA source into a cached shared library and return its path; BuildError on failure.

    A cache miss installs the library from the prebuilt pack when the pack holds it for this source and the
    local nvcc's version (whichever version it was built with when there is no nvcc here); nvcc runs only for a
    real build. Failures that the compiler reports (errors, C751x warnings) are cached beside the .so, so a
    broken candidate costs its compile time once, not once per tuning run.
    """
    try:
        nvcc, no_nvcc = find_nvcc(), ""
    except BuildError as err:
        nvcc, no_nvcc = None, str(err)
    key = pack_key(source)
    prebuilt = None
    if nvcc is None:   # the pack entry's nvcc names the cache file that nvcc would have built
        prebuilt = pack.lookup(ARCH, key, name)
        if prebuilt is None:
            raise BuildError(f"{no_nvcc} ({name} is not in l2c's prebuilt pack)")
        compiler = prebuilt.nvcc_version
    else:
        compiler = nvcc_version(nvcc)
    digest = library_digest(source, compiler)
    folder = cache.cache_dir("cutlass")
    library = folder / f"{name}_{digest}.so"
    failure = folder / f"{name}_{digest}.failed.txt"
    with cache.locked(library):
        if library.exists():
            return library
        if nvcc is not None:   # asked only on a miss: reading the pack costs a decompression
            prebuilt = pack.lookup(ARCH, key, name)
        if prebuilt is not None and prebuilt.nvcc_version == compiler:
            try:
                cache.write_atomic(library, pack.read_library(prebuilt))
                return library
            except pack.PackError as err:
                if nvcc is None:
                    raise BuildError(f"{name}: the prebuilt pack's library cannot be used ({err}) and {no_nvcc}")
                log.warning("%s; building %s with nvcc instead", err, name)
        if failure.exists():
            raise BuildError(failure.read_text())
        with tempfile.TemporaryDirectory(dir=folder, prefix=f".{name}_{digest}.") as work:
            work = Path(work)
            cu, so = work / f"{name}.cu", work / f"{name}.so"
            cu.write_text(source)
            command = nvcc_command(nvcc, cu, so)
            done = subprocess.run(command, capture_output=True, text=True, cwd=work)
            output = (done.stdout + done.stderr).strip()
            if done.returncode != 0:
                message = clip(f"nvcc failed (exit {done.returncode}) building {name}:\n"
                                f"{' '.join(command)}\n{output}")
                if done.returncode > 0:   # the compiler's verdict, not a signal (e.g. out of memory)
                    cache.write_atomic(failure, message)
                raise BuildError(message)
            bad = forbidden_ptxas_warnings(output)
            if bad:
                message = clip(f"ptxas reported a C751x performance warning building {name} (treated as a "
                                f"failure: the wgmma pipeline would be serialized):\n" + "\n".join(bad))
                cache.write_atomic(failure, message)
                raise BuildError(message)
            os.replace(so, library)   # same filesystem: an atomic publish
    return library


# ---- build --------------------------------------------------------------------------------------------

def build_cutlass(valid: ValidSpec) -> CutlassKernel:
    """Compile (cached) and load one spec; raise BuildError on any failure."""
    if valid.target != "cutlass":
        raise BuildError(f"{valid.name} was validated for {valid.target}, not cutlass")
    source = render(valid)
    return load_cutlass(valid, compile_source(source, valid.name), source)


def _compile_in_worker(source: str, name: str) -> Union[str, BuildError]:
    try:
        return str(compile_source(source, name))
    except BuildError as err:
        return err
    except Exception as err:  # noqa: BLE001 - a worker never raises: its failure is the candidate's
        return BuildError(f"building {name} failed: {type(err).__name__}: {err}")


def build_many(valids: Sequence[ValidSpec], workers: Optional[int] = None) -> List[Union[CutlassKernel, BuildError]]:
    """Compile many specs in parallel and load them; one result per spec, in order, never raising.

    The parallel work is the nvcc processes: a pool of `workers` threads each drives one nvcc at a time.
    Threads rather than Python worker processes because the workers only wait on nvcc, and so that
    build_many works from any script (spawned workers re-import `__main__`, which breaks scripts without an
    `if __name__ == "__main__"` guard) and from a parent that has initialized CUDA (no fork). Concurrent
    builds of one kernel, here or in other processes, are serialized by the cache's file lock.
    """
    workers = max(1, workers or os.cpu_count() or 1)
    results: List[Union[CutlassKernel, BuildError, None]] = [None] * len(valids)
    jobs = []
    for i, valid in enumerate(valids):
        try:
            if valid.target != "cutlass":
                raise BuildError(f"{valid.name} was validated for {valid.target}, not cutlass")
            jobs.append((i, render(valid)))
        except Exception as err:  # noqa: BLE001
            results[i] = err if isinstance(err, BuildError) else BuildError(f"rendering {valid.name}: {err}")
    if jobs:
        with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="l2c-nvcc") as pool:
            futures = [(i, source, pool.submit(_compile_in_worker, source, valids[i].name)) for i, source in jobs]
            for i, source, future in futures:
                outcome = future.result()   # _compile_in_worker never raises
                if isinstance(outcome, BuildError):
                    results[i] = outcome
                else:
                    try:
                        results[i] = load_cutlass(valids[i], outcome, source)
                    except BuildError as err:
                        results[i] = err
    return results  # type: ignore[return-value]
