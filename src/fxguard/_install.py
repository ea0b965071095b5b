"""install / uninstall / status / preview: the plan applied to torch, and undone.

The plan is torch_support's (which rows, for which torch); the machinery
applies and records the changes (machinery.originals), and the C core gets
the slot layout and the torch functions it may call.
"""
from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any

from . import _core, interpreter
from .machinery import code_cache, codegen, originals, settle
from .machinery.changes import Outcome, Row
from .torch_support.rows import OFF_BY_DEFAULT, OPTIONS

__version__ = "0.1.0"

_MODES = {_core.MODE_OFF: "not-installed", _core.MODE_PATCHED: "patched",
          _core.MODE_UPSTREAM: "upstream-thread-local"}
log = logging.getLogger("fxguard")  # INFO: what install() did; WARNING: rows it stood down
_lock = threading.Lock()      # install/uninstall are rare: a plain lock suffices


@dataclass(frozen=True)
class Installed:
    layout: str
    options: dict[str, bool]
    rows: list[Row]
    workers: str
    code_cache: dict[str, Any]
    concurrent: list[Row]
    compile_once: Any  # torch_support.compile_once.CompileOnce, or None


_installed: Installed | None = None

def install(*, block_mask_lock: bool = True, config_window_lock: bool = True,
            eager_backward: bool = True, config_follows_thread: bool = True,
            compile_once: bool = True, concurrent_compiles: bool = False,
            rng_not_rewound: bool = True) -> dict:
    """Make torch's trace state per-thread.  Idempotent; returns status().

    Every option is keyword-only and True or False (anything else: TypeError):

    - ``block_mask_lock``: torch's eager ``create_block_mask`` holds
      ``fxguard.block_mask_lock`` (never across a compile);
    - ``config_window_lock``: where dynamo config is process-wide (torch <= 2.11),
      the config that eager flex_attention's compilation window sets stays in
      the thread inside the window;
    - ``eager_backward``: backward graphs are compiled with the forward, which
      removes the shared-GPU deadlock between compiles and the autograd worker;
    - ``config_follows_thread``: a new thread starts with a copy of its
      starter's torch config overrides (see ``config_snapshot()``);
    - ``compile_once``: threads that reach the same graph while one of them
      compiles it run that compile (where its guards pass for them) instead
      of compiling a copy; status()["compile_once"] counts them.
    - ``concurrent_compiles`` (off by default): dynamo no longer holds its
      ``compile_lock`` across a whole compile, so distinct graphs compile at
      once in several threads; what one compile keeps process-wide becomes per
      thread, one-time set-up runs once, ids and counters stay exact.
      ``status()["concurrent_compiles"]`` says whether its stress suite was run
      on this torch.  One function's compiles still run one at a time (with
      ``compile_once``, threads that miss together share one).
    - ``rng_not_rewound``: a compile no longer sets the CPU and CUDA random
      generators back while other threads run, so their draws are never
      repeated (single-threaded, the restore happens as stock).

    Raises UnsupportedTorchError, leaving torch untouched, on a torch whose
    layout fxguard does not know.  Logs what it did on the "fxguard" logger.
    What it computes from torch's source is cached on disk (docs/how-it-works.md, "Install
    cost"), so a later process installs in a fraction of the time.
    """
    global _installed
    chosen = _chosen(block_mask_lock=block_mask_lock, config_window_lock=config_window_lock,
                     eager_backward=eager_backward, config_follows_thread=config_follows_thread,
                     compile_once=compile_once, concurrent_compiles=concurrent_compiles,
                     rng_not_rewound=rng_not_rewound)
    # torch is imported outside the lock: with FXGUARD=1 the start-up hook
    # installs as torch finishes importing, in this very thread.
    import torch  # noqa: F401
    with _lock:
        if _installed is not None:
            if _installed.options == chosen:
                return status()
            _uninstall_locked()
        facts, prepared = _prepare(chosen)  # raises before touching torch
        for register in prepared.up_front:  # what torch itself would do lazily, never undone
            register()
        try:
            # The core first: rewritten code reads its slots as soon as it is live.
            carried, workers = _configure_core(facts.layout, prepared.defaults,
                                               prepared.carry_context)
            originals.apply_all(prepared.changes, _settle)
            for module, name, value in prepared.initial:  # this thread keeps what it had
                setattr(vars(module)[codegen.TLS], name, value)
            if carried:  # records go to torch's thread-locals
                _wait_for_exiting_threads_at_exit()
        except BaseException:
            originals.revert_all()
            _core._configure(_core.MODE_OFF)
            raise
        _installed = Installed(facts.layout, chosen, prepared.rows, workers,
                               dict(code_cache.last), prepared.concurrent, prepared.compile_once)
        _log_installed(_installed.rows)
        return status()


