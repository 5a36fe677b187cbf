"""The CUTLASS target's builder: compile rendered .cu sources with nvcc into cached .so files and load them
(`kernel.py`).

Compiling needs only a CPU and nvcc (CI builds kernels without a GPU); calling a loaded kernel needs the GPU.
Builds are keyed by a content hash of (source, flags, nvcc version, CUTLASS version) in the user cache
directory, guarded by a file lock and published by atomic rename, so concurrent builders of the same kernel
compile it once and nobody loads a half-written .so. On a cache miss the prebuilt pack shipped with l2c
(`pack.py`) is asked first: a library built there from the same source, flags and CUTLASS version, by the local
nvcc's version (or by any nvcc when there is none here), is checked against its sha256 and installed into the
cache instead of compiling, so a machine without the CUDA toolkit still gets every kernel the pack holds.
A compiler failure, or any ptxas C751x warning (the wgmma pipeline got serialized), is a `BuildError` carrying
the compiler's message.

Several kernels are compiled in one nvcc run when there are more kernels than workers (`compile_many`): a
build's time is the C++ front ends parsing the CUTLASS headers and instantiating their templates (nvcc's
device pass, cicc, about 60% of it; ptxas well under 1%), and in one translation unit the headers are parsed
once and the templates the kernels share are instantiated once. The batch's translation unit includes each
kernel's rendered source unchanged inside a namespace of its own (`batch_source`); the library it gives is
published under every member's cache name and holds every member's `l2c_<name>_*` entry points. The device code
of each kernel is the same as when it is built alone.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from ... import cache
from ...errors import BuildError
from ...lower import render
from ...rules import ValidSpec
from . import pack
from .kernel import CutlassKernel, load_cutlass
from .toolchain import (ARCH, clip, find_nvcc, forbidden_ptxas_warnings, library_digest, nvcc_command, nvcc_version,
                        pack_key)

log = logging.getLogger("l2c.cutlass")

# Kernels compiled in one nvcc run at most. Measured on sm_90a builds (benchmarks/NOTES.md): one kernel alone costs
# 34-47 s of one core, of which about 14 s is the headers; in a run of 8 similar kernels 9-10 s each, of 16
# dissimilar ones 12 s each. Memory grows with the run (cicc's peak), so larger runs gain little.
BATCH_SIZE = 8
# Peak memory of one nvcc run: 3.5 GiB for one kernel alone, 5-9 GiB for 8, 11.7 GiB for 16 dissimilar kernels.
_RUN_MEMORY = (3.5 * 2**30, 0.8 * 2**30)   # (first kernel, each further kernel), from above

Outcome = Union[Path, BuildError]


@dataclass(frozen=True)
class _Job:
    """One kernel to build: its source and where the build cache keeps its library (or its failure)."""
    source: str
    name: str
    key: str                               # pack key
    compiler: str                          # `nvcc --version` of the nvcc whose build the cache name stands for
    library: Path
    failure: Path
    prebuilt: Optional[pack.PackEntry]     # the pack's entry when there is no nvcc here


def _job(source: str, name: str, nvcc: Optional[str], no_nvcc: str) -> _Job:
    key = pack_key(source)
    prebuilt = None
    if nvcc is None:   # the pack entry's nvcc names the cache file that nvcc would have built
        prebuilt = pack.lookup(ARCH, key, name)
        if prebuilt is None:
            raise BuildError(f"{no_nvcc} ({name} is not in l2c's prebuilt pack)")
        compiler = prebuilt.nvcc_version
    else:
        compiler = nvcc_version(nvcc)
    return _job_of(source, name, key, compiler, prebuilt)


def _job_of(source: str, name: str, key: str, compiler: str, prebuilt: Optional[pack.PackEntry]) -> _Job:
    digest = library_digest(key, compiler)
    folder = cache.cache_dir("cutlass")
    library = folder / f"{name}_{digest}.so"
    if library.parent != folder:   # a name is a spec's (grammar NAME): never a path out of the cache
        raise BuildError(f"kernel name {name[:80]!r} is not a file name in the build cache")
    return _Job(source, name, key, compiler, library, folder / f"{name}_{digest}.failed.txt", prebuilt)


def _pack_entry(job: _Job, nvcc: Optional[str]) -> Optional[pack.PackEntry]:
    """The pack's entry for the job's library, if it was built by the job's compiler. Asked only on a cache miss:
    with nvcc the pack's manifest is read then, without nvcc it was read with the job."""
    entry = job.prebuilt if nvcc is None else pack.lookup(ARCH, job.key, job.name)
    return entry if entry is not None and entry.nvcc_version == job.compiler else None


