"""l2c: a GEMM kernel compiler and tuner.

`l2c.matmul`, `l2c.gated_matmul`, `l2c.nn.Linear` and `l2c.nn.GatedMLP` serve tuned kernels to PyTorch code; the `l2c` command compiles, checks,
benchmarks and tunes kernel specs written in the l2c DSL (grammar/l2.lark).
"""
__version__ = "0.1.0"


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
