"""What fxguard changes in torch: the rows, as data.  Read the tables first.

``PER_THREAD``: module globals that a trace or compile writes and another
thread's run-time code reads; each becomes per-thread (a new one is one new
row; ``per_thread.py`` does the work).  ``WRAPPED``: functions that get a
lock around them.  ``CONFIG_DEFAULTS``: torch config defaults changed for
every thread.  ``prepare()`` turns the rows that apply to the installed torch
into ``patches`` changes without changing anything; install() applies them
in order and uninstall() undoes them in reverse.
"""
from __future__ import annotations

import collections
import importlib
import types
from dataclasses import dataclass
from typing import Any, Callable

from . import _core, patches, per_thread_patch, thread_overlay
from .per_thread import FastReader, NotCovered, PerThread, Planner
from .per_thread_patch import ClassState, Patching

FLAG = "_is_fx_tracing_flag"
FLAG_MODULE = "torch.fx._symbolic_trace"

# Layouts of torch's FX-tracing flag that fxguard knows.
MODULE_GLOBAL = "module-global"       # torch <= 2.13: one bool for the process
UPSTREAM = "upstream-thread-local"    # torch >= 2.14: threading.local behind _get/_set_is_fx_tracing


class UnsupportedTorchError(RuntimeError):
    """install() found a torch it does not know; nothing was patched."""


# -- per-thread globals --------------------------------------------------------

COMPILING_STATE = "torch._export.utils._compiling_state_context"  # export assigns the attributes
# torch <= 2.6: the same context manager, nested in each of these (rewritten with it).
OLD_COMPILING_STATE = ("torch.export._trace._export_to_aten_ir",
                       "torch.export._trace._export_to_aten_ir_make_fx")

PER_THREAD: tuple[PerThread, ...] = (
    # The FX-tracing flag: compile_wrapper raises when it reads True.
    PerThread(FLAG_MODULE, FLAG, False, flag=True,
              writers=("torch._higher_order_ops.utils._set_compilation_env",),
              # compile_wrapper calls one of the first two on every compiled call.
              readers=(FastReader("is_fx_symbolic_tracing", "symbolic",
                                  body="return {name} and (not torch.compiler.is_compiling())"),
                       FastReader("is_fx_tracing", first="is_fx_tracing_warning",  # 2.9+
                                  body="is_fx_tracing_warning(); return {name}"),
                       FastReader("is_fx_tracing"))),  # <= 2.8
    # is_compiling(): True in every thread during any compile (2.13+), so
    # transformers picks uncompiled flex_attention.  is_compiling()'s other
    # branch, torch.jit.is_scripting(), is False outside TorchScript, which
    # compiles the source, not the function object.
    PerThread("torch.compiler", "_is_compiling_flag", False, writers=(COMPILING_STATE,),
              or_writers=OLD_COMPILING_STATE,
              readers=(FastReader("is_compiling", body="if torch.jit.is_scripting():\n"
                                  "    return False\nelse:\n    return {name}"),)),
    PerThread("torch.compiler", "_is_exporting_flag", False, writers=(COMPILING_STATE,),
              readers=(FastReader("is_exporting"),)),
    PerThread("torch.compiler", "_is_non_strict_tracing_flag", False),
    # Node meta: create_block_mask's annotate() against another thread's trace
    # (KeyError: 'custom').  flex_attention.py imported current_meta by value.
    # Dynamo inlines these readers (traces their code), so on 3.11 they keep
    # their rewritten code: dynamo cannot trace a call of Reader.read.
    PerThread("torch.fx.traceback", "current_meta", factory=dict,
              aliases=("torch._higher_order_ops.flex_attention",),
              readers=(FastReader("get_current_meta", code_route=False),)),
    PerThread("torch.fx.traceback", "current_replay_node", None,
              readers=(FastReader("get_current_replay_node", code_route=False),)),
    PerThread("torch.fx.traceback", "should_preserve_node_meta", False,
              readers=(FastReader("has_preserved_node_meta", code_route=False),)),
    PerThread("torch.fx.traceback", "_should_preserve_node_meta", False),
    # A HOP's eager autograd must not re-enter another thread's make_fx.
    PerThread("torch.fx.experimental.proxy_tensor", "_CURRENT_MAKE_FX_TRACER", None),
    # Which GraphModule class a make_fx/symbolic_trace builds.
    PerThread("torch.fx._lazy_graph_module", "_use_lazy_graph_module_flag", False),
    PerThread("torch.fx._lazy_graph_module", "_force_skip_lazy_graph_module_flag", False),
)



