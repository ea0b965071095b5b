"""Torch config per thread: snapshots, and config that follows threads and backward.

Since torch 2.12 every override of a config module built on
``torch.utils._config_module`` (``torch._dynamo.config``,
``torch._inductor.config``, ``torch._functorch.config``, ...) lives in a
ContextVar, one per entry.  A ``threading.Thread`` on Python 3.10-3.13 (and
3.14 without ``-X thread_inherit_context``) starts with an empty context, so
a thread reads torch's defaults whatever its starter set: main sets
``recompile_limit = 64``, a thread stops compiling after 8 graphs.

With fxguard installed, ``Thread.start()`` hands the new thread its
starter's context (``copy_context()``: the values as of start()), and the new
thread sets the torch config entries found there before start() returns and
before ``run()`` (subclasses overriding run() or start() included): a copy,
so later changes in either thread stay in that thread.  Threads started
before install() keep what they had.  Cost: a few microseconds per start
(benchmarks/thread_start.py).
Only the entries' ``user_override`` ContextVars are copied; torch's per-thread
caches (``_hash_dirty_var``, ``_get_dict_cache_var``, ...) start fresh, and
every other ContextVar (decimal, asyncio, user code) keeps Python's
behaviour.  Lists, dicts and sets are deep-copied, as torch copies its
defaults; other values (custom passes, callables) are shared by reference.

Which config modules count is found from torch: the ``ConfigModule``
instances in ``sys.modules`` (scanned once after install(), ~50 us for ~1100
modules), plus each module ``install_config_module`` converts later (its code
is wrapped to register the module).

Thread pools: a ``ThreadPoolExecutor`` starts its workers lazily, inside
``submit()``, so a worker inherits the config of the thread whose submit()
started it, as it was then, and keeps it for every later task, whichever
thread submits that task.  To choose explicitly::

    snap = fxguard.config_snapshot()                        # this thread's overrides, now
    pool = ThreadPoolExecutor(initializer=snap.apply)        # every worker starts with them
    pool.submit(snap.run, fn, x)                             # or: one task runs with them

``config_snapshot()`` works with or without install().

Autograd workers: a device's worker thread (and the pool that takes over
reentrant backward deeper than 60) runs backward nodes for every thread, in
its own empty context.  A thread's record, published when it starts a
backward and carried by torch into the worker with the graph task, notes the
thread's Context; the worker runs each
Python backward node (``BackwardCFunction.apply``: custom Functions, compiled
graphs' backward and its lazy compile) with that thread's torch config
overrides, as they are when the node runs, in a copy of its own context.
"""
from __future__ import annotations

import contextvars
import copy
import sys
import threading
import types
import warnings
from typing import Any, Callable

CONFIG_MODULE = "torch.utils._config_module"
THREAD_ATTR = "_fxguard_config"  # where Thread.start() leaves its context for the new thread
copy_context = contextvars.copy_context  # what Thread.start() calls (config_follows_thread.THREAD_START)

_COPIED = (list, dict, set)  # mutable values a thread gets its own deep copy of

# ContextVar (an entry's user_override) -> the ConfigModule it belongs to
_vars: dict[contextvars.ContextVar, types.ModuleType] = {}
_registry_lock = threading.Lock()
_scan_needed = True  # scan once after install_config_module's hook is in place (rescan_later)


# -- which ContextVars are torch config -------------------------------------------

def register(module: Any) -> None:
    """Add a converted config module's entries (install_config_module calls this once installed)."""
    found = {}
    for entry in getattr(module, "_config", {}).values():
        var = getattr(entry, "user_override", None)
        if isinstance(var, contextvars.ContextVar):
            found[var] = module
    with _registry_lock:
        _vars.update(found)


def rescan_later() -> None:
    """The next thread start (or snapshot) scans sys.modules again first."""
    global _scan_needed
    _scan_needed = True


def scan() -> list[types.ModuleType]:
    """Register every ConfigModule in sys.modules; returns them."""
    global _scan_needed
    _scan_needed = False
    cm = sys.modules.get(CONFIG_MODULE)
    if cm is None:
        return []
    base = cm.ConfigModule
    modules = [m for m in list(sys.modules.values()) if isinstance(m, base)]
    for m in modules:
        register(m)
    return modules


# -- snapshots ---------------------------------------------------------------------

_UNSET: Any = None  # torch's _UNSET_SENTINEL, once torch is imported


def _unset() -> Any:
    global _UNSET
    if _UNSET is None:
        _UNSET = getattr(sys.modules.get(CONFIG_MODULE), "_UNSET_SENTINEL", None)
    return _UNSET


_SCALARS = frozenset({int, float, bool, str, bytes, type(None)})


def _own(value: Any) -> Any:
    """The copy a thread gets: containers deep-copied, anything else as is.
    A plain list/set/dict of scalars (torch's usual) is copied without
    copy.deepcopy, which costs ~7 us in a thread's first moments."""
    if not isinstance(value, _COPIED):
        return value
    kind = type(value)
    if kind is dict:
        if all(type(v) in _SCALARS for v in value.values()):
            return value.copy()
    elif kind is list or kind is set:
        if all(type(v) in _SCALARS for v in value):
            return value.copy()
    try:
        return copy.deepcopy(value)
    except Exception:  # an uncopyable element: share it, as Python 3.14 would
        return value


def _take(copy_values: bool) -> list[tuple[contextvars.ContextVar, Any]]:
    """The calling thread's torch config overrides as (ContextVar, value) pairs."""
    known, unset = _vars, _UNSET if _UNSET is not None else _unset()
    pairs = [(var, value) for var, value in contextvars.copy_context().items()
             if var in known and value is not unset]
    if copy_values:
        copied = _COPIED
        for i, (var, value) in enumerate(pairs):
            if isinstance(value, copied):
                pairs[i] = (var, _own(value))
    return pairs


