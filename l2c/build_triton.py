"""The Triton target's builder: render the module, store it in the cache by content hash, import it.

Triton JIT-compiles on the first call (and caches the binary itself), so "building" here means producing
an importable, syntactically valid module whose `launch` is the kernel. The module lives in a real file
because Triton reads a kernel's source through `inspect`.
"""
from __future__ import annotations

import importlib.util
import sys

import triton

from . import cache
from .build import Kernel
from .errors import BuildError
from .lower import render
from .validate import ValidSpec


class TritonKernel(Kernel):
    target = "triton"

    def __init__(self, valid: ValidSpec, source: str, module, path):
        super().__init__(valid, source)
        self.module = module
        self.path = path
        self._launch = module.launch

    def __call__(self, a, b, c=None, bias=None, out=None):
        return self._launch(a, b, c, bias, out)


def load_module(source: str, name: str):
    """Write `source` into the cache (keyed by content and Triton version) and import it; return (module, path)."""
    digest = cache.content_hash(source, "triton", triton.__version__)[:24]
    path = cache.cache_dir("triton") / f"{name}_{digest}.py"
    try:
        compile(source, str(path), "exec")
    except SyntaxError as err:
        raise BuildError(f"generated Triton module for {name} does not compile: {err}") from err
    with cache.locked(path):
        if not path.exists():
            cache.write_atomic(path, source)
    module_name = f"l2c_triton_{name}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name], path
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[module_name]
        raise BuildError(f"importing the generated Triton module {path} failed: {type(err).__name__}: {err}") from err
    if not callable(getattr(module, "launch", None)):
        del sys.modules[module_name]
        raise BuildError(f"the generated Triton module {path} has no launch()")
    return module, path


def build_triton(valid: ValidSpec) -> TritonKernel:
    if valid.target != "triton":
        raise BuildError(f"{valid.name} was validated for {valid.target}, not triton")
    source = render(valid)
    module, path = load_module(source, valid.name)
    return TritonKernel(valid, source, module, path)
