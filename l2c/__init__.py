"""l2c: a GEMM kernel compiler and tuner.

`l2c.matmul` and `l2c.nn.Linear` serve tuned kernels to PyTorch code; the `l2c` command compiles, checks,
benchmarks and tunes kernel specs written in the l2c DSL (grammar/l2.lark).
"""
__version__ = "0.1.0"


def __getattr__(name):
    # Imported lazily so that `l2c check`/`l2c compile` never pay for importing torch.
    if name == "matmul":
        from .dispatch import matmul
        return matmul
    if name == "nn":
        import importlib
        return importlib.import_module("l2c.nn")
    raise AttributeError(name)
