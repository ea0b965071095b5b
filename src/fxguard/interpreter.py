"""The interpreter fxguard runs on: free-threaded or not, the GIL on or off now,
and which modules turned it back on.

On a free-threaded build (3.13t) importing an extension that does not declare
``Py_mod_gil`` turns the GIL on for the whole process, and CPython says so in
a RuntimeWarning naming the module (triton's ``libtriton`` does, at ``import
torch._dynamo``; ``PYTHON_GIL=0`` keeps it off, at that module's risk).
``watch()`` notes those names as the warnings are shown; ``import fxguard``
calls it.  The FXGUARD=1 start-up hook, which must not import fxguard before
torch, keeps the warnings shown until then and hands them to ``note()`` when it
imports fxguard (this module never imports the hook).
"""
from __future__ import annotations

import re
import sys
import sysconfig
import warnings
from typing import Any

GIL_ENABLED = "global interpreter lock (GIL) has been enabled to load module"  # CPython's words
GIL_WARNING = re.compile(re.escape(GIL_ENABLED) + r" '([^']+)'")
_enabled_by: list[str] = []


def free_threaded() -> bool:
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def gil_enabled() -> bool:
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


def note(message: object) -> None:
    """Record the module a "GIL has been enabled" warning names, if it is one."""
    found = GIL_WARNING.search(str(message))
    if found and found.group(1) not in _enabled_by:
        _enabled_by.append(found.group(1))


def watch() -> None:
    """Note every module that turns the GIL on from now (free-threaded builds only)."""
    if not free_threaded() or getattr(warnings.showwarning, "_fxguard_watch", False):
        return
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        note(message)
        return shown(message, category, filename, lineno, file, line)

    showwarning._fxguard_watch = True  # type: ignore[attr-defined]
    warnings.showwarning = showwarning


def report() -> dict[str, Any]:
    """For status() and doctor (with what the FXGUARD=1 hook saw before fxguard was imported)."""
    return {"free_threaded": free_threaded(), "gil_enabled": gil_enabled(),
            "gil_enabled_by": list(_enabled_by) if free_threaded() else None}