def _prepare(chosen: dict[str, bool]) -> tuple[Any, Any]:
    from .torch_support import facts, prepare
    with code_cache.session():
        found = facts.detect()
        return found, prepare.prepare(found, chosen)


def _chosen(who: str = "install", **options: Any) -> dict[str, bool]:
    """Every option, checked: unknown names and non-bools are TypeErrors."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"{who}() got an unexpected keyword argument {unknown[0]!r}")
    chosen = {name: options.get(name, name not in OFF_BY_DEFAULT) for name in OPTIONS}
    for name, value in chosen.items():
        if type(value) is not bool:  # 1, 0.0, "no", numpy.bool_: say so, do not guess
            raise TypeError(f"{who}(): {name} must be True or False, not {value!r}")
    return chosen


def _log_installed(rows: list[Row]) -> None:
    info = status()
    patched = [f"{r.what} {r.where}" for r in rows if r.patched]
    log.info("fxguard %s installed on torch %s (%s): patched %s", info["fxguard"],
             info["torch"], info["mode"], "; ".join(patched) or "nothing")
    for r in rows:
        if r.outcome is Outcome.NOT_COVERED:
            log.warning("fxguard stood down for %s %s: %s", r.what, r.where, r.reason)


_exit_wait_registered = False


def _wait_for_exiting_threads_at_exit() -> None:
    """A thread that ends just before the process does destroys its C++
    thread-locals (holding its stashed record) while the interpreter
    finalizes, and torch's decref there aborts the process ("terminate called
    without an active exception"; seen on torch 2.11 and 2.13).  An exit
    handler, which runs after threading joined its threads and before
    finalization, waits (up to 2 s, GIL released) until they have let go."""
    global _exit_wait_registered
    if not _exit_wait_registered:
        import atexit
        atexit.register(_core._await_thread_exits, 2.0)
        _exit_wait_registered = True


def _core_hooks(layout: str) -> tuple[int, dict[str, Any]]:
    """The C core's mode for this layout, and the torch functions it may call."""
    import torch
    from torch.fx import _symbolic_trace

    from .torch_support.facts import UPSTREAM
    hooks = {"is_compiling": torch.compiler.is_compiling}
    # torch carries these Python objects into autograd worker threads.
    for hook, name in (("tls_stash", "_stash_obj_in_tls"), ("tls_has", "_is_key_in_tls"),
                       ("tls_get", "_get_obj_in_tls")):
        hooks[hook] = getattr(torch._C, name, None)
    if layout != UPSTREAM:
        return _core.MODE_PATCHED, hooks
    hooks.update(upstream_get=_symbolic_trace._get_is_fx_tracing,
                 upstream_set=_symbolic_trace._set_is_fx_tracing)
    return _core.MODE_UPSTREAM, hooks


def _workers(mode: int, hooks: dict[str, Any]) -> tuple[bool, str]:
    """Whether records are carried into autograd workers, and how status() says it."""
    if None in (hooks["tls_stash"], hooks["tls_has"], hooks["tls_get"]):
        return False, "not carried (this torch lacks _stash_obj_in_tls and friends)"
    carried = "per-thread state carried via torch._C._stash_obj_in_tls"
    if mode == _core.MODE_UPSTREAM:
        carried += "; torch's own FX flag (threading.local) is not carried"
    return True, carried


def _configure_core(layout: str, defaults: tuple[tuple, tuple],
                    carry_context: bool) -> tuple[bool, str]:
    """Hand the C core the slot layout and the torch functions it may call."""
    mode, hooks = _core_hooks(layout)
    _core._configure(mode, defaults=defaults[0], factories=defaults[1],
                     carry_context=carry_context, **hooks)
    return _workers(mode, hooks)


def preview(**options: bool) -> dict:
    """What ``install(**options)`` would do on the installed torch, computed
    without changing anything: status()'s keys, with ``mode`` the one install()
    would set, and ``"preview": True``.  Where fxguard is installed: status().
    Imports torch; raises what install() would (UnsupportedTorchError, TypeError)."""
    chosen = _chosen("preview", **options)
    import torch  # noqa: F401  (outside the lock: see install())
    with _lock:
        if _installed is not None:
            return {**status(), "preview": False}
        facts, prepared = _prepare(chosen)
    mode, hooks = _core_hooks(facts.layout)
    return {**status(), "mode": _MODES[mode], "layout": facts.layout, "options": chosen,
            "patch_points": [r.as_dict() for r in prepared.rows],
            "autograd_workers": _workers(mode, hooks)[1],
            "concurrent_compiles": _concurrent_status(chosen, prepared.concurrent),
            "code_cache": dict(code_cache.last), "preview": True,
            "note": "what install() would do on this torch; nothing was changed"}


