"""Shared fixtures.  Tests run real torch; nothing here stands in for it."""
import pytest

import fxguard


@pytest.fixture(autouse=True)
def clean_torch():
    """Every test starts and ends with stock torch and a False flag."""
    fxguard.uninstall()
    yield
    fxguard.uninstall()
    import sys
    if "torch" in sys.modules:
        from fxguard import races
        races.reset_stock_flag()


@pytest.fixture
def guard(request):
    """'off' = stock torch, 'on' = fxguard.install(); see guarded.both_ways()."""
    if request.param == "on":
        fxguard.install()
    return request.param