def _settled(job: _Job, nvcc: Optional[str], no_nvcc: str) -> Optional[Outcome]:
    """With the job's lock held: its library if the cache has it or the pack installs it, its cached failure, or
    None when nvcc has to build it."""
    if cache.intact_library(job.library):
        return job.library
    try:
        job.library.unlink()   # a damaged library (truncated) or one this user cannot read: replaced, never loaded
    except FileNotFoundError:
        pass
    except OSError as err:   # a shared cache's file this user may not replace: the kernel fails, calls go to torch
        return BuildError(f"{job.name}: the cached library {job.library} cannot be loaded (damaged or unreadable) "
                          f"nor replaced ({err.strerror or err})")
    prebuilt = _pack_entry(job, nvcc)
    if prebuilt is not None:
        try:
            cache.write_atomic(job.library, pack.read_library(prebuilt))
            return job.library
        except pack.PackError as err:
            if nvcc is None:
                return BuildError(f"{job.name}: the prebuilt pack's library cannot be used ({err}) and {no_nvcc}")
            log.warning("%s; building %s with nvcc instead", err, job.name)
    if job.failure.exists():
        return BuildError(job.failure.read_text())
    return None


def _install_from_pack(jobs: Sequence[_Job], nvcc: Optional[str]) -> int:
    """Install the library of every job the pack holds (for its compiler) in one pass through the pack, ahead of
    the jobs' own turns, which then find it in the cache; kernels that share a library get hard links to one copy
    (copies where links are refused). What this pass cannot install is left to them. How many it installed."""
    wanted: Dict[str, Dict[str, Tuple[pack.PackEntry, _Job]]] = {}
    for job in jobs:
        entry = _pack_entry(job, nvcc)
        if entry is not None:
            wanted.setdefault(entry.pack, {})[entry.key] = (entry, job)
    installed = 0
    for path, members in wanted.items():
        first: Dict[str, Path] = {}   # library sha256 -> the cache file holding it
        for entry, data in pack.read_libraries(path, [e for e, _ in members.values()]):
            job = members[entry.key][1]
            with cache.locked(job.library):
                if cache.intact_library(job.library):
                    continue
                if entry.sha256 in first:
                    _place(first[entry.sha256], job.library,
                           job.library.with_name(f".{job.library.name}.{os.getpid()}.link"))
                else:
                    cache.write_atomic(job.library, data)
                    first[entry.sha256] = job.library
                installed += 1
    return installed


def _place(existing: Path, path: Path, temporary: Path) -> None:
    """Put the file `existing` at `path` as a hard link (a copy where links are refused) made at `temporary`, then
    renamed into place: readers see all or nothing."""
    try:
        try:
            os.link(existing, temporary)
        except OSError:
            shutil.copyfile(existing, temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def install_pack() -> int:
    """Install every library of the pack this machine would use (those built by the local nvcc's version; any,
    without nvcc) into the build cache, so that no first call of a packed kernel decompresses anything: how many
    were installed. A few tenths of a second and 35 MB for the shipped pack, once per machine; nothing when all
    are there."""
    try:
        nvcc = find_nvcc()
    except BuildError:
        nvcc = None
    path = pack.default_pack_path(ARCH)
    if not path.exists():
        return 0
    try:
        held = pack.read_pack(path)
    except pack.PackError:
        return 0
    if held.arch != ARCH:
        return 0
    compiler = nvcc_version(nvcc) if nvcc is not None else None
    jobs = []
    for entry in held.entries.values():
        if compiler is not None and entry.nvcc_version != compiler:
            continue
        job = _job_of("", entry.name, entry.key, compiler or entry.nvcc_version, entry)
        if not cache.intact_library(job.library):
            jobs.append(job)
    return _install_from_pack(jobs, nvcc) if jobs else 0


def _run_nvcc(nvcc: str, cu: Path, so: Path) -> Tuple[List[str], int, str]:
    command = nvcc_command(nvcc, cu, so)
    done = subprocess.run(command, capture_output=True, text=True, cwd=cu.parent)
    return command, done.returncode, (done.stdout + done.stderr).strip()


def _compile_alone(job: _Job, nvcc: str) -> Outcome:
    """nvcc on the kernel's own source. A failure the compiler reports (an error, a C751x warning) is cached beside
    the library, so a broken candidate costs its compile time once, not once per tuning run."""
    folder = job.library.parent
    with tempfile.TemporaryDirectory(dir=folder, prefix=f".{job.library.stem}.") as work:
        cu, so = Path(work) / f"{job.name}.cu", Path(work) / f"{job.name}.so"
        cu.write_text(job.source)
        command, returncode, output = _run_nvcc(nvcc, cu, so)
        if returncode != 0:
            message = clip(f"nvcc failed (exit {returncode}) building {job.name}:\n{' '.join(command)}\n{output}")
            if returncode > 0 and not _not_the_source(output):   # the compiler's verdict on the source
                cache.write_atomic(job.failure, message)
            return BuildError(message)
        bad = forbidden_ptxas_warnings(output)
        if bad:
            message = clip(f"ptxas reported a C751x performance warning building {job.name} (treated as a "
                           f"failure: the wgmma pipeline would be serialized):\n" + "\n".join(bad))
            cache.write_atomic(job.failure, message)
            return BuildError(message)
        os.replace(so, job.library)   # same filesystem: an atomic publish
    return job.library


# What a compiler run says when it failed for a reason other than its source, which a later run may not meet: the
# machine (a signal, a full disk, no memory: nvcc exits 255 when the out-of-memory killer takes its front end) or
# the toolchain's setup (nvcc's own fatal errors, such as no host compiler on PATH; a header or program not found).
# Such a failure is not cached, so the kernel builds once the environment is fixed.
_NOT_THE_SOURCE = re.compile(r"died due to signal|No space left on device|Cannot allocate memory|std::bad_alloc|"
                             r"nvcc fatal|No such file or directory|command not found|Permission denied")


def _not_the_source(output: str) -> bool:
    return bool(_NOT_THE_SOURCE.search(output))


_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"][^>\"]+[>\"]", re.MULTILINE)