def _set(pairs, clear: bool = False, copy_values: bool = False, fresh: bool = False) -> None:
    """Set the pairs in the current context and mark the touched modules' caches
    stale (not needed in a ``fresh`` context: its caches are unset, i.e. stale).
    With ``clear``, overrides not in ``pairs`` are unset."""
    if fresh:  # a new thread's context: nothing to clear, no caches filled yet
        for var, value in pairs:
            var.set(value)
        return
    known = _vars
    touched = set()
    if clear:
        unset, wanted = _unset(), {var for var, _ in pairs}
        for var, value in contextvars.copy_context().items():
            if var in known and var not in wanted and value is not unset:
                var.set(unset)
                touched.add(known[var])
    for var, value in pairs:
        var.set(_own(value) if copy_values else value)
        touched.add(known[var])
    for module in touched:  # torch's per-context caches of get_hash() and _get_dict()
        dirty = getattr(module, "_hash_dirty_var", None)
        if dirty is not None:
            dirty.set(True)
        elif "_is_dirty" in vars(module):
            module._is_dirty = True  # torch 2.12: one hash cache for the process
        dirty_keys = getattr(module, "_get_dict_dirty_keys_var", None)
        if dirty_keys is not None:
            dirty_keys.set(None)  # None: fully dirty


class ConfigSnapshot:
    """One thread's torch config overrides, frozen when taken.

    ``apply()`` makes the calling thread's torch config equal to the snapshot
    (overrides the snapshot lacks are cleared): use it as a
    ``ThreadPoolExecutor(initializer=...)``.  ``run(fn, *args, **kwargs)``
    calls fn under the snapshot and then restores the calling thread's own
    config: use it per task, ``pool.submit(snap.run, fn, x)``.  Each thread
    gets its own copy of list/dict/set values.
    """
    __slots__ = ("_pairs",)

    def __init__(self, pairs: list[tuple[contextvars.ContextVar, Any]]):
        self._pairs = tuple(pairs)

    def apply(self) -> None:
        _set(self._pairs, clear=True, copy_values=True)

    def run(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
        before = _take(copy_values=False)  # this thread's own values, given back as they are
        self.apply()
        try:
            return fn(*args, **kwargs)
        finally:
            _set(before, clear=True)

    def overrides(self) -> dict[str, Any]:
        """{'torch._dynamo.config.recompile_limit': 20, ...}"""
        return {f"{_vars[var].__name__}.{var.name}": value for var, value in self._pairs}

    def __len__(self) -> int:
        return len(self._pairs)

    def __repr__(self) -> str:
        return f"<fxguard.ConfigSnapshot of {len(self._pairs)} torch config override(s)>"


def config_snapshot() -> ConfigSnapshot:
    """The calling thread's torch config overrides, now.  Does not import torch
    (without torch there is nothing to copy); needs no install()."""
    scan()  # config modules imported since the last look
    return ConfigSnapshot(_take(copy_values=True))


# -- the hooks the patched code calls ------------------------------------------------
#
# Thread.start() leaves the new thread its starter's context (copy_context()
# is O(1): an immutable mapping of the values as they are at start()); the new
# thread copies the torch config entries out of it first thing, in _bootstrap,
# before it signals that it has started, so the starter is still inside
# start() meanwhile and the values are exactly those of start().  Doing the
# filtering there, once, halves the cost of doing it in the starter.

def enter_thread(thread: threading.Thread) -> None:
    """Thread._bootstrap(), first thing in the new thread: take the starter's config.
    Never raises: start() waits for this thread to signal it has started."""
    parent = thread.__dict__.pop(THREAD_ATTR, None)
    if parent is None:
        return
    try:
        if _scan_needed:
            scan()
        context = thread.__dict__.get("_context")  # 3.14: run() executes in this Context
        if isinstance(context, contextvars.Context):
            context.run(_set, _from(parent))
        else:  # the new thread's own context, empty until now: no caches to mark stale
            known, unset, copied = _vars, _UNSET if _UNSET is not None else _unset(), _COPIED
            for var, value in parent.items():
                if var in known and value is not unset:
                    var.set(_own(value) if isinstance(value, copied) else value)
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"fxguard: thread {thread.name} starts without its starter's torch config: {e!r}",
                      RuntimeWarning, stacklevel=1)


def run_with_config_of(context: contextvars.Context, fn: Callable, /, *args: Any) -> Any:
    """On an autograd worker: call fn with the torch config overrides found in
    ``context`` (the Context of the thread whose backward this is), in a copy
    of the worker's own context, so nothing set here outlives the call."""
    if _carrying.get() is context:  # a nested backward inside such a node: as it is
        return fn(*args)
    if _scan_needed:
        scan()
    known, unset = _vars, _UNSET if _UNSET is not None else _unset()
    pairs = [(var, value) for var, value in context.items() if var in known and value is not unset]
    return contextvars.copy_context().run(_call_with, context, pairs, fn, args)


_carrying: contextvars.ContextVar = contextvars.ContextVar("fxguard.carrying", default=None)


def _call_with(context: contextvars.Context, pairs: list, fn: Callable, args: tuple) -> Any:
    _carrying.set(context)
    _set(pairs)  # also marks the touched modules' cached hashes stale (in this copy)
    return fn(*args)


def _from(parent: contextvars.Context) -> list:
    unset = _unset()
    return [(var, _own(value)) for var, value in parent.items() if var in _vars and value is not unset]


