"""What the installed torch (and Python) is, detected once and handed on.

Every decision install() makes about a torch release starts from a
``TorchFacts``: the layout of the FX-tracing flag, whether config overrides
are per thread, whether Python already gives new threads their starter's
context.  Comments and README quote the versions these detections give.
"""
from __future__ import annotations

import contextvars
import sys
import types
from dataclasses import dataclass

FLAG = "_is_fx_tracing_flag"
FLAG_MODULE = "torch.fx._symbolic_trace"

# Layouts of torch's FX-tracing flag that fxguard knows.
MODULE_GLOBAL = "module-global"       # torch <= 2.13: one bool for the process
UPSTREAM = "upstream-thread-local"    # torch >= 2.14: threading.local behind _get/_set_is_fx_tracing

# The module-global layout: the functions of torch.fx._symbolic_trace that use
# the flag, one known set per torch generation.  Every other use in the module
# must lie in one of them (per_thread_globals checks it); none matching refuses.
KNOWN_FLAG_USERS = (
    frozenset({"is_fx_tracing", "is_fx_symbolic_tracing", "Tracer.trace"}),  # 2.9 - 2.13
    frozenset({"is_fx_tracing", "Tracer.trace"}),  # 2.5 - 2.8: compile_wrapper calls is_fx_tracing
)


class UnsupportedTorchError(RuntimeError):
    """install() found a torch it does not know; nothing was patched."""


@dataclass(frozen=True)
class TorchFacts:
    torch: str                     # torch.__version__
    layout: str                    # MODULE_GLOBAL or UPSTREAM
    config_per_thread: bool        # config overrides live in ContextVars (torch >= 2.12)
    python_inherits_context: bool  # new threads start in a copy of the starter's context (3.14+)
    gil_enabled: bool = True       # at install (a free-threaded build may run without it)

    @property
    def release(self) -> str:
        return self.torch.split("+")[0]

    @property
    def stock_threads_lose_config(self) -> bool:
        """A stock thread starts without its starter's torch config (the trap)."""
        return self.config_per_thread and not self.python_inherits_context


def detect() -> TorchFacts:
    """Imports torch; UnsupportedTorchError on a layout fxguard does not know."""
    import torch
    from torch.fx import _symbolic_trace
    from .. import interpreter
    return TorchFacts(torch.__version__, detect_layout(_symbolic_trace), config_is_per_thread(),
                      python_inherits_context(), interpreter.gil_enabled())


def detect_layout(module: types.ModuleType) -> str:
    """Which layout ``torch.fx._symbolic_trace`` has; UnsupportedTorchError if none."""
    from ..machinery.per_thread_globals import functions_in
    from ..machinery.rewrite import global_users

    names = vars(module)
    if callable(names.get("_get_is_fx_tracing")) and callable(names.get("_set_is_fx_tracing")) \
            and FLAG not in names:
        return UPSTREAM
    problems = []
    if type(names.get(FLAG)) is not bool:
        problems.append(f"module global {FLAG} (a bool) is missing")
    users = {fn.__qualname__ for fn in functions_in(module) if global_users([fn.__code__], FLAG)}
    if not any(known <= users for known in KNOWN_FLAG_USERS):
        missing = min((known - users for known in KNOWN_FLAG_USERS), key=len)
        problems.append(f"these no longer use {FLAG}: {', '.join(sorted(missing))}")
    if problems:
        raise UnsupportedTorchError(f"{module.__name__}: " + "; ".join(problems))
    return MODULE_GLOBAL


def config_is_per_thread() -> bool:
    """torch <= 2.11 keeps config values in plain attributes shared by every
    thread; from 2.12 each override is a ContextVar, so each thread has its own.
    Read from a config module ``import torch`` loads (every one is made by
    the same torch.utils._config_module), so that install() imports no compiler."""
    import importlib
    loaded = [sys.modules.get(name) for name in ("torch.fx.experimental._config",
                                                 "torch.compiler.config")]
    module = next((m for m in loaded if isinstance(getattr(m, "_config", None), dict)), None)
    if module is None:
        module = importlib.import_module("torch._dynamo.config")
    return any(isinstance(getattr(entry, "user_override", None), contextvars.ContextVar)
               for entry in module._config.values())


def python_inherits_context() -> bool:
    """Python 3.14+ with thread_inherit_context (the free-threaded default):
    threads start in a copy of their starter's context already."""
    return bool(getattr(sys.flags, "thread_inherit_context", 0))


# torch releases the concurrent_compiles stress suite
# (tests/races/test_concurrent_compiles_stress.py) and its race tests were run
# on, CPU, Python 3.11 (docs/concurrent-compiles.md).
CONCURRENT_COMPILES_STRESSED = ("2.11.0", "2.13.0", "2.14.1", "2.15.0")


ALLOW_UNTESTED = "FXGUARD_ALLOW_UNTESTED"  # "concurrent_compiles": run it anyway


def concurrent_compiles_refusal(facts: TorchFacts) -> str | None:
    """Why install(concurrent_compiles=True) refuses here (None: it may run):
    only on a torch and Python its stress suite ran on, unless the environment
    says FXGUARD_ALLOW_UNTESTED=concurrent_compiles."""
    import os
    if "concurrent_compiles" in os.environ.get(ALLOW_UNTESTED, "").replace(" ", "").split(","):
        return None
    if concurrent_compiles_stress_tested(facts):
        return None
    where = f"torch {facts.release}" if facts.gil_enabled else "a Python with the GIL off"
    return (f"concurrent_compiles has not been stress-tested on {where} (tested: torch "
            f"{', '.join(CONCURRENT_COMPILES_STRESSED)} with the GIL); nothing was changed. "
            f"To run it anyway, set {ALLOW_UNTESTED}=concurrent_compiles")


def concurrent_compiles_stress_tested(facts: TorchFacts) -> bool:
    """The stress suite ran on this torch, with the GIL (as at install)."""
    return facts.gil_enabled and facts.release in CONCURRENT_COMPILES_STRESSED


def concurrent_compiles_tested(facts: TorchFacts) -> str:
    """concurrent_compiles_stress_tested(), said in a sentence (for people)."""
    if not facts.gil_enabled:
        return "untested without the GIL (free-threaded build): its race tests are skipped there"
    if facts.release in CONCURRENT_COMPILES_STRESSED:
        return f"stress suite run on this torch ({facts.release})"
    return (f"untested on this torch ({facts.release}); the stress suite was run on "
            f"{', '.join(CONCURRENT_COMPILES_STRESSED)}")
