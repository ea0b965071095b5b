"""Race tests run both ways: guard off must fail on a torch that races."""
import pytest


def torch_races() -> bool:
    """Whether the installed torch keeps the FX-tracing flag process-wide."""
    from torch.fx import _symbolic_trace

    from fxguard.torch_support import facts
    return facts.detect_layout(_symbolic_trace) == facts.MODULE_GLOBAL


def stock_loses_config() -> bool:
    """Whether a stock thread starts without its starter's torch config (2.12+,
    Python without thread_inherit_context)."""
    from fxguard.torch_support import facts
    return facts.config_is_per_thread() and not facts.python_inherits_context()


def both_ways(races=torch_races):
    """Parametrize over guard off (strict xfail where torch races) and on."""
    return pytest.mark.parametrize("guard", [
        pytest.param("off", marks=pytest.mark.xfail(
            races(), strict=True, reason="stock torch races: the test must catch it")),
        "on",
    ], indirect=True)


def needs(path: str):
    """Skip where the installed torch lacks ``path`` ('pkg.mod.attr'): older releases."""
    import importlib
    module, _, attr = path.rpartition(".")
    try:
        present = hasattr(importlib.import_module(module), attr)
    except ImportError:
        present = False
    return pytest.mark.skipif(not present, reason=f"this torch has no {path}")


def run_together(*targets, timeout: float = 60.0) -> None:
    """Start one thread per target, wait for all; fail if one is still running."""
    import threading
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
