"""Prototype rows for issue 23 (compiles overlap), as data, applied beside install().

NOT wired into ``fxguard.plan`` on purpose (the package is being restructured):
the lead lands these as rows afterwards.  Until then tests apply them with
``installed_with(...)``, which extends ``plan.PER_THREAD`` for one
``install()`` and applies the class-attribute and once-lock prototypes through
``fxguard.patches`` (so ``uninstall()`` reverts them with everything else).

- ``DISPATCH_MODE_FLAGS``: TorchDispatchMode's three module flags (default-on
  rows).  The C++ mirror ``set_is_in_mode_without_ignore_compile_internals``
  writes a C++ ``thread_local`` (every torch that has it, 2.10+): each thread
  mirrors its own Python value from its own __enter__/__exit__, so a Python
  row keeps the mirror right with no extra work.
- ``COMPILE_GLOBALS``: ``_dynamo.convert_frame.initial_global_state``.
- ``CLASS_ATTRS``: ``_inductor.ir.IRNode._current_origins`` (and
  ``_current_stream_idx``, 2.13+): class attributes swapped by a context
  manager; a descriptor gives each thread its value, the writers are rewritten.
- ``ONCE``: functools.cache'd one-time set-up in inductor/dynamo that two
  compiles at once run twice; each gets a once-lock (see ``once_lock_changes``).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from dataclasses import dataclass
from typing import Any, Callable

from fxguard import patches, plan, rewrite
from fxguard.per_thread import PerThread

LABEL = "overlap prototype"
DISPATCH = "torch.utils._python_dispatch"

DISPATCH_MODE_FLAGS: tuple[PerThread, ...] = (
    # writers: TorchDispatchMode.__enter__/__exit__ (save in per-instance deques,
    # set, restore); readers: is_in_torch_dispatch_mode(), and (2.9+)
    # is_in_any_mode_without_ignore_compile_internals().  No writer elsewhere.
    PerThread(DISPATCH, "_is_in_torch_dispatch_mode", False),
    PerThread(DISPATCH, "_is_in_non_infra_torch_dispatch_mode", False),
    PerThread(DISPATCH, "_is_in_any_mode_without_ignore_compile_internals", False),  # 2.9+
)

COMPILE_GLOBALS: tuple[PerThread, ...] = (
    # set (prev saved) and restored by ConvertFrameAssert.__call__; read by
    # OutputGraph.__init__ (as torch._dynamo.convert_frame.initial_global_state)
    # and CheckFunctionManager (convert_frame.initial_global_state): both module
    # attribute reads, which the PEP 562 hook serves per thread.
    PerThread("torch._dynamo.convert_frame", "initial_global_state", None),
)


@dataclass(frozen=True)
class ClassAttr:
    """A class attribute that code swaps (``Cls.attr = new`` ... ``= old``)
    for the length of a context: per thread, with its writers rewritten."""
    where: str                         # 'pkg.mod.Cls.attr'
    factory: Callable[[], Any]         # each thread's initial value
    writers: tuple[str, ...]           # 'pkg.mod.qualname' of the functions that assign it
    spelled: str                       # how the writers spell it: 'Cls.attr'


def _ordered_set() -> Any:
    from torch.utils._ordered_set import OrderedSet
    return OrderedSet()


CLASS_ATTRS: tuple[ClassAttr, ...] = (
    ClassAttr("torch._inductor.ir.IRNode._current_origins", _ordered_set,
              ("torch._inductor.ir.IRNode.current_origins",), "IRNode._current_origins"),
    ClassAttr("torch._inductor.ir.IRNode._current_stream_idx", lambda: None,  # 2.13+
              ("torch._inductor.ir.IRNode.current_stream_idx",), "IRNode._current_stream_idx"),
)


class ThreadValue:
    """Class-attribute descriptor: ``Cls.attr`` and ``obj.attr`` give the
    calling thread's value (``Cls.attr = v`` on the class would replace the
    descriptor, so the writers go through ``set`` instead)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory, self.local = factory, threading.local()

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        try:
            return self.local.value
        except AttributeError:
            self.local.value = self.factory()
            return self.local.value


class ClassAttrView:
    """What the rewritten writers read and assign: ``view.<attr>``."""

    def __init__(self, values: dict[str, ThreadValue]) -> None:
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        return self._values[name].__get__(None)

    def __setattr__(self, name: str, value: Any) -> None:
        self._values[name].local.value = value


CLASS_VIEW = "__fxguard_class_view__"


