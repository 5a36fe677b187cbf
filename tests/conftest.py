"""Shared test setup. Triton kernels run under the CPU interpreter here: the variable must be set before
anything imports triton."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
