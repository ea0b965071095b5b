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
import importlib
import threading
import types
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
    descriptor, so the writers go through ``ClassAttrView`` instead)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.factory, self.local = factory, threading.local()

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        try:
            return self.local.value
        except AttributeError:
            self.local.value = self.factory()
            return self.local.value


class ThreadInstanceValue(ThreadValue):
    """Data descriptor for an attribute that code assigns on an instance
    (``self.stack = ...``): reads and writes through any instance are the
    calling thread's; the instance's own ``__dict__`` entry is shadowed."""

    def __set__(self, obj: Any, value: Any) -> None:
        self.local.value = value


@dataclass(frozen=True)
class InstanceAttr:
    """An attribute of a process-wide singleton that one compile sets and reads back."""
    where: str                         # 'pkg.mod.Cls.attr'
    factory: Callable[[], Any]


INSTANCE_ATTRS: tuple[InstanceAttr, ...] = (
    # dynamo's torch_function_mode_stack_state_mgr (one instance for the
    # process, 2.6+): __enter__ saves the compiling thread's torch-function
    # mode stack in .stack and clears it, OutputGraph reads .stack as the
    # modes to trace, __exit__ pushes .stack back.  Two compiles at once: one
    # traces with, and its thread ends up with, the other thread's modes.
    InstanceAttr("torch._dynamo.variables.torch_function.TorchFunctionModeStackStateManager.stack",
                 list),
)


def instance_attr_changes() -> list[tuple[str, object, str, Any]]:
    changes = []
    for row in INSTANCE_ATTRS:
        try:
            owner, name, _ = patches.resolve_path(row.where.rsplit(".", 1)[0])
            cls = getattr(owner, name)
        except (ImportError, AttributeError):
            continue
        attr = row.where.rsplit(".", 1)[1]
        if isinstance(cls, type):
            changes.append((LABEL, cls, attr, ThreadInstanceValue(row.factory)))
    return changes


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
    """One-time set-up that registers or fills something process-wide: a
    ``functools.cache``'d function (``memo``: the cache decides "first call",
    and two threads that both miss it both run the body), or a plain function
    that guards itself with a check-then-fill (``memo=False``: it only needs
    the lock around its whole body)."""
    where: str
    memo: bool = True


ONCE: tuple[Once, ...] = (
    # pattern registration ("Duplicate pattern" when run twice)
    Once("torch._inductor.fx_passes.joint_graph.lazy_init"),  # init_once_fakemode
    Once("torch._inductor.fx_passes.post_grad.lazy_init"),
    Once("torch._inductor.fx_passes.pre_grad.lazy_init"),
    Once("torch._inductor.fx_passes.freezing_patterns.lazy_init"),
    Once("torch._inductor.fx_passes.fuse_attention._sfdp_init"),
    Once("torch._inductor.fx_passes.pad_mm._pad_mm_init"),
    Once("torch._inductor.fx_passes.misc_patterns._misc_patterns_init"),
    Once("torch._inductor.fx_passes.freezing_patterns.freezing_passes_init"),  # older name
    Once("torch._inductor.fx_passes.binary_folding.binary_folding_init"),
    Once("torch._inductor.fx_passes.mkldnn_fusion._mkldnn_fusion_init"),
    Once("torch._inductor.fx_passes.mkldnn_fusion._mkldnn_weight_pack_init"),
    Once("torch._inductor.fx_passes.quantization._register_quantization_weight_pack_pass"),
    Once("torch._inductor.fx_passes.b2b_gemm.b2b_gemm_init"),
    Once("torch._inductor.fx_passes.micro_pipeline_tp._micro_pipeline_tp_init"),
    Once("torch._inductor.fx_passes.freezing_patterns.addmm_patterns_init"),
    # device codegen registration, the autotuning subprocess pool
    Once("torch._inductor.codegen.common.init_backend_registration"),
    Once("torch._inductor.codegen.common._init_builtin_backend_registration"),  # 2.15
    Once("torch._inductor.autotune_process.get_tuning_process_pool"),
    Once("torch._inductor.autotune_process.get_tuning_thread_pool"),  # 2.15
    # dynamo: `if len(MAP) > 0: return`, then fills it entry by entry (2.9+):
    # a second thread returns early and reads a half-filled map (KeyError: and_)
    Once("torch._dynamo.variables.builtin.populate_builtin_to_tensor_fn_map", memo=False),
)

ONCE_HELPER = "__fxguard_once__"


class OnceHelper:
    """What the rewritten set-up functions call.  One re-entrant lock for all
    of them: they call each other (joint_graph's lazy_init runs _sfdp_init,
    ...), and one lock cannot be taken in two orders.  Held only by a thread
    running a set-up body: a set-up done once is a cache hit, which never
    reaches this (functools.cache answers first)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.bodies: list[Any] = []     # index -> the original function (a shadow)
        self.memo: list[bool] = []
        self.done: dict[tuple, Any] = {}

    def add(self, body: Any, memo: bool) -> int:
        self.bodies.append(body)
        self.memo.append(memo)
        return len(self.bodies) - 1

    def __call__(self, index: int, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            if not self.memo[index]:
                return self.bodies[index](*args, **kwargs)
            key = (index, args, tuple(sorted(kwargs.items())))
            if key in self.done:  # another thread ran it while this one waited
                return self.done[key]
            result = self.done[key] = self.bodies[index](*args, **kwargs)
            return result


def once_lock_changes() -> list[tuple[str, object, str, Any]]:
    """Each set-up function found keeps its identity (module attributes,
    ``from ... import`` aliases and the functools.cache wrapper all stay):
    the Python function the cache calls gets code that runs its original body
    under ONCE's lock, once per arguments."""
    helper, changes, modules = OnceHelper(), [], {}
    for row in ONCE:
        try:
            _, _, found = patches.resolve_path(row.where)
        except (ImportError, AttributeError):
            continue  # not on this torch
        cached = hasattr(found, "cache_info")
        if cached != row.memo:
            continue  # not the shape this row describes on this torch
        fn = found.__wrapped__ if cached else found
        if not isinstance(fn, types.FunctionType):
            continue
        index = helper.add(patches.shadow_function(fn), row.memo)
        body = f"    return {ONCE_HELPER}({index}, {{call}})\n"
        modules[id(fn.__globals__)] = fn.__globals__  # init_once_fakemode's: pattern_matcher's
        changes.append((LABEL, fn, "__code__", patches.wrapper_code(fn, body)))
    return [(LABEL, globals_, ONCE_HELPER, helper) for globals_ in modules.values()] + changes


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
        extra = (class_attr_changes() + instance_attr_changes() if class_attrs else []) + \
            (once_lock_changes() if once_locks else [])
        for change in extra:
            patches.apply_patch(*change)
        yield info
    finally:
        fxguard.uninstall()