def class_attr_changes() -> list[tuple[str, object, str, Any]]:
    changes: list[tuple[str, object, str, Any]] = []
    views: dict[str, dict[str, ThreadValue]] = {}
    for row in CLASS_ATTRS:
        try:
            owner, name, current = patches.resolve_path(row.where)
        except (ImportError, AttributeError):
            continue
        if name not in vars(owner):
            continue  # not available on this torch
        value = ThreadValue(row.factory)
        for path in row.writers:
            fn = _function(path)
            code, count = rewrite.redirect(fn, (), CLASS_VIEW, {row.spelled: name})
            if count == 0:
                raise RuntimeError(f"{path} no longer assigns {row.spelled}")
            views.setdefault(fn.__module__, {})[name] = value
            changes.append((LABEL, fn, "__code__", code))
        changes.append((LABEL, owner, name, value))
    for module, values in views.items():
        changes.insert(0, (LABEL, importlib.import_module(module), CLASS_VIEW, ClassAttrView(values)))
    return changes


def _function(path: str) -> Any:
    owner, name, fn = patches.resolve_path(path)
    fn = getattr(fn, "__func__", fn)
    while not hasattr(fn, "__code__") or "__wrapped__" in vars(fn):  # contextmanager
        fn = fn.__wrapped__
    return fn


# -- one-time set-up: once-locks ---------------------------------------------------

@dataclass(frozen=True)
class Once:
    """A ``functools.cache``'d (or lru_cache'd) function of no arguments that
    registers or fills something process-wide the first time it runs."""
    where: str


ONCE: tuple[Once, ...] = (
    Once("torch._inductor.pattern_matcher.init_once_fakemode"),  # wraps the ones below
    Once("torch._inductor.fx_passes.joint_graph.lazy_init"),
    Once("torch._inductor.fx_passes.post_grad.lazy_init"),
    Once("torch._inductor.fx_passes.pre_grad.lazy_init"),
    Once("torch._inductor.fx_passes.fuse_attention._sfdp_init"),
    Once("torch._inductor.fx_passes.pad_mm._pad_mm_init"),
    Once("torch._inductor.fx_passes.misc_patterns._misc_patterns_init"),
    Once("torch._inductor.fx_passes.b2b_gemm.b2b_gemm_init"),   # not every torch
    Once("torch._inductor.fx_passes.bucketing.init_bucketing"),  # not every torch
    Once("torch._inductor.fx_passes.quantization._register_quantization_weight_pack_pass"),
)

# One lock for every once-initialiser: they call each other (init_once_fakemode
# wraps lazy_init), so a re-entrant lock; one lock, not one per function, so
# two threads entering them in different orders cannot deadlock.
ONCE_LOCK = threading.RLock()

ONCE_BODY = """\
    with __fxguard_once__:
        return __fxguard_once_inner__({call})
"""


def once_lock_changes() -> list[tuple[str, object, str, Any]]:
    """For each cached initialiser found: its cache wrapper is swapped for one
    that takes ONCE_LOCK around the cached call, so the first call runs the body
    exactly once and every other caller waits for it and gets its result.
    (The cache object itself is kept inside, so cache_clear() still works.)"""
    changes = []
    for row in ONCE:
        try:
            owner, name, cached = patches.resolve_path(row.where)
        except (ImportError, AttributeError):
            continue
        if not hasattr(cached, "cache_info"):
            continue  # not cached on this torch: not a once-initialiser

        @functools.wraps(cached)
        def locked(*args: Any, __cached: Any = cached, **kwargs: Any) -> Any:
            info = __cached.cache_info()
            if info.currsize:  # done already: no lock on the hot path
                return __cached(*args, **kwargs)
            with ONCE_LOCK:
                return __cached(*args, **kwargs)

        locked.cache_info = cached.cache_info  # type: ignore[attr-defined]
        locked.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        changes.append((LABEL, owner, name, locked))
    return changes


# -- applying them (tests only, until the lead lands them as rows) -----------------

@contextlib.contextmanager
def installed_with(per_thread: tuple[PerThread, ...] = (), class_attrs: bool = False,
                   once_locks: bool = False, **options: bool):
    """fxguard.install() with extra PerThread rows (and the prototypes); uninstalled after."""
    import fxguard
    saved = plan.PER_THREAD
    plan.PER_THREAD = saved + tuple(per_thread)
    try:
        info = fxguard.install(**options)
    finally:
        plan.PER_THREAD = saved
    try:
        extra = (class_attr_changes() if class_attrs else []) + \
            (once_lock_changes() if once_locks else [])
        for change in extra:
            patches.apply_patch(*change)
        yield info
    finally:
        fxguard.uninstall()
