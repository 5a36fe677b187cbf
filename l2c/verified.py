"""Verified kernels: the (kernel build, call shape) pairs that passed `l2c.verify` on this GPU, driver and l2c
code, persisted in the user cache so that a later process serves such a kernel from its first call instead of
waiting for the preparation worker to check it again (about 4.5 s on the H200's host, most of it the worker's
start: Python, torch and a CUDA context).

A kernel is named by its build id (target, rendered source and toolchain: `l2c.build.build_id`), so a changed
template, flag or compiler makes another kernel, checked again; the GPU by name and driver
(`devices.gpu_identity`) together with l2c's code (`cache.code_identity`: its version and a digest of its
modules and templates), so a new GPU, driver or l2c starts with no record. Only
passes are recorded: a failure may be transient (memory), and the worker checks again.
"""
from __future__ import annotations

from typing import Optional

from . import cache


class VerifiedKernels:
    """The persisted verification passes of one (GPU, driver, l2c code)."""

    def __init__(self, gpu: str, driver: str, version: Optional[str] = None):
        self.records = cache.KeyedRecords.of_gpu("verified", "kernels", gpu, driver, version)

    @staticmethod
    def name(job) -> Optional[str]:
        """What a record of `job` (an l2c.prepare.Job) is filed under; None for a job that is no single kernel (an
        online-tuning job) or whose spec has no build."""
        from .build import build_id_of
        if job.candidates:
            return None
        build = build_id_of(job.spec_text, job.target, job.arch)
        return f"{build}:{job.m}x{job.n}x{job.k}:{job.device}" if build else None

    def holds(self, job) -> bool:
        """Whether `job`'s kernel passed verification at its shape before (no record at all costs no build id)."""
        if not self.records.entries:
            return False
        name = self.name(job)
        return name is not None and self.records.entries.get(name) is True

    def record(self, job) -> None:
        """Persist that `job`'s kernel passed verification at its shape."""
        name = self.name(job)
        if name is not None and self.records.entries.get(name) is not True:
            self.records.put(name, True)
