"""Shared fixtures.  Tests run real torch; nothing here stands in for it."""
import atexit
import os
import shutil
import tempfile

import pytest

import fxguard

# install()'s code cache (README, "Install cost"): a fresh one for this run (and
# the subprocesses it starts), never the user's.
_cache = tempfile.mkdtemp(prefix="fxguard-test-cache-")
os.environ["FXGUARD_CACHE_DIR"] = _cache
atexit.register(shutil.rmtree, _cache, True)


@pytest.fixture(scope="session", autouse=True)
def main_thread_compiles_first():
    """torch 2.11's CUDA wheels on a machine without a GPU crash (segfault in
    FakeTensorMode.__enter__) when a thread compiles after another compiling
    thread has exited, unless the main thread compiled first; stock torch does
    it without fxguard (seen 2026-12-02).  Compile once here, if a collected test
    module imported torch: torch-free runs (the sanitizer job) never load it."""
    import sys
    if "torch" not in sys.modules:
        return
    import torch
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))


@pytest.fixture(autouse=True)
def clean_torch():
    """Every test starts and ends with stock torch and a False flag."""
    fxguard.uninstall()
    yield
    fxguard.uninstall()
    import sys
    if "torch" in sys.modules:
        from fxguard.demos import races
        races.reset_stock_leftovers()


@pytest.fixture
def guard(request):
    """'off' = stock torch, 'on' = fxguard.install(); see guarded.both_ways()."""
    if request.param == "on":
        fxguard.install()
    return request.param