def batch_source(members: Sequence[Tuple[str, str, str]]) -> str:
    """The translation unit that compiles several kernels at once, from `(name, file name, source)` per member
    (each file beside this one): every header the members include, once, then each member's file included inside
    namespace `l2c_<name>`. The members' own includes then find their headers already included; their entry
    points are `extern "C"` and keep their names."""
    includes: Dict[str, None] = {}
    for _name, _file, source in members:
        includes.update((line.strip(), None) for line in _INCLUDE.findall(source))
    parts = [f"// {len(members)} l2c CUTLASS kernels in one translation unit, so that the CUTLASS headers are "
             "parsed once\n// and the templates the kernels share are instantiated once. Each kernel's "
             "generated source is\n// included unchanged, in a namespace of its own.", "\n".join(includes)]
    parts += [f'namespace l2c_{name} {{\n#include "{file}"\n}}  // namespace l2c_{name}' for name, file, _ in members]
    return "\n\n".join(parts) + "\n"


def _compile_together(jobs: Sequence[_Job], nvcc: str) -> bool:
    """One nvcc run for all the jobs; on success the library is published under every job's cache name. False,
    with nothing cached, if the run fails in any way: the caller then finds out which kernel is at fault."""
    folder = jobs[0].library.parent
    with tempfile.TemporaryDirectory(dir=folder, prefix=".batch.") as work:
        work = Path(work)
        for job in jobs:
            (work / f"{job.name}.cu").write_text(job.source)
        cu, so = work / "batch.cu", work / "batch.so"
        cu.write_text(batch_source([(job.name, f"{job.name}.cu", job.source) for job in jobs]))
        command, returncode, output = _run_nvcc(nvcc, cu, so)
        if returncode != 0 or forbidden_ptxas_warnings(output):
            log.info("building %d CUTLASS kernels in one nvcc run failed (exit %d); building them in smaller "
                     "batches to find which", len(jobs), returncode)
            return False
        for job in jobs:
            _place(so, job.library, work / f"{job.name}.so")
    return True


def _compile(jobs: Sequence[_Job], nvcc: str) -> List[Tuple[Outcome, int]]:
    """Build the jobs, together while that works: (outcome, kernels in the nvcc run that built it) per job. A failed
    batch is split in halves, down to single kernels, whose verdicts (and cached failures) are those of building
    each alone."""
    if len(jobs) == 1:
        return [(_compile_alone(jobs[0], nvcc), 1)]
    if _compile_together(jobs, nvcc):
        return [(job.library, len(jobs)) for job in jobs]
    half = len(jobs) // 2
    return _compile(jobs[:half], nvcc) + _compile(jobs[half:], nvcc)


