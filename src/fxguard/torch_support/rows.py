"""What fxguard changes in torch: the rows, as data.  Read the tables first.

- ``PER_THREAD``: module globals that a trace or compile writes and another
  thread's run-time code reads; each becomes per thread (machinery:
  per_thread_globals).  A new one is one new row.
- ``PATCHING``, ``CLASS_STATE``: Tracer.trace's process-wide patches, and class
  state every tracer updates, made per thread (per_thread_patching).
- ``WRAPPED``: functions whose code runs a body around the original (a lock, a
  window, the thread's config), identity kept (codegen.swap_code).
- ``CONFIG_DEFAULTS``: torch config defaults changed for every thread.
- ``cudagraphs.ROWS``: CUDA-graph trees (``reduce-overhead``) per thread;
  ``cudagraph_capture_lock.ROW``: torch 2.13+'s capture lock per device;
  ``cudagraph_rng.ROWS``: CUDA-graph random numbers per thread, syncs wait for recordings;
  ``cuda_thread.ROWS``: backwards in turn in ``cuda_graph_thread()`` blocks.
- ``COMPILE_ONCE``: threads that miss dynamo's cache together share one
  compile (compile_once.py, a mechanism rather than a table).
- ``CONCURRENT``: what option ``concurrent_compiles`` (off by default) does:
  dynamo's compile_lock no longer held across a whole compile, one compile's
  state per thread, one-time set-up once, ids and counters exact.

``ROWS`` (at the end) is every row in the order they are planned and shown;
each is a machinery.changes.RowKind (its option, why a torch may not need it,
how it is planned).  ``prepare.py`` turns the rows that apply to the installed
torch (facts.py) into changes, without changing anything.
"""
from __future__ import annotations

import collections
import importlib
import threading
from typing import Any, Callable

