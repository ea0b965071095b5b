"""The torch patch plan: what fxguard changes in torch, where, and how it is undone.

Read ``PLAN`` at the bottom first: one row per patch point.  Every row turns
into ``patches.Patch`` records (owner, attribute, saved original), so
uninstall() is the same list played backwards.  Functions keep their identity:
only their ``__code__`` changes, because compiled functions (compile_wrapper's
closure), dynamo's tables and ``from ... import`` aliases hold the objects.

Replacement code reaches fxguard through one name, ``__fxguard__``, added to
the globals of each module whose functions are rewritten: a small module
object holding the C core's functions and the saved originals.
"""
from __future__ import annotations

import importlib
import inspect
import types
from dataclasses import dataclass
from typing import Any, Callable

from . import _core, patches

FLAG = "_is_fx_tracing_flag"
FLAG_MODULE = "torch.fx._symbolic_trace"
SCRATCH_FLAG = "__fxguard_scratch_flag__"  # where Tracer.trace's own save/restore now lands

# Layouts of torch's FX-tracing state that fxguard knows.
MODULE_GLOBAL = "module-global"       # torch <= 2.13: one bool for the process
UPSTREAM = "upstream-thread-local"    # torch >= 2.14: threading.local behind _get/_set_is_fx_tracing


class UnsupportedTorchError(RuntimeError):
    """install() found a torch it does not know; nothing was patched."""


# -- replacement bodies ({call} passes the function's own parameters on) -----

IS_FX_TRACING = """\
    is_fx_tracing_warning()
    return __fxguard__.is_fx_tracing()
"""

IS_FX_SYMBOLIC_TRACING = """\
    return __fxguard__.is_fx_symbolic_tracing()
"""

TRACE = """\
    with __fxguard__.fx_tracing(True):
        return __fxguard__.original({call})
"""

# Dynamo compiles serialise on compile_lock; holding it for the window in
# which _set_compilation_env flips process-global dynamo config keeps every
# other thread's compile out of that window.
SET_COMPILATION_ENV = """\
    with __fxguard__.compile_lock:
        yield from __fxguard__.original({call})
"""

# Inside torch.compile the lock is skipped (dynamo folds is_compiling() to
# True and inlines the original), so fullgraph compiles see no graph break.
CREATE_BLOCK_MASK = """\
    if __fxguard__.is_compiling():
        return __fxguard__.original({call})
    with __fxguard__.block_mask_lock:
        return __fxguard__.original({call})
"""


# -- how each row is done ------------------------------------------------------

Change = tuple[str, object, str, Any]  # (label, owner, attribute, new value)


@dataclass
class Context:
    """What preparing the plan collects before anything is applied."""
    helpers: dict[str, types.ModuleType]
    changes: list[Change]

    def helper(self, module_name: str) -> types.ModuleType:
        if module_name not in self.helpers:
            self.helpers[module_name] = types.ModuleType(f"fxguard.helpers[{module_name}]")
        return self.helpers[module_name]


def _function(obj: Any, where: str) -> types.FunctionType:
    if not isinstance(obj, types.FunctionType):
        raise UnsupportedTorchError(f"{where} is {type(obj).__name__}, expected a Python function")
    return obj


def swap_code(body: str, **helper_attrs: Callable[[], Any]) -> Callable:
    """Give the function new code running ``body``; its object stays the same."""
    def how(label: str, where: str, owner: Any, fn: Any, ctx: Context) -> None:
        fn = _function(fn, where)
        helper = ctx.helper(fn.__module__)
        for name, make in helper_attrs.items():
            setattr(helper, name, make())
        ctx.changes.append((label, fn, "__code__", patches.wrapper_code(fn, body)))
    return how


def unwrap(fn: Any, found: Callable[[types.CodeType], bool]) -> Any:
    """Follow ``__wrapped__`` (contextmanager, functools.wraps, dynamo's disable())
    down to the function whose code satisfies ``found``."""
    seen = 0
    while not (isinstance(fn, types.FunctionType) and found(fn.__code__)) and seen < 10:
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return fn


def uses_flag(code: types.CodeType) -> bool:
    return FLAG in code.co_names


def is_generator(code: types.CodeType) -> bool:
    return bool(code.co_flags & inspect.CO_GENERATOR)


def wrap_code(body: str, find: Callable[[types.CodeType], bool] = lambda code: True,
              rename: tuple[str, str] | None = None, **helper_attrs: Callable[[], Any]) -> Callable:
    """Like swap_code, with the original kept as ``__fxguard__.original``.

    ``find`` picks the function to rewrite among those ``__wrapped__`` leads
    to; ``rename`` redirects a global the original code reads and writes.
    """
    def how(label: str, where: str, owner: Any, fn: Any, ctx: Context) -> None:
        fn = _function(unwrap(fn, find), where)
        code = fn.__code__
        if rename:
            if rename[0] not in code.co_names:
                raise UnsupportedTorchError(f"{where} no longer uses {rename[0]}")
            code = patches.rename_global(code, *rename)
            ctx.changes.append((label, inspect.getmodule(fn), rename[1], False))
        helper = ctx.helper(fn.__module__)
        helper.original = patches.shadow_function(fn, code)
        for name, make in helper_attrs.items():
            setattr(helper, name, make())
        ctx.changes.append((label, fn, "__code__", patches.wrapper_code(fn, body)))
    return how


