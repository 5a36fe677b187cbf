"""l2c: a GEMM kernel compiler and tuner.

`l2c.matmul`, `l2c.gated_matmul`, `l2c.nn.Linear` and `l2c.nn.GatedMLP` serve tuned kernels to PyTorch code; the
`l2c` command compiles, checks, benchmarks and tunes kernel specs written in the l2c DSL (grammar/l2.lark).
"""
__version__ = "0.1.0"

import sys as _sys


def _warm_start() -> None:
    """Import what `l2c.matmul` and `l2c.nn` load on first access off the importing thread, while the caller builds its
    model: the dispatcher, whose import prepares what a first tuned call needs (l2c.dispatch: `_compile_front_end`,
    and on a GPU `_warm_start`), then l2c.ops, whose torch custom ops cost tens of milliseconds to register (torch
    reads each one's source location), then l2c.nn."""
    import importlib
    try:
        from . import background
        for name in ("l2c.dispatch", "l2c.ops", "l2c.nn"):
            if background.exiting():
                return
            with background.fork_unsafe():   # a fork mid-import would leave the child the module's import lock held
                importlib.import_module(name)
    except Exception:  # noqa: BLE001 - the first call imports it again and reports what is wrong
        pass


if "torch" in _sys.modules:   # a PyTorch program (the command line never imports torch first)
    from . import settings as _settings
    if _settings.value("L2C_WARM_START") != "0":
        from . import background as _background
        try:
            # the warm start's imports reach filelock, which registers fork handlers; registered while a fork waits
            # for those imports (l2c.background.fork_unsafe), its after-handler would run without its before-handler
            import filelock as _filelock  # noqa: F401
        except ImportError:
            pass
        _background.start(_warm_start, "l2c-warm-start")


def __getattr__(name):
    # Imported lazily so that `l2c check`/`l2c compile` never pay for importing torch.
    # Each is bound on first use, so later accesses are plain attribute reads.
    import importlib
    if name in ("matmul", "gated_matmul"):
        value = getattr(importlib.import_module("l2c.ops"), name)
    elif name == "precompile":
        value = importlib.import_module("l2c.dispatch").precompile
    elif name == "nn":
        value = importlib.import_module("l2c.nn")
    else:
        raise AttributeError(name)
    globals()[name] = value
    return value