def plan_batches(names: Sequence[str], workers: int, most: int = BATCH_SIZE) -> List[List[int]]:
    """Indices of `names` grouped into nvcc runs: at least `workers` runs where there are that many kernels (so no
    worker idles), runs of at most `most` kernels, each name at most once per run (its entry points would clash).
    Kernels are grouped in name order, which puts equal tile shapes together: they share the most templates."""
    order = sorted(range(len(names)), key=lambda i: names[i])
    layers: List[List[int]] = []   # the first kernel of each name, the second of each name, ...
    seen: Dict[str, int] = {}
    for i in order:
        n = seen[names[i]] = seen.get(names[i], -1) + 1
        if n == len(layers):
            layers.append([])
        layers[n].append(i)
    total = len(names)
    runs = max(min(workers, total), math.ceil(total / most)) if total else 0
    batches = []
    for layer in layers:
        count = max(math.ceil(len(layer) / most), math.ceil(runs * len(layer) / total))   # <= len(layer)
        size, extra = divmod(len(layer), count)
        start = 0
        for b in range(count):
            end = start + size + (b < extra)
            batches.append(layer[start:end])
            start = end
    return batches


def _memory_bound(workers: int, largest: int) -> int:
    """`workers`, or fewer where the memory available now would not hold that many nvcc runs of `largest` kernels."""
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return workers
    need = _RUN_MEMORY[0] + _RUN_MEMORY[1] * (largest - 1)
    return max(1, min(workers, int(available // need)))


def compile_many(sources: Sequence[Tuple[str, str]], workers: Optional[int] = None,
                 done: Optional[Callable[[int, Outcome, int], None]] = None) -> List[Outcome]:
    """Compile `(source, name)` pairs into cached shared libraries: one outcome (the library's path or a
    BuildError) per pair, in order, never raising.

    Cache hits and pack installs cost nothing (the pack is read once for all of them); the kernels nvcc has to
    build are grouped into runs of several
    kernels (`plan_batches`) that `workers` threads drive, one nvcc each (fewer where memory is short). A run
    that fails is split until each failing kernel is found and has its own verdict: what building it alone gives.
    `done(index, outcome, kernels)` is called, from the worker threads, as each outcome is known; `kernels` is
    how many kernels the nvcc run that built it compiled (0: nothing was compiled)."""
    workers = max(1, workers or os.cpu_count() or 1)
    outcomes: List[Optional[Outcome]] = [None] * len(sources)
    report = done or (lambda index, outcome, kernels: None)
    try:
        nvcc, no_nvcc = find_nvcc(), ""
    except BuildError as err:
        nvcc, no_nvcc = None, str(err)
    first: Dict[Tuple[str, str], int] = {}   # a pair asked for twice is built once
    todo: List[int] = []
    jobs: Dict[int, _Job] = {}
    for i, (source, name) in enumerate(sources):
        if (source, name) in first:
            continue
        first[(source, name)] = i
        try:
            jobs[i] = _job(source, name, nvcc, no_nvcc)
        except BuildError as err:
            outcomes[i] = err
            report(i, err, 0)
            continue
        if cache.intact_library(jobs[i].library):
            outcomes[i] = jobs[i].library
            report(i, jobs[i].library, 0)
        else:
            todo.append(i)

    if len(todo) > 1:
        _install_from_pack([jobs[i] for i in todo], nvcc)

    def settle(i: int, outcome: Outcome, kernels: int) -> None:
        outcomes[i] = outcome
        report(i, outcome, kernels)

    def run(batch: List[int]) -> None:
        try:
            with ExitStack() as locks:
                for i in sorted(batch, key=lambda i: str(jobs[i].library)):   # one order everywhere: no deadlock
                    locks.enter_context(cache.locked(jobs[i].library))
                left = []
                for i in batch:
                    outcome = _settled(jobs[i], nvcc, no_nvcc)
                    if outcome is None:
                        left.append(i)
                    else:
                        settle(i, outcome, 0)
                if left and nvcc is None:
                    for i in left:
                        settle(i, BuildError(no_nvcc), 0)
                elif left:
                    for i, (outcome, kernels) in zip(left, _compile([jobs[i] for i in left], nvcc)):
                        settle(i, outcome, kernels)
        except Exception as err:  # noqa: BLE001 - a worker never raises: its failure is the candidates'
            for i in batch:
                if outcomes[i] is None:
                    settle(i, BuildError(f"building {jobs[i].name} failed: {type(err).__name__}: {err}"), 0)

    batches = [[todo[j] for j in b] for b in plan_batches([jobs[i].name for i in todo], workers)]
    if nvcc is None:   # nothing to compile: the pack serves every kernel, one at a time
        batches = [[i] for i in todo]
    threads = _memory_bound(min(workers, len(batches)), max(map(len, batches), default=1)) if batches else 1
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="l2c-nvcc") as pool:
        for future in [pool.submit(run, batch) for batch in batches]:
            future.result()
    for i, (source, name) in enumerate(sources):
        if outcomes[i] is None:
            settle(i, outcomes[first[(source, name)]], 0)
    return outcomes  # type: ignore[return-value]


def compile_source(source: str, name: str) -> Path:
    """Compile CUDA source into a cached shared library and return its path; BuildError on failure.

    A cache miss installs the library from the prebuilt pack when the pack holds it for this source and the
    local nvcc's version (whichever version it was built with when there is no nvcc here); nvcc runs only for a
    real build. Failures that the compiler reports (errors, C751x warnings) are cached beside the .so, so a
    broken candidate costs its compile time once, not once per tuning run.
    """
    outcome = compile_many([(source, name)], workers=1)[0]
    if isinstance(outcome, BuildError):
        raise outcome
    return outcome


def loads_without_compiler(source: str, name: str) -> bool:
    """Whether the library of this source is in the build cache or the pack installs it (one library inflated:
    about 10 ms): loading it then runs no compiler."""
    try:
        nvcc, no_nvcc = find_nvcc(), ""
    except BuildError as err:
        nvcc, no_nvcc = None, str(err)
    try:
        job = _job(source, name, nvcc, no_nvcc)
    except BuildError:
        return False
    return cache.intact_library(job.library) or _pack_entry(job, nvcc) is not None


# ---- build --------------------------------------------------------------------------------------------

def build_cutlass(valid: ValidSpec) -> CutlassKernel:
    """Compile (cached) and load one spec; raise BuildError on any failure."""
    if valid.target != "cutlass":
        raise BuildError(f"{valid.name} was validated for {valid.target}, not cutlass")
    source = render(valid)
    return load_cutlass(valid, compile_source(source, valid.name), source)


def _rendered(valids: Sequence[ValidSpec]) -> Tuple[List[Tuple[int, str]], Dict[int, BuildError]]:
    """(index, source) of each spec that renders for CUTLASS, and the failure of each that does not."""
    sources, failed = [], {}
    for i, valid in enumerate(valids):
        try:
            if valid.target != "cutlass":
                raise BuildError(f"{valid.name} was validated for {valid.target}, not cutlass")
            sources.append((i, render(valid)))
        except Exception as err:  # noqa: BLE001
            failed[i] = err if isinstance(err, BuildError) else BuildError(f"rendering {valid.name}: {err}")
    return sources, failed


def prebuild_many(valids: Sequence[ValidSpec], workers: Optional[int] = None,
                  done: Optional[Callable[[int, Union[str, BuildError], int], None]] = None
                  ) -> List[Union[str, BuildError]]:
    """Fill the build cache for many specs (`compile_many`): the cached library's path or a BuildError per spec,
    in order, never raising; `done(index, outcome, kernels)` as each is known."""
    sources, failed = _rendered(valids)
    results: List[Union[str, BuildError, None]] = [None] * len(valids)
    for i, err in failed.items():
        results[i] = err
        if done:
            done(i, err, 0)

    def report(j: int, outcome: Outcome, kernels: int) -> None:
        i = sources[j][0]
        results[i] = outcome if isinstance(outcome, BuildError) else str(outcome)
        if done:
            done(i, results[i], kernels)

    compile_many([(source, valids[i].name) for i, source in sources], workers, report)
    return results  # type: ignore[return-value]


def build_many(valids: Sequence[ValidSpec], workers: Optional[int] = None) -> List[Union[CutlassKernel, BuildError]]:
    """Compile many specs and load them; one result per spec, in order, never raising.

    The parallel work is the nvcc processes (`compile_many`): `workers` threads each drive one nvcc at a time,
    several kernels per run where there are more kernels than workers. Threads rather than Python worker
    processes because the workers only wait on nvcc, and so that build_many works from any script (spawned
    workers re-import `__main__`, which breaks scripts without an `if __name__ == "__main__"` guard) and from a
    parent that has initialized CUDA (no fork). Concurrent builds of one kernel, here or in other processes, are
    serialized by the cache's file lock.
    """
    sources, failed = _rendered(valids)
    results: List[Union[CutlassKernel, BuildError, None]] = [None] * len(valids)
    for i, err in failed.items():
        results[i] = err
    outcomes = compile_many([(source, valids[i].name) for i, source in sources], workers)
    for (i, source), outcome in zip(sources, outcomes):
        if isinstance(outcome, BuildError):
            results[i] = outcome
            continue
        try:
            results[i] = load_cutlass(valids[i], outcome, source)
        except BuildError as err:
            results[i] = err
    return results  # type: ignore[return-value]