# -- direct traces on several threads ---------------------------------------------

PATCHER_MODULE = "torch.fx._symbolic_trace"

PER_THREAD += (
    # Tracer.trace's patcher stack: _new_patcher and dynamo's
    # _maybe_revert_all_patches must see the calling thread's.
    PerThread(PATCHER_MODULE, "CURRENT_PATCHER", None),
    # make_fx(pre_dispatch=True) (non-strict export) keeps its infra modes
    # here; two exports at once: "ProxyTorchDispatchMode slot already occupied".
    PerThread("torch._ops", "_mode_stack_state_for_pre_dispatch",
              factory=lambda: importlib.import_module("torch._ops")._ModeStackStateForPreDispatch()),
    # export(): set on entry, cleared on exit ("_EXPORT_MODULE_HIERARCHY must
    # not be None" in the thread whose export is still running).
    PerThread("torch.export._trace", "_EXPORT_FLAGS", None),
    PerThread("torch.export._trace", "_EXPORT_MODULE_HIERARCHY", None),
    # Filled by one non-strict export's make_fx, read back by the same export.
    PerThread("torch.fx.experimental.proxy_tensor", "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT",
              factory=dict, aliases=("torch.export._trace",)),
)

# Tracer.trace patches nn.Module.__call__/__getattr__, torch.fx.wrap'ped module
# globals and autowrapped functions (math.sqrt in the traced code's globals)
# through these functions; made per thread, a trace patches its own thread only.
PATCHING: tuple[Patching, ...] = (
    Patching(
        PATCHER_MODULE,
        functions=("_PatchedFnSetItem.patch", "_PatchedFnSetItem.revert",
                   "_PatchedFnDel.patch", "_PatchedFnDel.revert",
                   "_PatchedFnSetAttr.patch", "_PatchedFnSetAttr.revert",
                   "_Patcher.patch", "_Patcher.patch_method", "_patch_wrapped_functions",
                   "_autowrap_check", "_create_wrapped_method",
                   # collects the ids of math.* to autowrap: must not see a Dispatch
                   # another thread's trace put there
                   "Tracer.__init__"),
        containers=("frame_dict", "self.frame_dict", "cls", "m.__dict__"),
        # Every module call of every thread passes these: dispatch from install() on.
        up_front=("torch.nn.Module.__call__", "torch.nn.Module.__getattr__"),
        # Dynamo compares Module.__getattr__ by identity (inspect.getattr_static):
        # a descriptor there makes every compiled submodule access unsupported.
        # Tracer.trace calls the real one through _orig_module_getattr.
        keep_identity=(("torch.nn.Module.__getattr__",
                        (f"{PATCHER_MODULE}._orig_module_getattr",)),),
    ),
)


# Tracer._qualname_counter is one class-level dict for every tracer: names
# like _param_constant1 depend on what other threads' traces did meanwhile.
CLASS_STATE: tuple[ClassState, ...] = (
    ClassState(f"{PATCHER_MODULE}.Tracer._qualname_counter",
               factory=lambda: collections.defaultdict(int)),
)


# -- locks around functions, config defaults ----------------------------------

