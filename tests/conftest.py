"""Shared fixtures.  Tests run real torch; nothing here stands in for it."""
import atexit
import os
import shutil
import tempfile

import pytest
from thread_failures import (pytest_runtest_call, pytest_runtest_setup,  # noqa: F401
                             pytest_runtest_teardown)

import fxguard

# install()'s code cache (README, "Install cost"): a fresh one for this run (and
# the subprocesses it starts), never the user's.
_cache = tempfile.mkdtemp(prefix="fxguard-test-cache-")
os.environ["FXGUARD_CACHE_DIR"] = _cache
atexit.register(shutil.rmtree, _cache, True)

# The suite is what stress-tests concurrent_compiles: it runs the option on
# every torch and Python it meets (install() refuses it elsewhere by default).
os.environ.setdefault("FXGUARD_ALLOW_UNTESTED", "concurrent_compiles")


@pytest.fixture(scope="session", autouse=True)
def main_thread_compiles_first():
    """On a CUDA build without a GPU, torch 2.11 registers the fake CUDA guard
    as a thread_local of the first thread that compiles: once that thread ends,
    the next compile of any thread segfaults.  install() registers it from the
    main thread (row "CUDA device guard up front"); stock-mode tests get the same
    from one compile here, if a collected test module imported torch (torch-free
    runs, the sanitizer job, never load it)."""
    import sys
    if "torch" not in sys.modules:
        return
    import torch
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))


@pytest.fixture(autouse=True)
def clean_torch():
    """Every test starts and ends with stock torch and a False flag, and dynamo's
    config as it found it (stock's overlapping config windows leave theirs)."""
    fxguard.uninstall()
    config = _dynamo_config()
    before = config.get_config_copy() if config is not None else None
    yield
    fxguard.uninstall()
    import sys
    if "torch" in sys.modules:
        from fxguard.demos import races
        races.reset_stock_leftovers()
    if before is not None:
        for name, value in config.get_config_copy().items():
            if name in before and before[name] != value:
                setattr(config, name, before[name])


def _dynamo_config():
    import sys
    module = sys.modules.get("torch._dynamo.config")
    return module if module is not None and hasattr(module, "get_config_copy") else None


@pytest.fixture
def guard(request):
    """'off' = stock torch, 'on' = fxguard.install(); see guarded.both_ways()."""
    if request.param == "on":
        fxguard.install()
    return request.param


HARNESSES = ("differential", "faults", "livethreads")  # minutes each, on every torch CI covers
FULL = "`pytest --full` (or FXGUARD_FULL=1) runs it; CI does, on every torch it covers"


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="also the long harnesses and the tests marked slow (minutes more)")


def pytest_configure(config):
    if config.getoption("--full"):
        os.environ["FXGUARD_FULL"] = "1"   # the pytest runs harnesses start in children


def pytest_collection_modifyitems(config, items):
    """README's test command runs the quick suite (a few minutes on 2 cores);
    ``--full`` adds the harnesses (tests/differential, faults, livethreads) and
    the tests marked ``slow``."""
    if config.getoption("--full") or os.environ.get("FXGUARD_FULL") == "1":
        return
    skip = pytest.mark.skip(reason=f"long: {FULL}")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        harness = os.path.relpath(str(item.fspath), here).split(os.sep)[0] in HARNESSES
        if harness or item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
