"""What option ``concurrent_compiles`` (off by default) makes per thread, once or
exact, so that compiles can overlap: one compile's state per thread
(``PER_THREAD``, first in the plan with every per-thread global), then
``ROWS``: class and instance attributes, one-time set-up once, ids and counters
exact.  The row that lets compiles overlap is compile_lock.py's.  What crosses
threads once compiles overlap, per torch: tools/compile_globals/FINDINGS.md
(tools/compile_globals.py lists and classifies every global the compiler writes).
"""
from __future__ import annotations

import importlib
import threading
from typing import Any

from ..machinery.exact_counters import ExactCounters
from ..machinery.once import Once, Onces
from ..machinery.per_thread_attrs import ClassAttr, ClassAttrs, InstanceAttr
from ..machinery.per_thread_globals import PerThread
from ..machinery.shared_window import SharedWindow
from ..machinery.wrapped import Swap, Wrapped
from .options import Option
from .shared_bodies import LOCKED

CONCURRENT = Option.CONCURRENT_COMPILES


def _original_forward_from_src() -> Any:
    from ..machinery import originals
    module = importlib.import_module("torch.fx.graph_module")
    return originals.get_original(module, "_forward_from_src")


PER_THREAD: tuple[PerThread, ...] = (
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

ROWS = ((ClassAttrs(CLASS_ATTRS, option=CONCURRENT),) + INSTANCE_ATTRS + (Onces(ONCE, option=CONCURRENT),)
        + ID_LOCKS + SHARED_WINDOWS + EXACT_COUNTERS)
