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
from dataclasses import dataclass, field
from typing import Any, Callable

from . import _core, patches

FLAG = "_is_fx_tracing_flag"
FLAG_MODULE = "torch.fx._symbolic_trace"
SCRATCH_FLAG = "__fxguard_scratch_flag__"  # where torch's own save/restore of the flag now lands

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

# _set_compilation_env clears the flag for its window: per thread, now.  And
# since dynamo compiles serialise on compile_lock, holding it for the window
# (in which process-global dynamo config is flipped) keeps every other
# thread's compile out of it.
SET_COMPILATION_ENV = {
    # (flag per thread, config window lock)
    (True, True): """\
    with __fxguard__.compile_lock, __fxguard__.fx_tracing(False):
        yield from __fxguard__.original({call})
""",
    (True, False): """\
    with __fxguard__.fx_tracing(False):
        yield from __fxguard__.original({call})
""",
    (False, True): """\
    with __fxguard__.compile_lock:
        yield from __fxguard__.original({call})
""",
}

# Mask creation takes block_mask_lock, then dynamo's compile_lock: its
# torch.fx.traceback.annotate() edits the process-global node-meta dict that
# another thread's trace (always under compile_lock) is stamping onto its
# nodes.  Inside torch.compile both are skipped (dynamo folds
# is_dynamo_compiling() to True and inlines the original), so fullgraph
# compiles see no graph break.  Not is_compiling(): its flag is process-wide,
# True in every thread while any thread compiles.
CREATE_BLOCK_MASK = """\
    if __fxguard__.is_dynamo_compiling():
        return __fxguard__.original({call})
    with __fxguard__.block_mask_lock, __fxguard__.compile_lock:
        return __fxguard__.original({call})
"""


# -- how each row is done ------------------------------------------------------

Change = tuple[str, object, str, Any]  # (label, owner, attribute, new value or MISSING to delete)


@dataclass
class Context:
    """What preparing the plan collects before anything is applied."""
    layout: str
    options: dict[str, bool]
    helpers: dict[str, types.ModuleType] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)

    def helper(self, module_name: str) -> types.ModuleType:
        if module_name not in self.helpers:
            self.helpers[module_name] = types.ModuleType(f"fxguard.helpers[{module_name}]")
        return self.helpers[module_name]


def _function(obj: Any, where: str) -> types.FunctionType:
    if not isinstance(obj, types.FunctionType):
        raise UnsupportedTorchError(f"{where} is {type(obj).__name__}, expected a Python function")
    return obj


def unwrap(fn: Any, found: Callable[[types.CodeType], bool]) -> Any:
    """Follow ``__wrapped__`` (contextmanager, functools.wraps, dynamo's disable())
    down to the function whose code satisfies ``found``."""
    for _ in range(10):
        if isinstance(fn, types.FunctionType) and found(fn.__code__):
            return fn
        fn = getattr(fn, "__wrapped__", None)
    return None


def uses_flag(code: types.CodeType) -> bool:
    return FLAG in code.co_names


def is_generator(code: types.CodeType) -> bool:
    return bool(code.co_flags & inspect.CO_GENERATOR)


def rewrite(body: str | Callable[[Context], str | None], find=lambda code: True,
            keep_original: bool = False, **helper_attrs: Callable[[], Any]) -> Callable:
    """Give the function new code running ``body``; the function object stays.

    ``find`` picks the function among those ``__wrapped__`` leads to.  With
    ``keep_original`` the old code stays callable as ``__fxguard__.original``,
    its reads and writes of the flag sent to a scratch global nobody reads.
    ``body`` may depend on layout and options; None means leave it alone.
    """
    def how(step: "Step", owner: Any, current: Any, ctx: Context) -> bool:
        text = body(ctx) if callable(body) else body
        if text is None:
            return False
        fn = _function(unwrap(current, find), step.where)
        helper = ctx.helper(fn.__module__)
        if keep_original:
            code = fn.__code__
            if uses_flag(code):
                code = patches.rename_global(code, FLAG, SCRATCH_FLAG)
            helper.original = patches.shadow_function(fn, code)
        for name, make in helper_attrs.items():
            setattr(helper, name, make())
        ctx.changes.append((step.what, fn, "__code__", patches.wrapper_code(fn, text)))
        return True
    return how


def config_is_process_global() -> bool:
    """torch <= 2.12 keeps dynamo config values in plain attributes shared by all
    threads; 2.13 keeps overrides in ContextVars, so each thread has its own."""
    import contextvars

    import torch._dynamo.config as dynamo_config
    entry = dynamo_config._config["allow_empty_graphs"]
    return not isinstance(entry.user_override, contextvars.ContextVar)


def compilation_env_body(ctx: Context) -> str | None:
    lock = ctx.options["config_window_lock"] and config_is_process_global()
    return SET_COMPILATION_ENV.get((ctx.layout == MODULE_GLOBAL, lock))


def module_getattr(step: "Step", owner: Any, current: Any, ctx: Context) -> bool:
    """PEP 562 hook: once the global is gone, ``module._is_fx_tracing_flag``
    reads the calling thread's flag.  The module keeps its exact type, which
    dynamo (torch 2.11) requires of modules it imports."""
    module = owner  # torch.fx._symbolic_trace

    def __getattr__(name: str) -> Any:
        if name == FLAG:
            return _core.is_fx_tracing()
        raise AttributeError(f"module {FLAG_MODULE!r} has no attribute {name!r}")

    ctx.changes.append((step.what, module, SCRATCH_FLAG, False))
    ctx.changes.append((step.what, module, "__getattr__", __getattr__))
    return True