def uninstall() -> None:
    """Restore torch exactly as it was: same objects, same code, same module attributes.

    Idempotent.  Raises RuntimeError (and changes nothing) while a thread is
    inside an FX trace, since that trace's code is the patched code.
    """
    with _lock:
        _uninstall_locked()


def _uninstall_locked() -> None:
    global _installed
    if _installed is None:
        return
    busy = _core._tracing_records()
    if busy and _core._mode() == _core.MODE_PATCHED:
        raise RuntimeError(f"fxguard.uninstall(): {busy} thread(s) are inside an FX trace; "
                           "uninstall after they finish")
    originals.revert_all(_settle)
    _core._configure(_core.MODE_OFF)
    _installed = None


def _settle(codes: list) -> None:
    """Let other threads leave the code a change retires before names go."""
    busy = settle.settle(codes)
    if busy:
        log.warning("fxguard: thread(s) %s still ran torch code that was just replaced; "
                    "they may read a name that is gone", ", ".join(sorted(set(busy))))


def is_installed() -> bool:
    return _installed is not None


def status() -> dict:
    """This process: torch version, mode, and each row of the plan with its
    reason (``patched``, ``option off``, ``not needed: ...``, ``not available
    on this torch``, ``not covered: ...``)."""
    torch = sys.modules.get("torch")
    info: dict[str, Any] = {
        "fxguard": __version__,
        "torch": getattr(torch, "__version__", None),
        "python": sys.version.split()[0],
        "mode": _MODES[_core._mode()],
        "layout": None,
        "options": None,
        "patch_points": [],
        "autograd_workers": None,
        "code_cache": None,
        "compile_once": None,
        "concurrent_compiles": None,
        "interpreter": interpreter.report(),
    }
    if _installed is not None:
        info.update(layout=_installed.layout, options=dict(_installed.options),
                    patch_points=[r.as_dict() for r in _installed.rows],
                    autograd_workers=_installed.workers, code_cache=dict(_installed.code_cache),
                    concurrent_compiles=_concurrent_status(_installed.options,
                                                           _installed.concurrent))
        if _installed.compile_once is not None:  # {"compiles_avoided": n, "waits": n}
            info["compile_once"] = _installed.compile_once.counters()
    return info


def _concurrent_status(options: dict[str, bool], rows: list[Row]) -> dict[str, Any]:
    """Option concurrent_compiles: on or off, whether its stress suite was run on
    this torch, and which of its rows apply here."""
    from .torch_support import facts
    on = options["concurrent_compiles"]
    return {"enabled": on, "stress_tested": facts.concurrent_compiles_stress_tested(),
            "tested": facts.concurrent_compiles_tested(),
            "applies": [r.where for r in rows if r.patched] if on else [],
            "not_on_this_torch": [r.where for r in rows
                                  if r.outcome in (Outcome.NOT_AVAILABLE, Outcome.NOT_NEEDED)]}


def make_create_block_mask() -> Any:
    """fxguard.create_block_mask: torch's, holding block_mask_lock unless
    ``_compile=True`` (a compile must never hold it: a new shape compiles, and
    every thread's masks would queue behind that compile).  It carries torch's
    signature and docstring (``__wrapped__``), which vary between releases, so
    it is made on first access, which imports torch."""
    import functools
    import inspect

    from torch.nn.attention import flex_attention as flex
    stock = flex.create_block_mask
    names = list(inspect.signature(stock).parameters)
    at = names.index("_compile") if "_compile" in names else None

    @functools.wraps(stock)
    def create_block_mask(*args: Any, **kwargs: Any) -> Any:
        compiles = kwargs.get("_compile", args[at] if at is not None and len(args) > at else False)
        if compiles:
            return flex.create_block_mask(*args, **kwargs)
        with _core.block_mask_lock:  # re-entrant: install()'s wrapper takes it again, cheaply
            return flex.create_block_mask(*args, **kwargs)

    create_block_mask.__module__ = "fxguard"
    create_block_mask.__doc__ = ("fxguard: torch's create_block_mask, holding fxguard.block_mask_lock "
                                 "unless _compile=True.\n\n" + (stock.__doc__ or ""))
    return create_block_mask