# _set_compilation_env sets dynamo config for its window (eager flex_attention,
# HOP compiles) and puts the old values back.  On torch <= 2.12 that config is
# process-wide: another thread's compile would read the window's values, and
# two windows' saves and restores interleave.  The window is made per thread:
# its writes to these entries stay in the thread that is inside it (no lock:
# holding dynamo's compile_lock for the window made an eager flex call wait
# for every other thread's compile).
CONFIG_WINDOW = """\
    with __fxguard__.window():
        yield from __fxguard__.inner({call})
"""
WINDOW_CONFIG = ("torch._dynamo.config", ("allow_empty_graphs", "capture_scalar_outputs"))

# Eager mask creation holds block_mask_lock.  Not across a compile: with
# _compile=True a new shape compiles, and one lock would queue every thread's
# masks behind it (dynamo's compile_lock serialises the compile itself).
# Under torch.compile (is_dynamo_compiling() folds to True) the original is
# inlined: no graph break.
BLOCK_MASK = """\
    if _compile or __fxguard__.is_dynamo_compiling():
        return __fxguard__.inner({call})
    with __fxguard__.block_mask_lock:
        return __fxguard__.inner({call})
"""


# On an autograd worker (a device's thread, or the pool that takes over deep
# reentrant backward) a backward node runs for the thread whose graph task it
# is; torch 2.12+ keeps config overrides per thread (ContextVars), so the node
# runs with that thread's overrides, read from the Context its record notes.
# Under dynamo (never expected here) the original is inlined as it was.
WORKER_CONFIG = """\
    if __fxguard__.is_dynamo_compiling():
        return __fxguard__.inner({call})
    context = __fxguard__.carried_context()
    if context is None:
        return __fxguard__.inner({call})
    return __fxguard__.run_with_config_of(context, __fxguard__.inner, {call})
"""


# A thread's record is published (with its Context noted) when it starts a
# backward, so that graph task carries it into autograd workers: also for
# threads started before install(), and at no cost to Thread.start().
PUBLISH_BEFORE_BACKWARD = """\
    if not __fxguard__.is_dynamo_compiling():
        __fxguard__.publish_record()
    return __fxguard__.inner({call})
"""


@dataclass(frozen=True)
class Wrapped:
    what: str
    where: str
    body: str
    needed: Callable[[], str | None]          # None if needed, else the reason it is not
    helpers: tuple[tuple[str, Callable[[], Any]], ...] = ()
    option: str | None = None
    # (config module, entry names): entries whose user_override the window keeps per thread
    windowed: tuple[str, tuple[str, ...]] | None = None


@dataclass(frozen=True)
class ConfigDefault:
    what: str
    where: str
    value: Any
    option: str | None = None
    missing: str = "not available on this torch"  # the status reason where torch lacks it


def config_is_process_global() -> bool:
    """torch <= 2.12 keeps dynamo config values in plain attributes shared by all
    threads; 2.13 keeps overrides in ContextVars, so each thread has its own."""
    import contextvars

    import torch._dynamo.config as dynamo_config
    return not any(isinstance(getattr(entry, "user_override", None), contextvars.ContextVar)
                   for entry in dynamo_config._config.values())


def _config_needs_carrying() -> str | None:
    from . import config_threads
    return None if config_threads.config_is_per_thread() else "not needed: config process-wide"


def _run_with_config_of() -> Any:
    from .config_threads import run_with_config_of
    return run_with_config_of


def _is_dynamo_compiling() -> Any:
    import torch
    return torch.compiler.is_dynamo_compiling


