"""Lowering: a ValidSpec -> source text, through the Jinja2 templates of its target.

The templates see only the validated, resolved spec (`v`), the raw knobs (`s`) and a few spelled-out
names; they never see parse trees or user text other than the canonical spec printed in the header.
"""
from __future__ import annotations

import functools
from typing import Optional

import jinja2
import jinja2.bccache

from . import cache, targets
from .knobs import DTYPE_BYTES
from .rules import ValidSpec


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The templates' environment. Compiling every template to Python costs about 110 ms, on the import that warms
    the dispatcher and in every `l2c` command that renders; the compiled code is kept in the user cache (Jinja's
    bytecode cache, each file named by its template and checked against the template's source), so later processes
    load it in about 2 ms."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("l2c._templates", ""),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        bytecode_cache=_bytecode_cache(),
    )


class _TolerantBytecodeCache(jinja2.FileSystemBytecodeCache):
    """Jinja's file cache, where a copy that cannot be read is a miss and one that cannot be written is skipped:
    the cache only saves time, so it never fails a render."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # noqa: BLE001 - a truncated or foreign file: compile the template again
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _bytecode_cache() -> Optional[jinja2.BytecodeCache]:
    try:
        return _TolerantBytecodeCache(str(cache.cache_dir("templates")))
    except OSError:
        return None


def render(valid: ValidSpec) -> str:
    """Source text of the kernel module (Triton .py or CUTLASS .cu) for one validated spec."""
    target = targets.get(valid.target)
    template = environment().get_template(target.template(valid.spec))
    return template.render(v=valid, s=valid.spec, spec_text=valid.spec.to_l2(), dtype_bytes=DTYPE_BYTES,
                           **target.context(valid))


def file_name(valid: ValidSpec) -> str:
    return valid.spec.name + targets.get(valid.target).suffix