from .. import _core
from ..machinery import overlay
from ..machinery.changes import Outcome
from ..machinery.config_default import ConfigDefault
from ..machinery.exact_counters import ExactCounters
from ..machinery.once import Once, Onces
from ..machinery.per_thread_attrs import ClassAttr, ClassAttrs, InstanceAttr
from ..machinery.per_thread_globals import FastReader, PerThread
from ..machinery.per_thread_patching import ClassState, Patching
from ..machinery.shared_window import SharedWindow
from ..machinery.wrapped import Swap, Wrapped
from . import cudagraph_capture_lock as _capture_lock
from . import cudagraph_rng as _cudagraph_rng
from . import cuda_thread as _cuda_thread
from . import compile_options as _compile_options
from . import cudagraphs as _cudagraphs
from . import rng as _rng
from .compile_lock import SharedLockRow
from .compile_once import CompileOnceRow
from .device_guard import DeviceGuardUpFront
from .facts import FLAG, FLAG_MODULE, MODULE_GLOBAL, TorchFacts
from .options import Option



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
PER_THREAD += (
    PerThread("torch.utils._python_dispatch", "_is_in_torch_dispatch_mode", False),
    PerThread("torch.utils._python_dispatch", "_is_in_non_infra_torch_dispatch_mode", False),
    PerThread("torch.utils._python_dispatch",
              "_is_in_any_mode_without_ignore_compile_internals", False),  # 2.9+
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



# -- functions wrapped in a body, identity kept ------------------------------------

def _config_process_wide(facts: TorchFacts) -> tuple[Outcome, str] | None:
    return None if not facts.config_per_thread else (Outcome.NOT_NEEDED, "config per thread")


def _config_lost_by_threads(facts: TorchFacts) -> tuple[Outcome, str] | None:
    if not facts.config_per_thread:
        return Outcome.NOT_NEEDED, "config process-wide"
    if facts.python_inherits_context:
        return Outcome.NOT_NEEDED, "Python inherits context"
    return None


def _is_dynamo_compiling() -> Any:
    import torch
    return torch.compiler.is_dynamo_compiling


def _config(name: str) -> Callable[[], Any]:
    def get() -> Any:
        from . import config
        return getattr(config, name)
    return get


DYNAMO = ("is_dynamo_compiling", _is_dynamo_compiling)

# _set_compilation_env sets dynamo config for its window (eager flex_attention,
# HOP compiles) and puts the old values back.  Where that config is
# process-wide (torch <= 2.11) another thread's compile would read the
# window's values, and two windows' saves and restores interleave.  The
# window's writes to these entries stay in the thread inside it (no lock:
# holding dynamo's compile_lock for the window made an eager flex call wait
# for every other thread's compile).
CONFIG_WINDOW = """\
    with {ns}.window():
        yield from {ns}.inner({call})
"""
WINDOW_CONFIG = ("torch._dynamo.config", ("allow_empty_graphs", "capture_scalar_outputs"))

# Eager mask creation holds block_mask_lock.  Not across a compile: with
# _compile=True a new shape compiles, and one lock would queue every thread's
# masks behind it (dynamo's compile_lock serialises the compile itself).
# Under torch.compile (is_dynamo_compiling() folds to True) the original is
# inlined: no graph break.
BLOCK_MASK = """\
    if _compile or {ns}.is_dynamo_compiling():
        return {ns}.inner({call})
    with {ns}.block_mask_lock:
        return {ns}.inner({call})
"""

# On an autograd worker (a device's thread, or the pool that takes over deep
# reentrant backward) a backward node runs for the thread whose graph task it
# is; with config per thread (torch >= 2.12) the node runs with that thread's
# overrides, read from the Context its record notes.  Under dynamo (never
# expected here) the original is inlined as it was.
WORKER_CONFIG = """\
    if {ns}.is_dynamo_compiling():
        return {ns}.inner({call})
    context = {ns}.carried_context()
    if context is None:
        return {ns}.inner({call})
    return {ns}.run_with_config_of(context, {ns}.inner, {call})
"""

# A thread's record is published (with its Context noted) when it starts a
# backward, so that graph task carries it into autograd workers: also for
# threads started before install(), and at no cost to Thread.start().
PUBLISH_BEFORE_BACKWARD = """\
    if not {ns}.is_dynamo_compiling():
        {ns}.publish_record()
    return {ns}.inner({call})
"""

# Config follows the thread (config.py): Thread.start() hands the new thread
# its starter's context; the new thread takes the torch config entries from it
# first thing in _bootstrap, before start() returns; install_config_module
# registers every config module converted after install().
THREAD_START = """\
    self.__dict__[{ns}.ATTR] = {ns}.copy_context()
    return {ns}.inner({call})
"""
THREAD_BOOTSTRAP = """\
    {ns}.enter_thread(self)
    return {ns}.inner({call})
"""
REGISTER_CONFIG_MODULE = """\
    result = {ns}.inner({call})
    {ns}.register(module)
    return result
"""

# A lock around the whole (short) function.
LOCKED = """\
    with {ns}.lock:
        return {ns}.inner({call})
"""

WRAPPED: tuple[Wrapped, ...] = (
    Wrapped("config window per thread",
            (Swap("torch._higher_order_ops.utils._set_compilation_env", CONFIG_WINDOW,
                  (("window", lambda: overlay.window),)),),
            _config_process_wide, option=Option.CONFIG_WINDOW_LOCK, windowed=WINDOW_CONFIG),
    Wrapped("torch.compile options per thread",
            (Swap(_compile_options.WHERE, _compile_options.BODY,
                  (("patched_copy", lambda: _compile_options.patched_copy),), params=("config_patches",)),),
            _compile_options.needed, option=Option.CONFIG_WINDOW_LOCK),
    Wrapped("block-mask lock",
            (Swap("torch.nn.attention.flex_attention.create_block_mask", BLOCK_MASK,
                  (DYNAMO, ("block_mask_lock", lambda: _core.block_mask_lock)),
                  params=("_compile",)),),
            option=Option.BLOCK_MASK_LOCK),
    Wrapped("config in autograd workers",
            (Swap("torch.autograd.function.BackwardCFunction.apply", WORKER_CONFIG,
                  (DYNAMO, ("carried_context", lambda: _core._carried_context),
                   ("run_with_config_of", _config("run_with_config_of")))),),
            _config_lost_by_threads, option=Option.CONFIG_FOLLOWS_THREAD),
    Wrapped("record before backward",
            (Swap("torch.autograd.graph._engine_run_backward", PUBLISH_BEFORE_BACKWARD,
                  (DYNAMO, ("publish_record", lambda: _core._publish_record))),),
            _config_lost_by_threads, option=Option.CONFIG_FOLLOWS_THREAD, carries_context=True),
    # Graph.python_code points every node's _repr_fn at its own namespace for the
    # length of the call and puts back what it found: two threads generating one
    # graph's code at once (the first calls of a fresh lazy GraphModule, which
    # compile once hands to every waiting thread together) name nodes from each
    # other's namespaces (UnboundLocalError in the generated forward, seen on 3.13t
    # with the GIL off) and leave the nodes' repr pointing at a finished namespace.
    # Code generation is short and holds no other lock.
    Wrapped("graph codegen lock",
            (Swap("torch.fx.graph.Graph.python_code", LOCKED, (("lock", _core.RLock),),
                  params=("self",)),)),
)

# A compile sets the CPU and CUDA generators back to where they were when it
# started (preserve_global_state): while other threads run, that restore is
# skipped, so their draws are never repeated (rng.py).
SAVE_RNG = """\
    if not {ns}.is_dynamo_compiling():
        {ns}.saving()
    return {ns}.inner({call})
"""
RESTORE_RNG = """\
    if not {ns}.is_dynamo_compiling() and {ns}.skip():
        return None
    return {ns}.inner({call})
"""
WRAPPED += (
    Wrapped("compile keeps others' random numbers",
            tuple(Swap(f"{module}.{verb}_rng_state", body, (DYNAMO,) + _rng.helpers(generator))
                  for module, generator in (("torch.random", "cpu"), ("torch.cuda.random", "cuda"))
                  for verb, body in (("set", RESTORE_RNG), ("get", SAVE_RNG))),
            _rng.needed, option=Option.RNG_NOT_REWOUND),
)

# After CONFIG_DEFAULTS in status(): new threads start with their starter's config.
THREADS: tuple[Wrapped, ...] = (
    Wrapped("config follows thread",
            (Swap("threading.Thread.start", THREAD_START,
                  (("ATTR", _config("THREAD_ATTR")), ("copy_context", _config("copy_context"))),
                  params=("self",)),
             Swap("threading.Thread._bootstrap", THREAD_BOOTSTRAP,
                  (("enter_thread", _config("enter_thread")),), params=("self",)),
             Swap("torch.utils._config_module.install_config_module", REGISTER_CONFIG_MODULE,
                  (("register", _config("register")),), params=("module",))),
            _config_lost_by_threads, option=Option.CONFIG_FOLLOWS_THREAD,
            # config modules converted before the hook is in: found by one scan
            up_front=lambda: _config("rescan_later")()()),
)


# -- config defaults -------------------------------------------------------------

CONFIG_DEFAULTS: tuple[ConfigDefault, ...] = (
    # Backward graphs compiled with the forward: the autograd worker never
    # needs compile_lock (the shared-GPU deadlock).
    ConfigDefault("eager backward", "torch._functorch.config.force_non_lazy_backward_lowering",
                  True, option=Option.EAGER_BACKWARD,
                  missing=(Outcome.NOT_COVERED,
                           "this torch has no such switch; a backward first compiled on a GPU's "
                           "autograd worker can deadlock with another thread's compile "
                           "(docs/limits.md)")),
)


# -- one compile per graph -------------------------------------------------------

# Dynamo's callback for a cache miss (and compute_cache_size): a thread that
# missed while another compiled the same code runs that compile if its guards pass.
COMPILE_ONCE = CompileOnceRow("torch._dynamo.convert_frame.CatchErrorsWrapper.__call__",
                              option=Option.COMPILE_ONCE)


# -- concurrent compiles (option concurrent_compiles, off by default) ----------------
# What crosses threads once compiles overlap, per torch: tools/compile_globals/FINDINGS.md
# (tools/compile_globals.py lists and classifies every global the compiler writes).

CONCURRENT = Option.CONCURRENT_COMPILES


# The callback's whole body holds the lock shared.  One function's compiles
# still run one at a time, as stock: three threads compiling one graph at once
# deadlocked in torch (grad-accumulator mutex against the GIL under anomaly
# mode).  Where the compile-once row is patched, its wait per code object (it
# wraps this callback, outside the lock) is what keeps them one at a time, and
# the threads that missed together share that compile; with it off, the
# callback also takes its code object's turn at the same compile gate
# (machinery.compile_gate, PER_CODE_HELD), sharing no result.  A callback
# inside a compile (a compiled function called while tracing) is a re-entry,
# as with stock's RLock: it takes neither, so it cannot wait for a code another
# thread's compile holds while that one waits for this one's.
SHARED_BODY = """\
    if {ns}.lock._is_owned():
        return {ns}.inner({call})
    with {ns}.lock.shared(){held}:
        return {ns}.inner({call})
"""
PER_CODE_HELD = ", {ns}.per_code.held(frame.f_code)"
# torch <= 2.11 (config process-wide): a compile also runs in an overlay window
# (machinery.overlay) over every entry of these config modules, so that its
# `with config.patch(...)` (inductor's own: inplace_buffers, unroll thresholds,
# padding, ...; torch.compile's options and mode) stays in its thread.
# Interleaved, two compiles' patches otherwise crossed and stayed for good.
WINDOW_HELD = ", {ns}.window()"
COMPILE_CONFIG = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")

# Dynamo's frame callback holds compile_lock (with _disable_current_modes())
# across a whole compile: every thread waits out every other's compile.  Held
# shared instead, compiles of distinct graphs overlap; its own `with
# compile_lock:` inside is a re-entry.  torch's other holders keep their meaning
# (exclusive): reset() and reset_code_caches() wait until no compile runs,
# compile_fx's lazy backward compile likewise (run inside a compile, as with
# eager backward, it is a re-entry, as with stock's RLock).  Same-graph threads
# still compile once where fxguard's compile-once row waits them.
COMPILE_LOCK = SharedLockRow("compile lock", "torch._dynamo.convert_frame.compile_lock",
                             ("torch._dynamo.convert_frame.CatchErrorsWrapper.__call__",),  # 2.10+
                             SHARED_BODY, PER_CODE_HELD, WINDOW_HELD, COMPILE_CONFIG,
                             option=CONCURRENT)


def _original_forward_from_src() -> Any:
    from ..machinery import originals
    module = importlib.import_module("torch.fx.graph_module")
    return originals.get_original(module, "_forward_from_src")


CONCURRENT_PER_THREAD: tuple[PerThread, ...] = (
    # The grad mode, autocast, ... a frame's compile started with: set by
    # ConvertFrameAssert.__call__, read when an OutputGraph is made (2.9+) and
    # when guards are built; another thread's makes the GLOBAL_STATE guard
    # check the wrong grad mode ("Guard failed on the same frame it was created").
    PerThread("torch._dynamo.convert_frame", "initial_global_state", None, option=CONCURRENT),
    # Every compile swaps in dynamo's skip wrapper (preserve_global_state) and
    # puts back what it found: interleaved, the wrapper stays for good, and
    # meanwhile another thread's GraphModules get code dynamo skips (a later
    # torch.compile of one runs it eager).  2.10+: the wrapper around
    # trace_frame; older: preserve_global_state's closures.
    PerThread("torch.fx.graph_module", "_forward_from_src", factory=_original_forward_from_src,
              writers=("torch._dynamo.convert_frame.trace_frame",),
              or_writers=("torch._dynamo.convert_frame.preserve_global_state",), option=CONCURRENT),
    # True while a compile traces a function it must inline whole (_force_inline,
    # around utils._make_inlined); check_verbose then skips nothing.  Read in every
    # thread's frame callback: another thread's cache miss compiled a frame dynamo
    # skips (Module._wrapped_call_impl instead of the module's forward).
    PerThread("torch._dynamo.trace_rules", "_force_inline_flag", False, option=CONCURRENT),
    # make_fx's decomposition table and the aten op being traced (<= 2.12;
    # 2.13 keeps ORIGINAL_ATEN in a ContextVar and the table elsewhere).
    PerThread("torch.fx.experimental.proxy_tensor", "CURRENT_DECOMPOSITION_TABLE", factory=dict, option=CONCURRENT),
    PerThread("torch.fx.experimental.proxy_tensor", "ORIGINAL_ATEN", None, option=CONCURRENT),
)

# Class attributes inductor swaps for the length of a lowering context and reads
# in every new IR node: another thread's lowering gave its nodes our FX origins
# (or stream, mempool), realized our buffers, and interleaved exits left a dead
# graph's values for good.
IR = "torch._inductor.ir"
TRITON_BUNDLER = "torch._inductor.triton_bundler.TritonBundler"
CLASS_ATTRS: tuple[ClassAttr, ...] = (
    ClassAttr(f"{IR}.IRNode._current_origins", (f"{IR}.IRNode.current_origins",), empty=True),
    ClassAttr(f"{IR}.IRNode._current_stream_idx", (f"{IR}.IRNode.current_stream_idx",)),  # 2.13+
    ClassAttr(f"{IR}.IRNode._current_mempool", (f"{IR}.IRNode.current_mempool",)),  # 2.14+
    ClassAttr(f"{IR}.ComputedBuffer._force_realize", (f"{IR}.ComputedBuffer.force_realize",),
              default=False),
    # patch.object(FlexibleLayout, "allow_indexing", True) around every indexing
    # of a not yet fixed layout: one thread's exit turned it off under another's
    # ("convert FlexibleLayout to FixedLayout first"), and left it on for good.
    ClassAttr(f"{IR}.FlexibleLayout.allow_indexing", (), default=False,
              patched_in=(IR, "torch._inductor.select_algorithm", "torch._inductor.ops_handler",
                          "torch._inductor.dependencies", "torch._inductor.lowering",
                          "torch._inductor.codegen.cpp_template"),
              patch_targets=("FlexibleLayout", "ir.FlexibleLayout")),
    # patch.object(ConstantBuffer, "override_device", device): the device a
    # constant is loaded for, around a loader's calls.
    ClassAttr(f"{IR}.ConstantBuffer.override_device", (), patched_in=(IR,),
              patch_targets=("ConstantBuffer",)),
) + tuple(
    # The bundle of the inductor compile in flight (begin_compile asserts there
    # is none; CPU compiles too, where bundling into the FX graph cache is on).
    ClassAttr(f"{TRITON_BUNDLER}.{name}", (f"{TRITON_BUNDLER}.begin_compile",
                                           f"{TRITON_BUNDLER}.end_compile"),
              spellings=(f"cls.{name}",))
    for name in ("_entries", "_static_autotuners", "_winners")  # _winners: 2.13+
)

# Dynamo's one TorchFunctionModeStackStateManager (2.6+): a compile's __enter__
# saves the thread's torch-function modes in .stack and clears them, the trace
# reads .stack, __exit__ pushes it back.  Two at once: one traces with (and its
# thread ends up with) the other's modes, or "pop from empty mode stack".
INSTANCE_ATTRS: tuple[InstanceAttr, ...] = (
    InstanceAttr("torch._dynamo.variables.torch_function.torch_function_mode_stack_state_mgr"
                 ".stack", factory=list, option=CONCURRENT),
)

# One-time lazy set-up (machinery.once): two first compiles both missed the
# cache and both registered ("Duplicate pattern" from post_grad's; the others
# append duplicates), or read dynamo's half-filled builtin map (KeyError: and_).
FX_PASSES = "torch._inductor.fx_passes"
ONCE: tuple[Once, ...] = (
    Once(f"{FX_PASSES}.joint_graph.lazy_init"),  # init_once_fakemode closures
    Once(f"{FX_PASSES}.post_grad.lazy_init"),
    Once(f"{FX_PASSES}.pre_grad.lazy_init"),
    Once(f"{FX_PASSES}.freezing_patterns.lazy_init"),
    Once(f"{FX_PASSES}.fuse_attention._sfdp_init"),
    Once(f"{FX_PASSES}.pad_mm._pad_mm_init"),
    Once(f"{FX_PASSES}.misc_patterns._misc_patterns_init"),
    Once(f"{FX_PASSES}.binary_folding.binary_folding_init"),
    Once(f"{FX_PASSES}.mkldnn_fusion._mkldnn_fusion_init"),
    Once(f"{FX_PASSES}.mkldnn_fusion._mkldnn_weight_pack_init"),
    Once(f"{FX_PASSES}.quantization._register_quantization_weight_pack_pass"),  # <= 2.13
    Once(f"{FX_PASSES}.freezing_patterns.addmm_patterns_init"),
    Once("torch._inductor.codegen.common.init_backend_registration"),  # cached <= 2.14
    Once("torch._inductor.codegen.common._init_builtin_backend_registration"),  # 2.15
    Once("torch._inductor.autotune_process.get_tuning_process_pool"),
    Once("torch._inductor.autotune_process.get_tuning_thread_pool"),  # 2.15
    # `if len(MAP) > 0: return`, then fills it entry by entry (2.9+)
    Once("torch._dynamo.variables.builtin.populate_builtin_to_tensor_fn_map", memo=False,
         guards=("torch._dynamo.variables.builtin.BUILTIN_TO_TENSOR_FN_MAP",
                 "torch._dynamo.variables.builtin.BUILTIN_TO_TENSOR_RFN_MAP")),
)

# Ids allocated by `+= 1` in small functions: two compiles at once got equal
# ids (CompileId frame ids, per-frame compile counts, meta-tensor describer ids,
# which key memo tables, the linecache keys of generated GraphModule code).
# One lock around each whole (small) function (LOCKED, as the codegen lock).
_ids_lock = threading.RLock()
IDS = (("lock", lambda: _ids_lock),)
ID_LOCKS: tuple[Wrapped, ...] = (
    Wrapped("compile ids lock", (Swap("torch._dynamo.convert_frame.get_compile_id", LOCKED, IDS),),
            option=CONCURRENT, guards=("torch._dynamo.convert_frame.FRAME_COUNTER",
                                       "torch._dynamo.convert_frame.FRAME_COMPILE_COUNTER")),
    Wrapped("id allocator lock",
            (Swap("torch._subclasses.meta_utils.MetaTensorDescriber.__init__", LOCKED, IDS),),
            option=CONCURRENT, guards=("torch._subclasses.meta_utils.DESCRIBER_NEXT_ID",)),
    Wrapped("id allocator lock", (Swap("torch.fx.graph_module._EvalCacheLoader._get_key",
                                       LOCKED, IDS),), option=CONCURRENT,
            guards=("torch.fx.graph_module._loader.next_id",)),
)

# AOTAutograd traces every joint graph inside torch.autograd.detect_anomaly(),
# which turns anomaly mode on for the process (a C++ flag) and puts back what it
# found: two compiles' windows interleaved left it on for good (every autograd
# node then records a Python stack; with the node's tensor mutex held, that can
# deadlock with the GIL).  One window for all of them instead.
AOT = "torch._functorch._aot_autograd.graph_capture_wrappers"
SHARED_WINDOWS: tuple[SharedWindow, ...] = (
    SharedWindow("torch.autograd.detect_anomaly",
                 (f"{AOT}.create_joint", f"{AOT}.create_functional_call"), option=CONCURRENT),
)

# dynamo and inductor statistics, `counters[group][key] += 1` all over torch
# (machinery.exact_counters: every step in C, so exact under the GIL).
EXACT_COUNTERS = (ExactCounters("torch._dynamo.utils.counters", option=CONCURRENT),)


# -- every row, in the order prepare() plans them and status() shows them ----------
# Per-thread globals first: what the other rows wrap is their code as those leave it.
# The compile lock last: once it opens, compiles overlap.
ROWS = (PER_THREAD + CONCURRENT_PER_THREAD + PATCHING + CLASS_STATE + WRAPPED + CONFIG_DEFAULTS
        + THREADS + _cudagraphs.ROWS + (_capture_lock.ROW,) + _cudagraph_rng.ROWS + _cuda_thread.ROWS + (COMPILE_ONCE, DeviceGuardUpFront(), ClassAttrs(CLASS_ATTRS, option=CONCURRENT))
        + INSTANCE_ATTRS + (Onces(ONCE, option=CONCURRENT),) + ID_LOCKS + SHARED_WINDOWS
        + EXACT_COUNTERS + (COMPILE_LOCK,))
