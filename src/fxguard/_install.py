"""install / uninstall / status / preview: the plan applied to torch, and undone.

The plan is torch_support's (which rows, for which torch); the machinery
applies and records the changes (machinery.originals), and the C core gets
the slot layout and the torch functions it may call.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
import types
from dataclasses import asdict, dataclass
from typing import Any

from . import _core, interpreter
from .machinery import code_cache, codegen, import_watch, originals, per_thread_globals, settle
from .machinery.changes import Outcome, Row
from .torch_support.options import OPTIONS, Option, Options

__version__ = "0.1.0"

_MODES = {_core.MODE_OFF: "not-installed", _core.MODE_PATCHED: "patched",
          _core.MODE_UPSTREAM: "upstream-thread-local"}
log = logging.getLogger("fxguard")  # INFO: what install() did; WARNING: rows it stood down
_lock = threading.Lock()      # install/uninstall are rare: a plain lock suffices


@dataclass(frozen=True)
class Installed:
    options: Options
    workers: str
    code_cache: dict[str, Any]
    facts: Any         # torch_support.facts.TorchFacts
    later: Any         # torch_support.prepare.Later: every row's status, what waits, what rows provided

    @property
    def rows(self) -> list[Row]:
        return self.later.rows


_installed: Installed | None = None
_watcher = import_watch.Watcher("torch", lambda: _apply_waiting(), lambda name: _reloaded(name))

def install(*, block_mask_lock: bool = True, config_window_lock: bool = True,
            eager_backward: bool = True, config_follows_thread: bool = True,
            compile_once: bool = True, concurrent_compiles: bool = False,
            rng_not_rewound: bool = True, cuda_graphs_per_thread: bool = True) -> dict:
    """Make torch's trace state per-thread.  Idempotent; returns status().

    Every option is keyword-only and True or False (anything else: TypeError):

    - ``block_mask_lock``: torch's eager ``create_block_mask`` holds
      ``fxguard.block_mask_lock`` (never across a compile);
    - ``config_window_lock``: where config is process-wide (torch <= 2.11),
      the config that eager flex_attention's compilation window sets stays in
      the thread inside the window, and ``torch.compile(mode=..., options=...)``
      reads its options without setting them for every thread;
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
    - ``cuda_graphs_per_thread``: CUDA graphs (``mode="reduce-overhead"``) run
      per thread: each thread's own trees and callable, its own step marks
      and generations (carried into the autograd workers running its
      backward); warm-up and recording one at a time per device
      (docs/cuda-graphs.md).

    Raises UnsupportedTorchError, leaving torch untouched, on a torch whose
    layout fxguard does not know.  Logs what it did on the "fxguard" logger.
    What it computes from torch's source is cached on disk (docs/how-it-works.md, "Install
    cost"), so a later process installs in a fraction of the time.
    """
    global _installed
    chosen = _chosen(block_mask_lock=block_mask_lock, config_window_lock=config_window_lock,
                     eager_backward=eager_backward, config_follows_thread=config_follows_thread,
                     compile_once=compile_once, concurrent_compiles=concurrent_compiles,
                     rng_not_rewound=rng_not_rewound,
                     cuda_graphs_per_thread=cuda_graphs_per_thread)
    # torch is imported outside the lock: with FXGUARD=1 the start-up hook
    # installs as torch finishes importing, in this very thread.
    import torch  # noqa: F401
    with _lock:
        _sweep_locked()
        previous = None if _installed is None else _installed.options
        if previous == chosen:
            return status()
        _refuse_inside_trace("install")  # before any change
        try:
            return _install_locked(chosen)
        except BaseException:
            import_watch.prune()  # what an interrupt in planning's way out left
            if previous is not None and _installed is None:  # refused: keep the earlier install
                try:
                    _install_locked(previous)
                except Exception:  # noqa: BLE001 - the first error is the one to raise
                    log.exception("fxguard: could not put the earlier install back")
            raise


def _install_locked(chosen: Options) -> dict:
    """install() with the lock held: the plan for ``chosen`` applied (what was
    installed before uninstalled first)."""
    global _installed
    if _installed is not None or originals.applied():  # what an interrupt left, too
        _uninstall_locked(core_off=False)  # the same slots: threads keep their records
    mark = len(originals.applied())
    try:
        facts, plan = _prepare(chosen)  # raises before touching torch
        workers = _apply(plan, facts.layout)
        # A trace another thread began while this one planned: torch's code
        # (retired now) sets the flag back in the module, not in its thread's slot.
        _refuse_inside_trace("install", stock_only=True)
        _installed = Installed(chosen, workers, dict(code_cache.last), facts, plan.later)
    except BaseException:  # also an interrupt after _apply: all of it or nothing
        originals.revert_all(settle.live, settle.names_in_use, _stand_in, down_to=mark)
        _installed = None
        _sweep_locked()  # the core goes off unless uninstall() left names for frames
        raise
    _watch(plan.later)
    _log_installed(_installed.rows)
    _catch_up_locked()  # a module imported by another thread while this one planned
    _sweep_later()
    return status()


def _apply(plan: Any, layout: str | None = None) -> str:
    """The one path that installs a Plan: its up-front calls, the C core
    configured for its slots (``layout``: a first install) or grown by them
    (rows applied on import), its changes, the installing thread's values.
    All or nothing: on any failure what it changed is reverted, and it raises.
    Returns how records reach autograd workers (status()'s autograd_workers)."""
    mark = len(originals.applied())
    for register in plan.up_front:  # what torch itself would do lazily, never undone
        register()
    try:
        # The core first: rewritten code reads its slots as soon as it is live.
        if layout is not None:
            carried, workers, fresh = _configure_core(layout, plan.defaults, plan.carry_context)
        else:
            if plan.carry_context and not _core_config[3]:
                raise RuntimeError("a row applied on import carries the thread's Context, "
                                   "which the core was configured without")
            _core._extend_layout(*plan.defaults)
            _extended(plan.defaults)
            carried, workers, fresh = False, "", True
        originals.apply_all(plan.changes, settle.live, settle.names_in_use)
        for module, name, value in plan.initial:  # this thread's own state (Planner.initial)
            if fresh:  # else the core kept every thread's record: this one's is its own
                setattr(vars(module)[codegen.TLS], name, value)
            if value is None or type(value) in (bool, int, str):
                # uninstall() puts back this thread's own value, not another
                # thread's that the process-wide global held at install()
                originals.restore_to(module, name, value)
        if carried:  # records go to torch's thread-locals
            _wait_for_exiting_threads_at_exit()
    except BaseException:
        originals.revert_all(settle.live, settle.names_in_use, _stand_in, down_to=mark)
        raise
    return workers


def _prepare(chosen: Options, later: Any = None) -> tuple[Any, Any]:
    """The plan.  Rows whose torch module is not imported yet wait for it
    (install on import), except with concurrent_compiles, whose rows are
    planned together: install() then imports what they change, as before."""
    from .torch_support import facts, prepare
    with code_cache.session():
        found = facts.detect() if later is None else _installed.facts
        if chosen.concurrent_compiles:
            return found, prepare.prepare(found, chosen, later)
        with import_watch.no_imports("torch"):
            return found, prepare.prepare(found, chosen, later)


def _watch(later: Any) -> None:
    """Watch imports of torch's modules while rows wait for one, and reloads of
    the modules fxguard changed."""
    _watcher.wanted = set(later.waiting)
    _watcher.patched = _patched_modules()
    if later.waiting or _watcher.patched:
        _watcher.start()
    else:
        _watcher.stop()


def _patched_modules() -> set[str]:
    names = set()
    for patch in originals.applied():
        owner = patch.owner
        name = owner.__name__ if isinstance(owner, types.ModuleType) else getattr(owner, "__module__", None)
        if isinstance(name, str) and name.split(".")[0] == "torch":
            names.add(name)
    return names


def _reloaded(name: str) -> None:
    """importlib.reload of a module fxguard changed ran its source again: stock
    functions and globals are back in it, while the functions its earlier run
    defined (which other modules imported by name) still run fxguard's code.
    Install again with the same options, over both (per_thread_globals.RELOADED);
    if that fails, fxguard stands down (a WARNING; status() says not-installed)."""
    if not _lock.acquire(blocking=False):
        log.warning("fxguard: %s was reloaded while install() or uninstall() ran; "
                    "call fxguard.uninstall() and install() again", name)
        return
    try:
        if _installed is None:
            return
        options = asdict(_installed.options)
        per_thread_globals.RELOADED.add(name)
        _uninstall_locked(core_off=False)
    finally:
        _lock.release()
    try:
        install(**options)
    except Exception as e:
        log.warning("fxguard: %s was reloaded and installing again failed (%s: %s); fxguard "
                    "stood down (status() says not-installed)", name, type(e).__name__, e)
        return
    log.warning("fxguard: %s was reloaded; fxguard installed again over its new functions", name)


def _apply_waiting() -> None:
    """A module rows waited for was imported (import_watch.Watcher, from inside
    the outermost import, before it returns): plan and apply those rows now.
    If install() or uninstall() holds the lock, it catches up when done (waiting
    here could deadlock: this thread holds the import's module lock)."""
    if _lock.acquire(blocking=False):
        try:
            _catch_up_locked()
        finally:
            _lock.release()


def _catch_up_locked() -> None:
    for _ in range(8):  # each round applies what arrived; a new import may bring more
        if _installed is None or not _installed.later.waiting:
            return
        if not _watcher.settled() and not _imported_meanwhile(_installed.later.waiting):
            return
        _apply_waiting_locked()


def _imported_meanwhile(modules: Any) -> bool:
    """One of these was imported (completely) while the watcher did not look."""
    return any(not getattr(getattr(sys.modules.get(name), "__spec__", None), "_initializing", True)
               for name in modules)


def _apply_waiting_locked() -> None:
    """Never raises into the import, except an interrupt: a failure stands the
    rows down (logged) and leaves what was applied before."""
    later = _installed.later
    waiting, before = sorted(later.waiting), later.checkpoint()
    try:
        _, plan = _prepare(_installed.options, later)
        _apply(plan)
    except BaseException as e:
        log.error("fxguard: could not apply the rows waiting for %s (%s: %s); they stand "
                  "down", ", ".join(waiting), type(e).__name__, e)
        later.stand_down(before, "applying it on import of {} failed")
        _watch(later)
        if not isinstance(e, Exception):
            raise
        return
    _watch(later)
    _log_installed(plan.rows, later=True)


def _chosen(who: str = "install", **options: Any) -> Options:
    """Every option, checked: unknown names and non-bools are TypeErrors."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"{who}() got an unexpected keyword argument {unknown[0]!r}")
    chosen = Options(**options)
    for name in OPTIONS:
        value = getattr(chosen, name)
        if type(value) is not bool:  # 1, 0.0, "no", numpy.bool_: say so, do not guess
            raise TypeError(f"{who}(): {name} must be True or False, not {value!r}")
    return chosen


def _log_installed(rows: list[Row], later: bool = False) -> None:
    info = status()
    patched = [f"{r.what} {r.where}" for r in rows if r.patched]
    if later:
        log.info("fxguard: a torch module was imported: patched %s", "; ".join(patched) or "nothing")
    else:
        log.info("fxguard %s installed on torch %s (%s): patched %s", info["fxguard"],
                 info["torch"], info["mode"], "; ".join(patched) or "nothing")
    for r in rows:
        if r.outcome is Outcome.NOT_COVERED:
            log.warning("fxguard stood down for %s %s: %s", r.what, r.where, r.reason)


def _wait_for_exiting_threads_at_exit() -> None:
    """A thread that ends just before the process does destroys its C++
    thread-locals (holding its stashed record) while the interpreter
    finalizes, and torch's decref there aborts the process ("terminate called
    without an active exception"; seen on torch 2.11 and 2.13).  An exit
    handler, which runs after threading joined its threads and before
    finalization, waits (up to 2 s, GIL released) until they have let go."""
    from .machinery import process_hooks
    process_hooks.at_exit(_core._await_thread_exits, 2.0)  # once, however often installed


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


_core_config: tuple | None = None  # what the core was configured with, while it is


def _configure_core(layout: str, defaults: tuple[tuple, tuple],
                    carry_context: bool) -> tuple[bool, str, bool]:
    """Hand the C core the slot layout and the torch functions it may call.
    A core already configured alike keeps every thread's record: a thread
    inside a with-block over install() with other options keeps its values.
    Returns _workers()' two and whether the records start again (configured anew)."""
    global _core_config
    mode, hooks = _core_hooks(layout)
    # A hook reloaded since (torch.compiler.is_compiling) is the same function again.
    named = {k: (v.__module__, v.__qualname__) if isinstance(v, types.FunctionType) else v
             for k, v in hooks.items()}
    wanted = (mode, defaults[0], defaults[1], carry_context, named)
    fresh = _core_config != wanted or _core._mode() != mode
    if fresh:
        _core._configure(mode, defaults=defaults[0], factories=defaults[1],
                         carry_context=carry_context, **hooks)
        _core_config = wanted
    return (*_workers(mode, hooks), fresh)


def _extended(defaults: tuple[tuple, tuple]) -> None:
    """The core's layout grew (rows applied on import)."""
    global _core_config
    if _core_config is not None:
        mode, old_defaults, old_factories, carry, hooks = _core_config
        _core_config = (mode, old_defaults + defaults[0], old_factories + defaults[1], carry, hooks)


def _core_off() -> None:
    global _core_config
    _core._configure(_core.MODE_OFF)
    _core_config = None


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
        facts, plan = _prepare(chosen)
    mode, hooks = _core_hooks(facts.layout)
    return {**status(), "mode": _MODES[mode], "layout": facts.layout, "options": asdict(chosen),
            "patch_points": [r.as_dict() for r in plan.rows],
            "autograd_workers": _workers(mode, hooks)[1],
            "concurrent_compiles": _concurrent_status(chosen, plan.later, facts),
            "code_cache": dict(code_cache.last), "preview": True,
            "waiting": {module: [r.where for r in rows]
                        for module, rows in sorted(plan.later.waiting.items())},
            "note": "what install() would do on this torch; nothing was changed"}


def uninstall() -> None:
    """Restore torch exactly as it was: same objects, same code, same module attributes.

    Idempotent.  Raises RuntimeError (and changes nothing) while a thread is
    inside an FX trace, since that trace's code is the patched code.
    """
    with _lock:
        _uninstall_locked()
        _sweep_locked()
        _sweep_later()


def _uninstall_locked(core_off: bool = True) -> None:
    """Revert every change.  The core keeps the threads' records while a frame
    of rewritten code can still read them (its with-block goes on with its
    thread's values; the sweep turns the core off after), and across an
    install() with other options (whose slots are the same ones)."""
    global _installed
    if _installed is None and not originals.applied():  # (an interrupt can leave changes alone)
        return
    from .torch_support import trace_state
    # The FX flag's records (the patched mode), and the frames: with torch's own
    # per-thread flag (2.14+) a trace still reads the slots made per thread
    # (its patcher, make_fx's tracer, the pre-dispatch mode stack).
    busy = _core._tracing_records() if _core._mode() == _core.MODE_PATCHED else 0
    names = trace_state.threads_in_trace()
    if busy or names:
        raise RuntimeError(f"fxguard.uninstall(): {max(busy, len(names))} thread(s) are inside "
                           f"an FX trace{' (' + ', '.join(names) + ')' if names else ''}; "
                           "uninstall after they finish")
    _watcher.stop()
    originals.revert_all(settle.live, settle.names_in_use, _stand_in)
    _installed = None
    if core_off and not _kept():
        _core_off()


def _refuse_inside_trace(who: str, stock_only: bool = False) -> None:
    """install() while a thread is inside an FX trace: that trace's frames set
    the FX flag (and the trace state around it) back where their code says,
    torch's process-wide global, never the thread's slot, which would stay set
    for good.  Refused, naming the threads; nothing was changed."""
    from .torch_support import trace_state
    names = trace_state.threads_in_trace(stock_only)
    if names:
        raise RuntimeError(f"fxguard.{who}(): {len(names)} thread(s) are inside an FX trace "
                           f"({', '.join(names)}); {who} after they finish (nothing was changed)")


def _stand_in(patch: originals.Patch) -> Any:
    """What a name fxguard added stays bound to after uninstall() while a frame
    of its code can still read it: a module's view stays (the core keeps that
    thread's record until the sweep), a reader's namespace becomes the
    function itself, stock again; anything else keeps working as it was."""
    if isinstance(getattr(patch.value, "__self__", None), _core.Reader):
        # A reader's namespace: the function itself, stock again, answers as stock.
        for value in vars(patch.owner).values():
            if isinstance(value, types.FunctionType) and codegen.namespace_name(value) == patch.attr:
                return value
    return patch.value


def _sweep_locked() -> None:
    originals.sweep(settle.names_in_use)
    if _installed is None and not _kept():
        _core_off()


def _kept() -> bool:
    """Names uninstall() left bound wait for frames (deferred deletions do not
    need the core)."""
    return any(not item.deletion for item in originals.held())


_sweeper: threading.Thread | None = None


def _sweep_later() -> None:
    """While names wait for frames of retired code (a thread parked in a torch
    function, a with-body's generator), a daemon thread finishes the job once
    they moved on: it exits as soon as nothing waits."""
    global _sweeper
    if not originals.held() or (_sweeper is not None and _sweeper.is_alive()):
        return

    def sweep() -> None:
        delay = 0.001
        while True:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
            with _lock:
                _sweep_locked()
                if not originals.held():
                    return

    _sweeper = threading.Thread(target=sweep, name="fxguard-sweep", daemon=True)
    _sweeper.start()


def is_installed() -> bool:
    return _installed is not None


def status() -> dict:
    """This process: torch version, mode, and each row of the plan with its
    outcome and reason (``patched``, ``waiting for <module>``, ``option off``,
    ``not needed: ...``, ``not available on this torch``, ``not covered: ...``);
    ``waiting``: the torch modules not imported yet whose rows are applied when
    they are."""
    torch = sys.modules.get("torch")
    info: dict[str, Any] = {
        "fxguard": __version__,
        "torch": getattr(torch, "__version__", None),
        "python": sys.version.split()[0],
        "mode": _MODES[_core._mode()] if _installed is not None else _MODES[_core.MODE_OFF],
        "layout": None,
        "options": None,
        "patch_points": [],
        "autograd_workers": None,
        "code_cache": None,
        "compile_once": None,
        "concurrent_compiles": None,
        "waiting": {},  # module -> the rows applied when it is imported (install on import)
        "interpreter": interpreter.report(),
    }
    if _installed is not None:
        info.update(layout=_installed.facts.layout, options=asdict(_installed.options),
                    patch_points=[r.as_dict() for r in _installed.rows],
                    autograd_workers=_installed.workers, code_cache=dict(_installed.code_cache),
                    concurrent_compiles=_concurrent_status(_installed.options, _installed.later,
                                                           _installed.facts),
                    waiting={module: [r.where for r in rows]
                             for module, rows in sorted(_installed.later.waiting.items())})
        once = _installed.later.provided.get("compile_once")
        if once is not None:  # {"compiles_avoided": n, "waits": n}
            info["compile_once"] = once.counters()
    return info


def _concurrent_status(options: Options, later: Any, found: Any) -> dict[str, Any]:
    """Option concurrent_compiles: on or off, whether its stress suite was run on
    this torch (``found``: its TorchFacts), and which of its rows apply here."""
    from .torch_support import facts
    rows = later.option_rows(Option.CONCURRENT_COMPILES)
    on = options.concurrent_compiles
    return {"enabled": on, "stress_tested": facts.concurrent_compiles_stress_tested(found),
            "tested": facts.concurrent_compiles_tested(found),
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
