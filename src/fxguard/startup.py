"""Turning fxguard on from outside the program: FXGUARD=1 and FXGUARD_OPTIONS.

``FXGUARD_OPTIONS="block_mask_lock=0,eager_backward=0"`` takes install()'s
keyword options.  Policy (why it differs from a direct ``install()``): the
environment reaches processes whose code the user does not own (torchrun
workers, subprocesses, DataLoader and compile workers), so a torch fxguard
does not know, or a bad FXGUARD_OPTIONS, logs a WARNING on the "fxguard"
logger and the program runs unpatched, as it would without fxguard.  A direct
``fxguard.install()`` still raises: there the caller asked and can handle it.
"""
from __future__ import annotations

import logging
import os
from typing import Mapping

from .torch_support.options import OPTIONS

log = logging.getLogger("fxguard")

_VALUES = {"1": True, "true": True, "yes": True, "on": True,
           "0": False, "false": False, "no": False, "off": False}


def parse_options(text: str) -> dict[str, bool]:
    """``"block_mask_lock=0,eager_backward=off"`` -> keyword options for install().
    ValueError names the bad entry and the known options."""
    options: dict[str, bool] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, sep, value = (s.strip() for s in entry.partition("="))
        if name not in OPTIONS:
            raise ValueError(f"unknown option {name!r}; known: {', '.join(OPTIONS)}")
        if not sep or value.lower() not in _VALUES:
            raise ValueError(f"{entry!r}: expected {name}=1 or {name}=0")
        options[name] = _VALUES[value.lower()]
    return options


def install_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """install() with FXGUARD_OPTIONS; on any failure log a WARNING and leave
    torch unpatched.  True if fxguard is installed afterwards."""
    import fxguard
    if _in_compile_worker():
        log.debug("torch's inductor compile worker: fxguard not installed (no FX runs here)")
        return False
    try:
        options = parse_options(environ.get("FXGUARD_OPTIONS", ""))
    except ValueError as e:
        log.warning("FXGUARD_OPTIONS: %s; fxguard not installed, torch runs unpatched", e)
        return False
    try:
        fxguard.install(**options)
    except fxguard.UnsupportedTorchError as e:
        log.warning("FXGUARD=1 but fxguard does not know this torch (%s); torch runs "
                    "unpatched: %s", _torch_version(), e)
        return False
    except Exception:  # install() reverted what it did; the program should still run
        log.warning("FXGUARD=1: fxguard.install() failed; torch runs unpatched",
                    exc_info=True)
        return False
    return True


def _in_compile_worker() -> bool:
    """Inductor's compile-worker processes inherit FXGUARD but only build
    kernels; install() would cost each of them seconds for nothing."""
    import sys
    main = os.path.normpath(sys.argv[0] if sys.argv else "")
    return main.endswith(os.path.join("_inductor", "compile_worker", "__main__.py"))


def _torch_version() -> str:
    import sys
    return f"torch {getattr(sys.modules.get('torch'), '__version__', '?')}"