WRAPPED: tuple[Wrapped, ...] = (
    Wrapped("config window per thread", "torch._higher_order_ops.utils._set_compilation_env",
            CONFIG_WINDOW,
            lambda: None if config_is_process_global() else "not needed: config per thread",
            (("window", lambda: thread_overlay.window),), option="config_window_lock",
            windowed=WINDOW_CONFIG),
    Wrapped("block-mask lock", "torch.nn.attention.flex_attention.create_block_mask", BLOCK_MASK,
            lambda: None,
            (("is_dynamo_compiling", _is_dynamo_compiling),
             ("block_mask_lock", lambda: _core.block_mask_lock)), option="block_mask_lock"),
    Wrapped("config in autograd workers", "torch.autograd.function.BackwardCFunction.apply",
            WORKER_CONFIG, _config_needs_carrying,
            (("is_dynamo_compiling", _is_dynamo_compiling),
             ("carried_context", lambda: _core._carried_context),
             ("run_with_config_of", _run_with_config_of)), option="config_follows_thread"),
    Wrapped("record before backward", "torch.autograd.graph._engine_run_backward",
            PUBLISH_BEFORE_BACKWARD, _config_needs_carrying,
            (("is_dynamo_compiling", _is_dynamo_compiling),
             ("publish_record", lambda: _core._publish_record)), option="config_follows_thread"),
)

CONFIG_DEFAULTS: tuple[ConfigDefault, ...] = (
    # Backward graphs compiled with the forward: the autograd worker never
    # needs compile_lock (the shared-GPU deadlock).
    ConfigDefault("eager backward", "torch._functorch.config.force_non_lazy_backward_lowering",
                  True, option="eager_backward",
                  missing="not covered: this torch has no such switch; a backward first compiled "
                          "on a GPU's autograd worker can deadlock with another thread's compile "
                          "(README, Limits)"),
)

OPTIONS = ("block_mask_lock", "config_window_lock", "eager_backward", "config_follows_thread")


# -- layout of the FX flag ------------------------------------------------------

# The module-global layout: the functions of torch.fx._symbolic_trace that use
# the flag, one known set per torch generation.  Every other use in the module
# must lie in one of them (per_thread checks it); a set none matches refuses.
KNOWN_FLAG_USERS = (
    frozenset({"is_fx_tracing", "is_fx_symbolic_tracing", "Tracer.trace"}),  # 2.9 - 2.13
    frozenset({"is_fx_tracing", "Tracer.trace"}),  # 2.5 - 2.8: compile_wrapper calls is_fx_tracing
)


def detect_layout(module: types.ModuleType) -> str:
    """Which layout ``torch.fx._symbolic_trace`` has; UnsupportedTorchError if none."""
    from .per_thread import functions_in
    from .rewrite import global_users

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


# -- turning rows into changes -------------------------------------------------

Change = tuple[str, object, str, Any]  # (label, owner, attribute, new value or MISSING to delete)


@dataclass
class Prepared:
    changes: list[Change]
    rows: list[dict]
    defaults: tuple[tuple, tuple]        # slot defaults and factories for _core._configure
    initial: list[tuple[Any, str, Any]]  # (module, name, value): the installing thread's values


def _row(what: str, where: str, reason: str) -> dict:
    return {"what": what, "where": where, "reason": reason, "patched": reason == "patched"}


def prepare(layout: str, options: dict[str, bool]) -> Prepared:
    """Everything install() will change, computed without changing anything."""
    planner, rows = Planner(), []
    for row in PER_THREAD:
        what = "per-thread flag" if row.flag else "per-thread global"
        if row.flag and layout != MODULE_GLOBAL:
            rows.append(_row("FX-tracing flag", row.where, "not needed: torch keeps it per thread"))
            continue
        try:
            reason = planner.add(row)
        except NotCovered as e:  # the planner is as it was before this row
            if row.flag:
                raise UnsupportedTorchError(str(e)) from None
            reason = f"not covered: {e}"
        rows.append(_row("FX-tracing flag" if row.flag else what, row.where, reason))
    rows += [_row("fast reader", where, reason) for where, reason in planner.reader_rows]
    changes = planner.changes("per-thread")
    for spec in PATCHING:
        rows.append(_row("per-thread patching", spec.where, _patching(spec, changes)))
    for state in CLASS_STATE:
        more, reason = per_thread_patch.plan_class_state(state)
        changes += more
        rows.append(_row("per-thread class state", state.where, reason))
    helpers: dict[str, types.ModuleType] = {}
    for wrap in WRAPPED:
        reason = _wrap(wrap, options, planner, helpers, changes)
        rows.append(_row(wrap.what, wrap.where, reason))
    for cfg in CONFIG_DEFAULTS:
        rows.append(_row(cfg.what, cfg.where, _config_default(cfg, options, changes)))
    # Torch config overrides (ContextVars since 2.12) follow a thread's start().
    from . import config_threads
    reason, thread_changes = config_threads.plan(options["config_follows_thread"])
    rows.append(_row("config follows thread", "threading.Thread.start", reason))
    changes += thread_changes
    helper_changes = [("helpers", importlib.import_module(name), "__fxguard__", helper)
                      for name, helper in helpers.items()]
    return Prepared(helper_changes + changes, rows, planner.defaults(), planner.initial())


