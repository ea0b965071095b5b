"""The FX trace state made per thread: module globals a trace or compile writes
and another thread's run-time code reads (``PER_THREAD``, machinery:
per_thread_globals; a new one is one new row), and Tracer.trace's process-wide
patches and class state (``ROWS``: ``PATCHING``, ``CLASS_STATE``;
per_thread_patching)."""
from __future__ import annotations

import collections
import importlib
import sys
import types
from typing import Any, Callable

from ..machinery import originals, settle
from ..machinery.changes import Outcome
from ..machinery.per_thread_globals import FastReader, PerThread
from ..machinery.per_thread_patching import ClassState, Patching
from .facts import FLAG, FLAG_MODULE, MODULE_GLOBAL, TorchFacts


def _flag_needed(facts: TorchFacts) -> tuple[Outcome, str] | None:
    return None if facts.layout == MODULE_GLOBAL else (Outcome.NOT_NEEDED, "torch keeps it per thread")


# -- per-thread globals ----------------------------------------------------------

COMPILING_STATE = "torch._export.utils._compiling_state_context"  # export assigns the attributes
# torch <= 2.6: the same context manager, nested in each of these (rewritten with it).
OLD_COMPILING_STATE = ("torch.export._trace._export_to_aten_ir",
                       "torch.export._trace._export_to_aten_ir_make_fx")

PER_THREAD: tuple[PerThread, ...] = (
    # The FX-tracing flag: compile_wrapper raises when it reads True.
    PerThread(FLAG_MODULE, FLAG, False, flag=True, needed=_flag_needed,
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


# TorchDispatchMode's flags: every mode's __enter__ saves and sets them, its
# __exit__ restores them, while the mode stack itself is per thread (C++).  A
# thread in no mode read another's (inductor's compiled-region wrapper, and
# dynamo, which skips the frame, running it eager, while one reads True), and
# interleaved enter/exit left them True for good.  The C++ mirror of the last
# (2.10+) is a thread_local each thread's own enter/exit sets.
#
# Each thread's flags start from its own mode stack (C++, per thread), as its
# own enter/exit would have set them: a thread inside a mode when install()
# runs reads True until it leaves, every other thread False, whatever the
# process-wide globals held then.
def _entered_modes() -> list:
    """The calling thread's modes that TorchDispatchMode.__enter__ set the flags for."""
    torch = sys.modules.get("torch")
    stack = getattr(getattr(torch, "_C", None), "_get_dispatch_stack_at", None)
    if stack is None:
        return []
    modes = [stack(i) for i in range(torch._C._len_torch_dispatch_stack())]
    return [m for m in modes if getattr(m, "old_dispatch_mode_flags", None)]


def _own_flag(entered: Callable[[Any], bool]) -> Callable[[], bool]:
    def own() -> bool:
        try:
            return any(entered(mode) for mode in _entered_modes())
        except Exception:  # noqa: BLE001 - the core calls it where a record is made: never fail there
            return False
    return own


_in_mode = _own_flag(lambda mode: True)
_in_non_infra_mode = _own_flag(lambda mode: not mode.is_infra_mode())
_in_mode_not_ignoring = _own_flag(
    lambda mode: not getattr(mode, "ignore_compile_internals", lambda: True)())

PER_THREAD += (
    PerThread("torch.utils._python_dispatch", "_is_in_torch_dispatch_mode", False,
              factory=_in_mode),
    PerThread("torch.utils._python_dispatch", "_is_in_non_infra_torch_dispatch_mode", False,
              factory=_in_non_infra_mode),
    PerThread("torch.utils._python_dispatch",
              "_is_in_any_mode_without_ignore_compile_internals", False,  # 2.9+
              factory=_in_mode_not_ignoring),
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
    # Non-strict export sets math.pow to a lambda for the whole process while it
    # traces: a Tracer built meanwhile in another thread takes that lambda's id
    # for an autowrapped math function, and a later function at that address
    # (a wrapper of its own trace) is patched twice, which leaves it patched.
    # (builtins.max/min, swapped there too, are left as stock: docs/limits.md.)
    Patching(
        "torch._export.non_strict_utils",
        functions=("_override_builtin_ops",),
        containers=("math",),
    ),
)


# Tracer._qualname_counter is one class-level dict for every tracer: names
# like _param_constant1 depend on what other threads' traces did meanwhile.
CLASS_STATE: tuple[ClassState, ...] = (
    ClassState(f"{PATCHER_MODULE}.Tracer._qualname_counter",
               factory=lambda: collections.defaultdict(int)),
)


ROWS = PATCHING + CLASS_STATE


# -- who is inside a trace ------------------------------------------------------------

def threads_in_trace(stock_only: bool = False) -> list[str]:
    """The threads (the calling one too) inside an FX trace now: a frame of
    Tracer.trace, in torch's code or fxguard's (``stock_only``: torch's), past
    its setting of the FX flag.  Their trace state cannot be carried across
    install(): torch's frame sets the flag back where its code says, the
    process-wide global, never the thread's slot."""
    module = sys.modules.get(PATCHER_MODULE)
    trace = vars(getattr(module, "Tracer", object)).get("trace")
    codes = set()
    for _ in range(10):  # dynamo wraps it (disable()): the code that sets the flag is inside
        if not isinstance(trace, types.FunctionType):
            break
        if not stock_only:
            codes.add(trace.__code__)
        try:
            codes.add(originals.get_original(trace, "__code__"))
        except AttributeError:  # fxguard never changed it: its code is torch's
            codes.add(trace.__code__)
        trace = vars(trace).get("__wrapped__")
    points = {}
    for code in codes:
        at = settle.first_use(code, {FLAG}, ("STORE",))  # the module-global layout
        if at is None:  # torch's threading.local: its setter's call
            at = settle.first_use(code, {"_set_is_fx_tracing"}, ("LOAD",))
        if at is not None:
            points[code] = at
    return settle.threads_past(points)