def thread_flag_attribute(label: str, where: str, module: Any, current: Any, ctx: Context) -> None:
    """Reads and writes of ``module._is_fx_tracing_flag`` go to the calling
    thread: the module gets a subclass of its class holding a C descriptor."""
    base = type(module)
    guarded = type(f"FxGuarded{base.__name__.capitalize()}", (base,),
                   {FLAG: _core.ThreadFlag(), "__module__": __name__})
    ctx.changes.append((label, module, "__class__", guarded))


def set_value(value: Any) -> Callable:
    def how(label: str, where: str, owner: Any, current: Any, ctx: Context) -> None:
        ctx.changes.append((label, owner, where.rsplit(".", 1)[1], value))
    return how


def _torch_compile_lock() -> Any:
    from torch._dynamo.convert_frame import compile_lock
    return compile_lock


def _torch_is_compiling() -> Any:
    import torch
    return torch.compiler.is_compiling


# -- the plan --------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    what: str
    where: str
    how: Callable
    layouts: frozenset = frozenset({MODULE_GLOBAL, UPSTREAM})
    option: str | None = None  # install() keyword that can turn this row off


GLOBAL_ONLY = frozenset({MODULE_GLOBAL})

PLAN: tuple[Step, ...] = (
    # what               where                                                  how
    Step("flag reader",    "torch.fx._symbolic_trace.is_fx_tracing",
         swap_code(IS_FX_TRACING, is_fx_tracing=lambda: _core.is_fx_tracing), GLOBAL_ONLY),
    Step("flag reader",    "torch.fx._symbolic_trace.is_fx_symbolic_tracing",
         swap_code(IS_FX_SYMBOLIC_TRACING,
                   is_fx_symbolic_tracing=lambda: _core.is_fx_symbolic_tracing), GLOBAL_ONLY),
    Step("flag writer",    "torch.fx._symbolic_trace.Tracer.trace",
         wrap_code(TRACE, find=uses_flag, rename=(FLAG, SCRATCH_FLAG),
                   fx_tracing=lambda: _core.fx_tracing),
         GLOBAL_ONLY),
    Step("flag attribute", "torch.fx._symbolic_trace._is_fx_tracing_flag",
         thread_flag_attribute, GLOBAL_ONLY),
    Step("config window",  "torch._higher_order_ops.utils._set_compilation_env",
         wrap_code(SET_COMPILATION_ENV, find=is_generator, compile_lock=_torch_compile_lock),
         option="config_window_lock"),
    Step("block-mask lock", "torch.nn.attention.flex_attention.create_block_mask",
         wrap_code(CREATE_BLOCK_MASK, is_compiling=_torch_is_compiling,
                   block_mask_lock=lambda: _core.block_mask_lock),
         option="block_mask_lock"),
    Step("eager backward", "torch._functorch.config.force_non_lazy_backward_lowering",
         set_value(True), option="eager_backward"),
)

OPTIONS = tuple(sorted({s.option for s in PLAN if s.option}))


# -- layout detection ------------------------------------------------------------

def _functions_in(module: types.ModuleType):
    """(qualname, code) of each function the module defines, methods and nested code included."""
    def own(value: Any) -> bool:
        return getattr(value, "__module__", None) == module.__name__

    values = list(vars(module).values())
    values += [v for cls in values if isinstance(cls, type) and own(cls) for v in vars(cls).values()]
    for value in values:
        value = getattr(value, "__func__", value)  # staticmethod / classmethod
        value = unwrap(value, uses_flag) or value  # e.g. dynamo's disable(Tracer.trace)
        if isinstance(value, types.FunctionType) and own(value):
            stack = [value.__code__]
            while stack:
                code = stack.pop()
                yield value.__qualname__, code
                stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]


KNOWN_FLAG_USERS = {"is_fx_tracing", "is_fx_symbolic_tracing", "Tracer.trace"}


def detect_layout(module: types.ModuleType) -> str:
    """Which layout ``torch.fx._symbolic_trace`` has; UnsupportedTorchError if none."""
    names = vars(module)
    if callable(names.get("_get_is_fx_tracing")) and callable(names.get("_set_is_fx_tracing")) \
            and FLAG not in names:
        return UPSTREAM
    problems = []
    if type(names.get(FLAG)) is not bool:
        problems.append(f"module global {FLAG} (a bool) is missing")
    users = {q for q, code in _functions_in(module) if FLAG in code.co_names}
    if missing := KNOWN_FLAG_USERS - users:
        problems.append(f"these no longer use {FLAG}: {', '.join(sorted(missing))}")
    if unknown := users - KNOWN_FLAG_USERS:
        problems.append(f"unknown readers/writers of {FLAG}: {', '.join(sorted(unknown))}")
    if problems:
        raise UnsupportedTorchError(f"{module.__name__}: " + "; ".join(problems))
    return MODULE_GLOBAL


def prepare(layout: str, options: dict[str, bool]) -> tuple[list[Change], list[dict]]:
    """Everything install() will change, computed without changing anything."""
    ctx = Context(helpers={}, changes=[])
    rows = []
    for step in PLAN:
        row = {"what": step.what, "where": step.where, "found": False, "patched": False}
        rows.append(row)
        try:
            owner, attr, current = patches.resolve_path(step.where)
        except (ImportError, AttributeError) as e:
            raise UnsupportedTorchError(f"{step.where} not found ({e})") from None
        if current is patches.MISSING:
            raise UnsupportedTorchError(f"{step.where} not found")
        row["found"] = True
        if layout not in step.layouts or (step.option and not options[step.option]):
            continue
        step.how(step.what, step.where, owner, current, ctx)
        row["patched"] = True
    helpers = [("helpers", importlib.import_module(name), "__fxguard__", helper)
               for name, helper in ctx.helpers.items()]
    return helpers + ctx.changes, rows
