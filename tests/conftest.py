"""Shared test setup. Triton kernels run under the CPU interpreter here: the variable must be set before
anything imports triton."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def cache_in_tmp(tmp_path_factory):
    """A build cache of the test module's own (L2C_CACHE_DIR), so that its kernels are built fresh."""
    from l2c import cache
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(cache.ENV_VAR, str(tmp_path_factory.mktemp("l2c_cache")))
        yield
