"""The shipped pack's upkeep: which CUTLASS kernels it must hold, building it, and verifying it.

The pack holds exactly the kernels the dispatcher builds for the shipped tables' CUTLASS entries
(`tuned_table.served_spec`) for calls without bias or with nn.Linear's per-column bias, without activation.
`l2c pack build` compiles them (through the build cache) and writes the pack; `l2c pack verify` checks, with no
compiler and no GPU, that the pack holds every one of them under its current key and that every library is intact.
The format and the reading side are `l2c.targets.cutlass.pack`.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .targets.cutlass.pack import (Pack, PackEntry, PackError, check_libraries, library_member, read_pack,
                                   write_pack)
from .targets.cutlass.toolchain import NVCC_FLAGS, cutlass_version
from .tuned_table import PLAIN_EPILOGUES

# The calls each entry's kernel is prebuilt for (has bias, activation): the ones `l2c warmup` prepares too.
EPILOGUES = PLAIN_EPILOGUES

@dataclass(frozen=True)
class RequiredKernel:
    """A kernel the dispatcher builds for a table entry: what the pack must hold."""
    name: str
    spec: str            # canonical .l2 text, as the dispatcher hands it to the builder
    source: str          # the rendered CUDA source
    key: str
    label: str           # which table entry and call asks for it, for messages


def shipped_tables() -> List[Path]:
    """The tuned tables shipped with l2c (l2c/tuned/*.json)."""
    return sorted(Path(str(resources.files("l2c") / "tuned")).glob("*.json"))


# ---- what the pack must hold

def required_kernels(table_paths: Sequence[Union[str, Path]]) -> Tuple[str, List[RequiredKernel], List[str]]:
    """(arch, the kernels, problems): every CUTLASS kernel the dispatcher builds for the tables' served entries at
    the EPILOGUES, rendered (no compiler needed), once each, then l2c's checker (`l2c.checker`, which verifies them
    on a caller's thread); problems are entries whose spec does not validate.
    TableError for a file that is not a table, PackError for tables of different architectures."""
    from .targets.cutlass.toolchain import pack_key
    from .errors import L2Error
    from .lower import render
    from .parser import parse_one
    from .tuned_table import load_table, served_entries, served_ms, served_spec
    from .validate import validate

    tables = [load_table(path) for path in table_paths]
    arches = sorted({t.arch for t in tables})
    if len(arches) != 1:
        raise PackError(f"a pack is for one architecture; the tables are for {', '.join(arches) or 'none'}")
    arch = arches[0]
    kernels: Dict[str, RequiredKernel] = {}
    problems: List[str] = []
    for table in tables:
        for entry in served_entries(table):
            if entry.target != "cutlass":
                continue
            where = f"{Path(table.source).name}: {entry.dtype} {entry.layout} {entry.m}x{entry.n}x{entry.k}"
            try:
                for m in served_ms(entry):
                    for has_bias, activation in EPILOGUES:
                        text = served_spec(entry, m, has_bias, activation).to_l2()
                        if text in kernels:
                            continue
                        valid = validate(parse_one(text), "cutlass", arch)   # as the dispatcher builds it
                        source = render(valid)
                        label = f"{where} (M={m}, bias={'col' if has_bias else 'none'}, activation={activation})"
                        kernels[text] = RequiredKernel(valid.name, text, source, pack_key(source), label)
            except L2Error as err:
                problems.append(f"{where}: the spec cannot be built: {err}")
    from . import checker
    text = checker.source()
    kernels[checker.SPEC] = RequiredKernel(checker.NAME, checker.SPEC, text, pack_key(text),
                                           "verification on a caller's thread (l2c.checker)")
    return arch, list(kernels.values()), problems


def build_pack(kernels: Sequence[RequiredKernel], arch: str, out: Union[str, Path], jobs: int,
               report: Callable[[RequiredKernel, Optional[str], float], None]) -> Tuple[Pack, int]:
    """Compile `kernels` through the build cache (`jobs` nvcc processes, several kernels per run; built ones are
    reused), write the pack of those that built to `out`, and return it with the number that failed.
    `report(kernel, error, seconds)` is called for each kernel as it is known, with the seconds since the build
    began. Needs nvcc: the pack records the version that built its libraries."""
    import threading
    from .targets.cutlass.build import compile_many
    from .targets.cutlass.toolchain import cuda_release, find_nvcc, nvcc_version
    from .errors import BuildError
    compiler = nvcc_version(find_nvcc())
    start, lock = time.perf_counter(), threading.Lock()

    def done(i, outcome, _kernels):
        with lock:
            report(kernels[i], str(outcome) if isinstance(outcome, BuildError) else None, time.perf_counter() - start)

    outcomes = compile_many([(kernel.source, kernel.name) for kernel in kernels], max(1, jobs), done)
    libraries, failed = [], 0
    for kernel, library in zip(kernels, outcomes):
        if isinstance(library, BuildError):
            failed += 1
            continue
        data = Path(library).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        entry = PackEntry(name=kernel.name, spec=kernel.spec, key=kernel.key, file=library_member(digest),
                          sha256=digest, size=len(data), nvcc_version=compiler, cuda_version=cuda_release(compiler))
        libraries.append((entry, data))
    if not libraries:   # never replace a pack with an empty one (a broken nvcc fails every kernel)
        raise PackError(f"none of the {len(kernels)} kernels built: {out} left as it was")
    return write_pack(out, arch, libraries), failed


def verify_pack(pack_path: Union[str, Path], arch: str, kernels: Sequence[RequiredKernel]) -> Tuple[List[str], int]:
    """(problems, unused): every required kernel the pack lacks or holds under another key (stale: its template,
    flags or CUTLASS version changed since), every library that is damaged; and how many pack entries no table
    asks for. No compiler, no GPU."""
    try:
        pack = read_pack(pack_path)
    except PackError as err:
        return [str(err)], 0
    problems = []
    if pack.arch != arch:
        problems.append(f"{pack.path}: the pack is for {pack.arch}, the tables for {arch}")
    by_spec = {e.spec: e for e in pack.entries.values()}
    for kernel in kernels:
        if kernel.key in pack.entries:
            continue
        held = by_spec.get(kernel.spec)
        if held is None:
            problems.append(f"missing: {kernel.name} for {kernel.label}")
        else:
            problems.append(f"stale: {kernel.name} for {kernel.label}: the pack's build has key {held.key[:16]}, "
                            f"the current source, flags and CUTLASS version give {kernel.key[:16]}")
    if any(p.startswith("stale") for p in problems) and \
            (pack.cutlass_version, pack.nvcc_flags) != (cutlass_version(), " ".join(NVCC_FLAGS)):
        problems.append(f"note: the pack was built with CUTLASS {pack.cutlass_version} and flags "
                        f"'{pack.nvcc_flags}'; now CUTLASS {cutlass_version()}, flags '{' '.join(NVCC_FLAGS)}'")
    problems += check_libraries(pack)
    unused = len(set(pack.entries) - {k.key for k in kernels})
    return problems, unused