def delete(step: "Step", owner: Any, current: Any, ctx: Context) -> bool:
    ctx.changes.append((step.what, owner, step.attr, patches.MISSING))
    return True


def config_default(value: Any) -> Callable:
    """Change a torch config's default, for every thread.  (Assigning the config
    on torch 2.13 would only reach the calling thread's context; a value a user
    assigned explicitly still wins, as it should.)"""
    def how(step: "Step", owner: Any, current: Any, ctx: Context) -> bool:
        entry = getattr(owner, "_config", {}).get(step.attr)
        if entry is None or not hasattr(entry, "default"):
            raise UnsupportedTorchError(f"{step.where} is not a torch config entry")
        ctx.changes.append((step.what, entry, "default", value))
        return True
    return how


def config_follows_thread(step: "Step", owner: Any, current: Any, ctx: Context) -> str:
    """A new thread starts with its starter's torch config (config_threads.py)."""
    from . import config_threads
    why, changes = config_threads.plan(True)
    ctx.changes.extend(changes)
    return why


def _torch_compile_lock() -> Any:
    from torch._dynamo.convert_frame import compile_lock
    return compile_lock


def _torch_is_dynamo_compiling() -> Any:
    import torch
    return torch.compiler.is_dynamo_compiling


# -- the plan --------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    what: str
    where: str
    how: Callable
    layouts: frozenset = frozenset({MODULE_GLOBAL, UPSTREAM})
    option: str | None = None  # install() keyword that can turn this row off
    adds: bool = False         # creates ``where`` rather than changing it

    @property
    def attr(self) -> str:
        return self.where.rsplit(".", 1)[1]


GLOBAL_ONLY = frozenset({MODULE_GLOBAL})

# Applied top to bottom, undone bottom to top.  The flag's module global is
# removed only after no code of torch's reads or writes it any more.
PLAN: tuple[Step, ...] = (
    # what               where                                         how
    Step("flag attribute", "torch.fx._symbolic_trace.__getattr__",     module_getattr,
         GLOBAL_ONLY, adds=True),
    Step("flag reader",    "torch.fx._symbolic_trace.is_fx_tracing",
         rewrite(IS_FX_TRACING, is_fx_tracing=lambda: _core.is_fx_tracing), GLOBAL_ONLY),
    Step("flag reader",    "torch.fx._symbolic_trace.is_fx_symbolic_tracing",
         rewrite(IS_FX_SYMBOLIC_TRACING, is_fx_symbolic_tracing=lambda: _core.is_fx_symbolic_tracing),
         GLOBAL_ONLY),
    Step("flag writer",    "torch.fx._symbolic_trace.Tracer.trace",
         rewrite(TRACE, find=uses_flag, keep_original=True, fx_tracing=lambda: _core.fx_tracing),
         GLOBAL_ONLY),
    Step("flag writer, config window", "torch._higher_order_ops.utils._set_compilation_env",
         rewrite(compilation_env_body, find=is_generator, keep_original=True,
                 fx_tracing=lambda: _core.fx_tracing, compile_lock=_torch_compile_lock)),
    Step("flag attribute", "torch.fx._symbolic_trace._is_fx_tracing_flag", delete, GLOBAL_ONLY),
    Step("block-mask lock", "torch.nn.attention.flex_attention.create_block_mask",
         rewrite(CREATE_BLOCK_MASK, keep_original=True, is_dynamo_compiling=_torch_is_dynamo_compiling,
                 block_mask_lock=lambda: _core.block_mask_lock, compile_lock=_torch_compile_lock),
         option="block_mask_lock"),
    Step("eager backward", "torch._functorch.config.force_non_lazy_backward_lowering",
         config_default(True), option="eager_backward"),
    Step("config follows thread", "threading.Thread.start", config_follows_thread,
         option="config_follows_thread"),
)

OPTIONS = ("block_mask_lock", "config_window_lock", "eager_backward", "config_follows_thread")


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
    ctx = Context(layout, options)
    rows = []
    for step in PLAN:
        applies = layout in step.layouts
        row = {"what": step.what, "where": step.where, "found": False, "patched": False,
               "applies": applies}
        rows.append(row)
        try:
            owner, _, current = patches.resolve_path(step.where)
        except (ImportError, AttributeError):
            owner, current = None, patches.MISSING
        exists = current is not patches.MISSING
        row["found"] = exists != step.adds  # the patch point is as expected
        row["reason"] = "not needed on this torch"
        if not applies:
            continue  # this torch does not need it (e.g. its flag is thread-local already)
        if not row["found"]:
            raise UnsupportedTorchError(f"{step.where} " + (
                "exists already; fxguard would replace it" if step.adds else "not found"))
        if step.option and not options[step.option]:
            row["reason"] = "option off"
            continue
        done = step.how(step, owner, current, ctx)  # True, False, or a reason string
        row["patched"] = done is True or done == "patched"
        if row["patched"]:
            row["reason"] = "patched"
        elif isinstance(done, str):
            row["reason"] = done
    helpers = [("helpers", importlib.import_module(name), "__fxguard__", helper)
               for name, helper in ctx.helpers.items()]
    return helpers + ctx.changes, rows