def _resolve(where: str) -> tuple[object, Any]:
    try:
        owner, _, current = patches.resolve_path(where)
    except (ImportError, AttributeError):
        return None, patches.MISSING
    return owner, current


def _wrap(wrap: Wrapped, options: dict, planner: Planner, helpers: dict, changes: list) -> str:
    if wrap.option and not options[wrap.option]:
        return "option off"
    if (why := wrap.needed()) is not None:
        return why
    _, current = _resolve(wrap.where)
    fn = current
    while fn is not None and not isinstance(fn, types.FunctionType):
        fn = getattr(fn, "__wrapped__", None)
    if isinstance(fn, types.FunctionType) and "__wrapped__" in vars(fn):
        fn = fn.__wrapped__  # contextmanager: the generator function
    if not isinstance(fn, types.FunctionType):
        return "not available on this torch"
    if "{call}" in wrap.body and "_compile" in wrap.body and "_compile" not in fn.__code__.co_varnames:
        return "not available on this torch"
    overlays = _overlays(wrap)
    if overlays is None:
        return "not available on this torch"
    changes += overlays
    helper = helpers.setdefault(fn.__module__, types.ModuleType(f"fxguard.helpers[{fn.__module__}]"))
    # What the wrapper calls: fn's body as the planner leaves it, in a function
    # object of its own.  Not a record of originals (patches has the one).
    if hasattr(helper, "inner"):
        raise UnsupportedTorchError(f"two wrapped functions in {fn.__module__}: one helper each")
    helper.inner = patches.shadow_function(fn, planner.code_for(fn))
    for name, make in wrap.helpers:
        setattr(helper, name, make())
    changes.append((wrap.what, fn, "__code__", patches.wrapper_code(fn, wrap.body)))
    return "patched"


def _overlays(wrap: Wrapped) -> list | None:
    """Changes making the row's windowed config entries honour thread_overlay.window();
    None if one is missing."""
    if wrap.windowed is None:
        return []
    module, names = wrap.windowed
    entries = getattr(importlib.import_module(module), "_config", {})
    if any(name not in entries for name in names):
        return None
    return [(wrap.what, entries[name], "__class__", thread_overlay.overlaid(entries[name], "user_override"))
            for name in names]


def _patching(spec: Patching, changes: list) -> str:
    try:
        more, reason = per_thread_patch.plan(spec)
    except NotCovered as e:
        return f"not covered: {e}"
    changes += more
    return reason


def _config_default(cfg: ConfigDefault, options: dict, changes: list) -> str:
    """Change a torch config's default, for every thread.  (Assigning the config
    on torch 2.13 would only reach the calling thread's context; a value a user
    assigned explicitly still wins, as it should.)"""
    if cfg.option and not options[cfg.option]:
        return "option off"
    owner, current = _resolve(cfg.where)
    entry = getattr(owner, "_config", {}).get(cfg.where.rsplit(".", 1)[1]) if owner else None
    if entry is None or not hasattr(entry, "default"):
        return cfg.missing
    changes.append((cfg.what, entry, "default", cfg.value))
    return "patched"
