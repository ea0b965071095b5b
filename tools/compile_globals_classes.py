"""The classes tools/compile_globals.py gives the compiler's globals: a table
keyed by module:name (the same across torch versions), rules by pattern, and
inductor's test-helper patches.  Data only; the tool reads it."""
from __future__ import annotations

# (class, why).  Keys are module:name, the same across torch versions.

PT, ROW, ONCE, LOCK, OK = "per-thread", "row", "once", "locked", "harmless"

CLASSIFY: dict[str, tuple[str, str]] = {
    # per thread: one compile's state another thread reads
    "torch.utils._python_dispatch:_is_in_torch_dispatch_mode": (
        PT, "mode flags saved/restored by every TorchDispatchMode; the mode stack is per thread "
            "(tests/races/test_dispatch_mode_flags.py; trace_state.PER_THREAD)"),
    "torch.utils._python_dispatch:_is_in_non_infra_torch_dispatch_mode": (
        PT, "as above; dynamo skips frames on it (2.5-2.8)"),
    "torch.utils._python_dispatch:_is_in_any_mode_without_ignore_compile_internals": (
        PT, "as above (2.9+); dynamo skips frames on it (2.9-2.10; 2.11+ with "
            "inline_torch_dispatch_torch_compile off); C++ mirror is thread_local"),
    "torch._dynamo.convert_frame:initial_global_state": (
        PT, "grad/autocast state the frame's GLOBAL_STATE guard checks "
            "(tests/races/test_overlapping_compiles_state.py; concurrent_compiles.PER_THREAD)"),
    "torch._inductor.ir:IRNode._current_origins": (
        PT, "FX nodes of the node being lowered; interleaved exits leave a dead graph's "
            "(concurrent_compiles.CLASS_ATTRS)"),
    "torch._inductor.ir:IRNode._current_stream_idx": (PT, "same pattern as _current_origins (2.12+)"),
    "torch._dynamo.variables.torch_function:torch_function_mode_stack_state_mgr.stack": (
        PT, "the compiling thread's torch-function modes, saved for the trace and pushed back "
            "at exit: another thread traces with/ends up with them "
            "(concurrent_compiles.INSTANCE_ATTRS; 'trying to pop from empty mode stack')"),
    "torch._dynamo.eval_frame:_in_optimized_module": (
        PT, "set around OptimizedModule.__call__ at run time (survey: not yet a row)"),
    "torch._dynamo.compiled_autograd:in_compiled_autograd_region": (
        PT, "compiled autograd state of the thread running backward"),
    "torch._dynamo.compiled_autograd:compiled_autograd_enabled": (
        PT, "compiled autograd enable flag: set by the thread that enables it"),
    "torch._dynamo.compiled_autograd:compiled_autograd_enabled_force_eager": (PT, "same"),
    "torch._dynamo.compiled_autograd:depth": (PT, "nesting depth of the enabling thread"),
    "torch._dynamo.compiled_autograd:active_disable_ctx": (
        PT, "set/reset around a compile (seen mid-compile): another thread's nested "
            "compiled-autograd decision reads it"),
    "torch._functorch.eager_transforms:JVP_NESTING": (PT, "functorch jvp nesting level of a thread"),
    "torch._subclasses.fake_tensor:RECURSION_COUNT": (
        PT, "FakeTensor repr recursion guard (a thread's repr)"),
    "torch.fx.experimental.recording:NEST": (PT, "ShapeEnv event recording nesting"),
    "torch._dynamo.trace_rules:_force_inline_flag": (PT, "force-inline context of one trace"),
    "torch._higher_order_ops.local_map:_DEFER_INLINING": (PT, "context flag of one trace"),
    "torch._dynamo.utils:_error_on_graph_break": (PT, "error_on_graph_break() context of one trace"),
    "torch._dynamo.utils:_recompile_user_contexts": (PT, "context of one compile"),
    "torch._dynamo.utils:curr_frame": (
        LOCK, "frame counter (+=) read as a frame key: two frames can get one key; "
              "lock or itertools.count()"),
    "torch._dynamo.convert_frame:FRAME_COUNTER": (
        LOCK, "frame id (`+= 1`, not atomic): two compiles can get one frame_id -> equal "
              "CompileIds; lock the increment or itertools.count()"),
    "torch._dynamo.convert_frame:FRAME_COMPILE_COUNTER": (
        LOCK, "per-frame compile counts (`[id] += 1`): exact only under a lock"),
    "torch._dynamo.utils:op_count": (LOCK, "statistic (`+=`): exact only under a lock"),
    "torch._functorch._aot_autograd.logging_utils:graph_being_compiled": (
        PT, "names the graph being compiled (debug dumps, aot_graph_name): another thread's "
            "compile renames it"),
    "torch._functorch._aot_autograd.logging_utils:nth_graph": (PT, "same (graph index in names)"),
    "torch._functorch._aot_autograd.logging_utils:model_name": (PT, "same"),
    "torch._functorch._aot_autograd.logging_utils:callback_set": (PT, "same"),
    "torch._inductor.debug:_pre_grad_graph_id": (
        PT, "provenance tracking of the graph being compiled (set mid-compile)"),
    "torch._inductor.debug:_inductor_post_to_pre_grad_nodes": (PT, "provenance of one compile"),
    "torch._inductor.debug:_inductor_pre_grad_node_stack_trace": (PT, "provenance of one compile"),
    "torch._inductor.debug:_inductor_kernel_stack_trace": (PT, "provenance of one compile"),
    "torch._inductor.debug:_inductor_triton_kernel_to_post_grad_node_info": (
        PT, "provenance of one compile"),
    "torch._inductor.debug:_inductor_kernel_provenance_debug_handle": (
        LOCK, "provenance handle counter (+=)"),
    "torch._dynamo.variables.builder:_DYNAMIC_SOURCES": (
        LOCK, "memo (value, config hash) written in two steps: threads with different "
              "compiler.config.dynamic_sources (per thread since 2.12) can read the other's; "
              "store one tuple"),
    "torch._dynamo.variables.builder:_DYNAMIC_SOURCES_CONFIG_HASH": (LOCK, "see _DYNAMIC_SOURCES"),
    "torch._dynamo.variables.builder:_DYNAMIC_VALUES": (LOCK, "see _DYNAMIC_SOURCES"),
    "torch._dynamo.variables.builder:_DYNAMIC_VALUES_CONFIG_HASH": (LOCK, "see _DYNAMIC_SOURCES"),
    "torch._dynamo.variables.builder:_UNBACKED_SOURCES": (LOCK, "see _DYNAMIC_SOURCES"),
    "torch._dynamo.variables.builder:_UNBACKED_SOURCES_CONFIG_HASH": (LOCK, "see _DYNAMIC_SOURCES"),
    # rows fxguard already has
    "torch.fx._symbolic_trace:_is_fx_tracing_flag": (ROW, "FX-tracing flag"),
    "torch.fx._symbolic_trace:CURRENT_PATCHER": (ROW, "per-thread global"),
    "torch.fx._symbolic_trace:Tracer._qualname_counter": (ROW, "per-thread class state"),
    "torch.fx.traceback:current_meta": (ROW, "node meta"),
    "torch.fx.traceback:current_replay_node": (ROW, "node meta"),
    "torch.fx.traceback:should_preserve_node_meta": (ROW, "node meta"),
    "torch.fx.traceback:_should_preserve_node_meta": (ROW, "node meta"),
    "torch.fx.experimental.proxy_tensor:_CURRENT_MAKE_FX_TRACER": (ROW, "make_fx tracer"),
    "torch.fx.experimental.proxy_tensor:_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT": (ROW, "export"),
    "torch.fx._lazy_graph_module:_use_lazy_graph_module_flag": (ROW, "lazy GraphModule flag"),
    "torch.fx._lazy_graph_module:_force_skip_lazy_graph_module_flag": (ROW, "lazy GraphModule flag"),
    "torch.compiler:_is_compiling_flag": (ROW, "is_compiling()"),
    # once
    "torch._dynamo.variables.builtin:BUILTIN_TO_TENSOR_FN_MAP": (
        ONCE, "filled lazily by populate_builtin_to_tensor_fn_map (2.9+), which returns early "
              "once it has one entry: KeyError in a second compile; once-lock around it"),
    "torch._dynamo.variables.builtin:BUILTIN_TO_TENSOR_RFN_MAP": (ONCE, "same"),
    "torch._inductor.pattern_matcher:_known_precompiled_patterns": (
        ONCE, "appended by pattern registration: covered by the set-up's once-lock"),
    "torch._inductor.fx_passes.joint_graph:patterns.patterns": (
        ONCE, "pattern registry: filled by the lazy set-up (once-locked), then read"),
    "torch._inductor.fx_passes.joint_graph:patterns.seen_patterns": (ONCE, "same"),
    "torch._dynamo.bytecode_transformation:_cached_cleaned_instructions": (
        OK, "memo of decoded instructions (callers copy them)"),
    "torch._subclasses.fake_impls:get_fast_op_impls": (
        OK, "fills FAST_OP_IMPLEMENTATIONS with the same impls each time: twice is equal"),
    "torch._dynamo.variables.torch:TorchInGraphFunctionVariable._get_handlers": (
        OK, "memo of a handler table"),
    "torch._functorch.predispatch:DECOMPOSITIONS_LOADED": (
        OK, "torch's own once-flag under DECOMPOSITIONS_LOCK (a threading.Lock)"),
    "torch._functorch.predispatch:DECOMPOSITIONS_LOCK": (OK, "the lock itself, made once"),
    "torch._functorch.predispatch:VMAP_DECOMPOSITIONS_LIB": (OK, "set under DECOMPOSITIONS_LOCK"),
    "torch._dynamo.device_interface:_device_initialized": (
        ONCE, "lazy device-interface registration flag: set after registering; two first "
              "calls register twice (idempotent dict inserts: harmless today)"),
    "torch._inductor.codegen.common:_device_op_overrides_initialized": (
        ONCE, "lazy init flag; the init inserts equal values: harmless twice, once-lock to be exact"),
    "torch._dynamo.guards:_CLOSURE_VARS": (
        OK, "built lazily once (dict of constants); two builds are equal"),
    "torch._inductor.select_algorithm:_ALGORITHM_SELECTOR_CACHE": (
        LOCK, "autotuning choice cache created lazily; concurrent first use makes two, one lost"
              " (benchmarks twice); lock its creation"),
    "torch._inductor.pattern_matcher:_debug_nodes_cache": (OK, "memo of an env var parse"),
    "torch._inductor.pattern_matcher:_debug_nodes_env_value_cache": (OK, "memo of an env var"),
    "torch._dynamo.pgo:_CODE_STATE": (
        LOCK, "profile-guided dynamism state, process-wide on purpose (shared across compiles); "
              "lazily loaded: lock its load/merge"),
    "torch._dynamo.pgo:_INIT_CODE_STATE": (LOCK, "see _CODE_STATE"),
    "torch._dynamo.pgo:_LOGGED_DYNAMIC_ALLOWLIST": (OK, "log-once flag"),
    "torch._dynamo.utils:CHROMIUM_EVENT_LOG": (
        OK, "trace-event logger created lazily (equal objects); its stack is per thread"),
    "torch._dynamo.utils:_compilation_metrics": (LOCK, "metrics deque: appends atomic; resets racy"),
    "torch._inductor.metrics:generated_kernel_count": (
        LOCK, "per-process statistics (`+=` not atomic, reset by tests): exact only under a lock"),
    "torch._subclasses.meta_utils:DESCRIBER_NEXT_ID": (
        LOCK, "id allocator for MetaTensorDescriber (`+= 1`): two describers can share an id "
              "(ids key memo tables); itertools.count() or lock"),
    "torch._dynamo.mutation_guard:GenerationTracker.generation": (
        OK, "process-wide generation counter on purpose (module creation generation)"),
    "torch._dynamo.utils:CleanupManager.count": (LOCK, "counter (+=)"),
    "torch._subclasses.fake_tensor:FakeTensorMode.cache": (
        OK, "class-level fake-dispatch cache keyed by everything the result depends on; dict "
            "ops atomic under the GIL"),
    "torch._subclasses.fake_tensor:FakeTensorMode.cache_hits": (LOCK, "statistics (+=)"),
    "torch._subclasses.fake_tensor:FakeTensorMode.cache_misses": (LOCK, "statistics (+=)"),
    "torch._subclasses.fake_tensor:FakeTensorMode.cache_bypasses": (LOCK, "statistics"),
    "torch.fx.graph_module:_loader.next_id": (
        LOCK, "id allocator for generated GraphModule source (`+= 1`); two graphs sharing an "
              "id share a linecache entry (wrong tracebacks); lock or itertools.count()"),
    "torch.fx.graph_module:_loader.eval_cache": (OK, "keyed by that id (see next_id)"),
    "torch.fx.graph_module:_forward_from_src": (
        PT, "swapped for dynamo's skip wrapper by every compile (preserve_global_state) and put "
            "back after: A saves orig, B saves A's wrapper, A restores, B restores the wrapper "
            "for good: then every GraphModule made outside a compile gets skipped code"),
    "torch.fx._symbolic_trace:Tracer.trace": (
        OK, "dynamo's one-time patch(): disable() wrappers, functools.cache'd"),
    "torch._inductor.codecache:PyCodeCache.modules": (
        OK, "code cache keyed by source hash: equal modules; dict ops atomic"),
    "torch._inductor.codecache:PyCodeCache.linemaps": (OK, "same key as modules"),
    "torch._inductor.codecache:CppPythonBindingsCodeCache.cache": (OK, "keyed by source hash"),
    "torch._inductor.codecache:CppPythonBindingsCodeCache._loaded_module_names": (OK, "same"),
    "torch._inductor.async_compile:CompiledTritonKernels._cache": (OK, "keyed by source hash"),
    "torch._dynamo.convert_frame:input_codes.seen": (
        OK, "Tracker of code objects (add-only, weakref callbacks); used by reset()/skipfiles"),
    "torch._dynamo.convert_frame:output_codes.seen": (OK, "same"),
    "torch._dynamo.convert_frame:always_optimize_code_objects.refs": (OK, "ExactWeakKeyDictionary, add-only"),
    "torch._dynamo.utils:orig_code_map.refs": (OK, "ExactWeakKeyDictionary, add-only"),
    "torch._dynamo.utils:orig_code_map.values": (OK, "ExactWeakKeyDictionary, add-only"),
    "torch._dynamo.convert_frame:always_optimize_code_objects.values": (OK, "same"),
    "torch._dynamo.convert_frame:input_codes.seen_ids": (OK, "part of the input_codes Tracker"),
    "torch._dynamo.convert_frame:output_codes.seen_ids": (OK, "part of the output_codes Tracker"),
    "torch._dynamo.variables.constant:CONSTANT_VARIABLE_TRUE.source_location": (OK, "see NONE"),
    "torch._dynamo.variables.constant:CONSTANT_VARIABLE_FALSE.source_location": (OK, "see NONE"),
    "torch._dynamo.utils:graph_break_reasons": (OK, "debug list of breaks (append)"),
    "torch._dynamo.utils:graph_break_dup_warning_checker.set": (OK, "warn-once set"),
    "torch._dynamo.variables.builtin:BuiltinVariable.call_function_handler_cache": (
        OK, "memo keyed by (fn, arg types): equal handlers"),
    "torch._dynamo.variables.constant:CONSTANT_VARIABLE_NONE.source_location": (
        OK, "singleton VariableTrackers; the location only feeds error messages"),
    "torch._higher_order_ops.flex_attention:flex_attention._dispatch_cache": (
        OK, "HOP dispatch memo keyed by dispatch key"),
    "torch._functorch._aot_autograd.autograd_cache:cache_stats._stats": (LOCK, "statistics"),
    "torch._inductor.compile_fx:FxCompile._compile_stats": (LOCK, "statistics"),
    "torch._inductor.codecache:FxGraphCachePickler._pickleable_type_cache": (OK, "memo by type"),
    "torch._inductor.fx_passes.misc_patterns:numpy_compat_normalization.cache": (OK, "memo"),
    "torch._dynamo.eval_frame:DynamoTLS.traced_frame_infos": (
        OK, "a field of dynamo_tls, a threading.local subclass instance: per thread already"),
    "torch._inductor.fx_passes.mkldnn_fusion:L": (
        OK, "pattern-matcher's op namespace (attribute access fills a memo of equal values)"),
    "torch.fx.experimental.symbolic_shapes:SYMPY_INTERP": (OK, "dict built lazily of constants"),
    "torch._inductor.ir:ComputedBuffer._force_realize": (
        PT, "class attribute swapped by force_realize() during lowering: another thread's "
            "lowering realizes buffers it would not (same pattern as _current_origins)"),
    "torch._inductor.triton_bundler:TritonBundler._entries": (
        PT, "class-level bundle of the compile in flight (begin_compile asserts None): two "
            "compiles at once assert, or bundle each other's kernels (triton/GPU only)"),
    "torch._inductor.triton_bundler:TritonBundler._static_autotuners": (PT, "same as _entries"),
    "torch._inductor.triton_bundler:TritonBundler._winners": (PT, "same as _entries"),
    "torch._dynamo.utils:CompileTimeInstructionCounter._counter": (
        PT, "instruction counting of the compile in flight (only with the counter enabled)"),
    "torch._dynamo.utils:CompileTimeInstructionCounter._depth": (PT, "same"),
    "torch._dynamo.utils:CompileTimeInstructionCounter._id": (PT, "same"),
    "torch._dynamo.variables.higher_order_ops:LocalMapWrappedHigherOrderVariable._enabled": (
        PT, "context flag of one trace (local_map)"),
    "torch._dynamo.variables.torch_function:TorchFunctionModeStackVariable.offset": (
        PT, "offset into the traced mode stack of one trace (reset per trace)"),
    "torch.fx.graph:CodeGen._sym_repr": (PT, "_override_sym_repr() context of one codegen"),
    "torch._dynamo.variables.object_protocol:_repr_running": (
        PT, "repr recursion guard (set of ids): a concurrent repr of the same object prints "
            "'...'; cosmetic"),
    "torch._dynamo.graph_deduplication:last_node_to_additional_deps": (
        PT, "set by one compile's graph deduplication and read later in it"),
    "torch._dynamo.graph_bytecode_inputs:index_to_bytecode_constructor": (
        PT, "user objects (streams/events) of the compile in flight; cleared by every compile's "
            "start (reset_user_object_tracking)"),
    "torch._dynamo.graph_bytecode_inputs:index_to_external_object_weakref": (
        PT, "filled at run time by compiled code (clear+update) before its graph runs: two "
            "threads' graphs with stream/event objects swap them"),
    "torch._dynamo.graph_bytecode_inputs:keep_alive": (LOCK, "append-only keep-alive list"),
    "torch._higher_order_ops.invoke_leaf_function:_makefx_next_index": (
        LOCK, "index allocator (`-= 1`) for make_fx module storage: two traces can share an index"),
    "torch._higher_order_ops.invoke_leaf_function:_makefx_module_storage": (LOCK, "see _makefx_next_index"),
    "torch._higher_order_ops.invoke_leaf_function:_leaf_function_module_retriever": (
        OK, "setter API (user configuration)"),
    "torch._dynamo.eval_frame:_stance": (OK, "torch.compiler.set_stance(): process-wide by design"),
    "torch._dynamo.backends.registry:_default_backend": (OK, "setter API"),
    "torch._dynamo.convert_frame:_bytecode_hooks": (OK, "registration API"),
    "torch._dynamo.compiled_autograd:COMPILE_COUNTER": (LOCK, "compiled-autograd graph counter"),
    "torch._dynamo.distributed:_COMPILE_PG": (
        ONCE, "lazily created process group: two first calls create two groups (collectives "
              "then mismatch across ranks); once-lock"),
    "torch._dynamo.distributed:_GUARD_PG": (ONCE, "same as _COMPILE_PG"),
    "torch._inductor.distributed_autotune:_AUTOTUNE_PG": (ONCE, "same as _COMPILE_PG"),
    "torch._dynamo.eval_frame:_EXAMPLE_INPUTS": (OK, "lazy container creation (export API)"),
    "torch._dynamo.variables.user_defined:_SAFE_C_SLOTS": (OK, "lazy memo of constants"),
    "torch.fx.experimental.dynamic_spec:_SPEC_SHAPE_ENV": (OK, "lazy singleton (export API)"),
    "torch._inductor.runtime.triton_lazy_compile:_async_compile": (
        ONCE, "lazy AsyncCompile singleton: two first uses make two pools"),
    "torch._inductor.async_compile:AsyncCompile._ready_future": (
        ONCE, "compile-worker pool warm-up future: two first compiles start two warm-ups; "
              "torch guards it with its own lock in newer releases"),
    "torch._inductor.autotune_process:AutotuneProcessPool._instance": (ONCE, "lazy singleton pool"),
    "torch._inductor.autotune_process:AutotuneProcessPool._shutdown_for_inactivity": (
        LOCK, "pool lifecycle flag"),
    "torch._inductor.autotune_process:PrecompileThreadPool._instance": (ONCE, "lazy singleton pool"),
    "torch._inductor.autoheuristic.learned_heuristic_controller:LearnedHeuristicController.heuristics_initialized": (
        ONCE, "lazy heuristic registration flag"),
    "torch._inductor.dtype_propagation:DtypePropagationOpsHandler._instance": (
        OK, "lazy stateless singleton: two are equal"),
    "torch._inductor.fx_passes.fsdp:_dedup_rs_pass": (OK, "lazy pass object, equal"),
    "torch._inductor.template_heuristics.nv_universal_gemm:_nvgemm_heuristics": (OK, "lazy, equal"),
    "torch._inductor.codegen.nv_universal_gemm.nv_universal_gemm_utils:_CUTLASS_TO_TORCH_DTYPE": (
        OK, "lazy table of constants"),
    "torch._inductor.codegen.nv_universal_gemm.kernel_cache:_kernel_by_name_cache": (
        OK, "memo keyed by kernel name"),
    "torch._inductor.codegen.mps:MetalOverrides.lgamma": (OK, "MPS: lazy special-op setup, equal"),
    "torch._inductor.codegen.triton_combo_kernel:_custom_combo_kernel_horizontal_partition_algorithm": (
        OK, "setter API"),
    "torch._inductor.scheduler:ForeachKernelSchedulerNode.group_algorithm_for_combo_kernels": (
        OK, "setter API"),
    "torch._inductor.runtime.benchmarking:_gpu_benchmark_lock_context": (OK, "setter API"),
    "torch._inductor.compile_worker.utils:_IN_TOPLEVEL_PROCESS": (
        OK, "set in compile-worker processes only"),
    "torch._inductor.compile_worker.utils:_original_parent": (OK, "compile-worker processes only"),
    "torch._inductor.compile_worker.utils:_watchdog_thread": (OK, "compile-worker processes only"),
    "torch._inductor.cudagraph_trees:MarkStepBox.mark_step_counter": (
        OK, "user API mark_step_begin(): process-wide by design (cudagraphs)"),
    "torch._inductor.debug:GRAPH_COMPILE_IDS": (OK, "debug recording (config-gated)"),
    "torch._inductor.debug:GRAPH_EXECUTION_ORDER": (OK, "debug recording (config-gated)"),
    "torch._inductor.debug:RECORD_GRAPH_EXECUTION": (OK, "debug recording (config-gated)"),
    "torch._inductor.runtime.triton_heuristics:collected_calls": (
        OK, "benchmark-kernel profiling only (config-gated)"),
    "torch._inductor.compile_fx_ext:_DebugFileFxCompile.file_index": (OK, "debug subprocess mode"),
    "torch._dynamo.device_interface:caching_worker_current_devices": (OK, "memo of device queries"),
    "torch._dynamo.device_interface:caching_worker_device_properties": (OK, "memo of device queries"),
    "torch._dynamo.pgo:_KNOWN_DYNAMIC_SOURCES": (LOCK, "see _CODE_STATE"),
    "torch._dynamo.mutation_guard:GenerationTracker.dynamic_classes": (OK, "reset API (clear)"),
    "torch._dynamo.mutation_guard:GenerationTracker.generation_values": (OK, "reset API (clear)"),
    "torch._dynamo.symbolic_convert:BytecodeDispatchTableMeta.dispatch_table": (
        OK, "built at class creation (import)"),
    "torch._functorch._aot_autograd.utils:_GRAPHSAFE_RNG_DEVICE_TYPES": (OK, "registration API"),
    "torch._functorch.compilers:graph_index": (OK, "debug graph saver backend only"),
    "torch._functorch._activation_offloading.offload_ops:_pinned_pool": (
        LOCK, "run-time pinned-memory pool of activation offloading (opt-in): shared by design, "
              "mutated by every offloading op; lock"),
    "torch._functorch._activation_offloading.offload_ops:_pool_enabled": (OK, "setter API"),
    "torch._functorch._activation_offloading.offload_ops:_pool_managed_ptrs": (LOCK, "see _pinned_pool"),
    "torch._functorch._activation_offloading.offload_ops:_transfer_streams": (LOCK, "see _pinned_pool"),
    "torch._functorch._activation_offloading.offload_ops:_wait_registry": (LOCK, "see _pinned_pool"),
    "torch.fx._lazy_graph_module:_LazyGraphModule.forward": (
        OK, "on the GraphModule's own per-instance class (GraphModule.__new__ makes one)"),
    "torch.fx.graph_module:GraphModule.__call__": (OK, "same: per-instance class"),
    "torch.fx.graph_module:GraphModule._wrapped_call": (OK, "same: per-instance class"),
    "torch.fx.graph_module:GraphModule.forward": (OK, "same: per-instance class"),
    "torch.fx.graph_module:_CodeOnlyModule.forward": (OK, "same: per-instance class"),
    "torch.fx.experimental.unification.variable:Var._id": (LOCK, "id allocator (+=), unification only"),
    "torch.fx.experimental.unification.variable:_global_logic_variables": (
        PT, "variables() context of one unification"),
    "torch.fx.passes.graph_drawer:_WEIGHT_TEMPLATE": (OK, "graph drawer (debug)"),
    "torch.fx.passes.graph_transform_observer:GraphTransformObserver.__pass_count": (
        LOCK, "pass counter for debug file names (+=)"),
    "torch.fx.experimental.proxy_tensor:CURRENT_DECOMPOSITION_TABLE": (
        PT, "make_fx's decomposition table, swapped by decompose() for a trace (<= 2.12): two "
            "AOT traces at once decompose with each other's table (inductor's vs another "
            "backend's, or pattern registration's)"),
    "torch.fx.experimental.proxy_tensor:ORIGINAL_ATEN": (
        PT, "set_original_aten_op() context: stamps node meta of one trace (<= 2.12)"),
    "torch._inductor.ir:IRNode._current_mempool": (PT, "same pattern as _current_origins"),
    "torch._inductor.debug:_inductor_kernel_extern_info": (PT, "provenance of one compile"),
    "torch._dynamo.utils:user_obj_id_to_weakref": (
        PT, "user objects of the compile in flight (older graph_bytecode_inputs)"),
    "torch._dynamo.utils:_gc_threshold_depth": (
        LOCK, "ref count of compiles that raised the gc threshold (+=/-=): interleaved, the "
              "saved threshold can be restored early or never; lock the pair"),
    "torch._dynamo.utils:_gc_threshold_saved": (LOCK, "see _gc_threshold_depth"),
    "torch._dynamo.utils:_cudagraph_override": (PT, "context of one compile (cudagraph override)"),
    "torch._dynamo.utils:_cleanup_owners": (LOCK, "cleanup bookkeeping (container)"),
    "torch._dynamo.utils:frame_phase_timing": (LOCK, "timing statistics"),
    "torch._dynamo.guards:_async_collective_tensor_type": (OK, "lazy type lookup, equal"),
    "torch._dynamo.variables.builder:_STATIC_SOURCES": (LOCK, "see _DYNAMIC_SOURCES"),
    "torch._dynamo.variables.builder:_STATIC_SOURCES_CONFIG_HASH": (LOCK, "see _DYNAMIC_SOURCES"),
    "torch._dynamo.distributed:_COMPILE_SYNC_PG": (ONCE, "same as _COMPILE_PG"),
    "torch._inductor.pattern_matcher:_seen_patterns": (ONCE, "filled by pattern registration (once-locked)"),
    "torch._inductor.codegen.common:_privateuse1_backend_init_in_progress": (
        ONCE, "re-entrancy flag of a lazy backend init"),
    "torch._inductor.autotune_process:EXIT_HANDLER_REGISTERED": (ONCE, "register atexit once"),
    "torch._inductor.choices:_registered_inductor_choices": (OK, "setter API"),
    "torch._inductor.async_compile:_pool_set": (LOCK, "set of worker pools (add/clear)"),
    "torch._inductor.ir:_NVUniversalGemmCallerClass": (OK, "lazy class creation, equal"),
    "torch._inductor.dtype_propagation:DtypePropagationOpsHandler._rules_key": (OK, "lazy memo"),
    "torch._functorch.vmap:DECOMPOSITIONS_LOADED": (OK, "torch's own once-flag under DECOMPOSITIONS_LOCK"),
    "torch._functorch.vmap:VMAP_DECOMPOSITIONS_LIB": (OK, "set under DECOMPOSITIONS_LOCK"),
    "torch._dynamo.symbolic_convert:BytecodeDistpatchTableMeta.dispatch_table": (
        OK, "built at class creation (import)"),
    "torch._dynamo.variables.torch_function:BUILTIN_TO_TENSOR_FN_MAP": (
        OK, "2.6-2.8: filled once at import (module-level call), read only after"),
    "torch._dynamo.variables.torch_function:BUILTIN_TO_TENSOR_RFN_MAP": (OK, "same"),
    "torch._inductor.comm_lowering:_bufs_to_skip_wait": (
        OK, "keyed by (id(V.graph), buffer): entries of each compile's graph stay apart; "
            "add-only set (2.6)"),
    "torch._inductor.heuristics.template.nv_universal_gemm:_nvgemm_heuristics": (OK, "lazy, equal"),
    "torch.utils._python_dispatch:TorchDispatchMode.__torch_dispatch__": (
        OK, "__init_subclass__: set on a new subclass at class creation"),
}

RULES: tuple[tuple[str, str, tuple[str, str]], ...] = (
    # (kind regex, key regex, (class, why)); first match wins
    ("cache", r".*", (OK, "pure memo (functools.cache/lru_cache: its C implementation is safe "
                          "under the GIL; two misses compute equal values, one is kept)")),
    (r".*", r"(^|\.)(_?testing|test_case|test_minifier_common|mock_cache|compiler_bisector|"
            r"benchmark_utils|bytecode_debugger|debug_utils|repro\.|profiler|testing)\b",
     (OK, "test/debug tooling: not on a compile path")),
    (r".*", r"compile_worker\.", (OK, "compile-worker processes only")),
    (r".*", r"(_TLS\.|_tls\.|tls:)", (OK, "an attribute of a threading.local: per thread already")),
    (r".*", r"_value2member_map_$", (OK, "enum's own value memo")),
    (r".*", r":counters$", (LOCK, "dynamo/inductor statistics (`counters[a][b] += 1`, not atomic); "
                                  "init_once_fakemode restores counters['inductor'] wholesale; "
                                  "exact only under one counters lock")),
    (r".*", r"^torch\._inductor\.metrics:", (LOCK, "per-process statistics (`+=`, reset by "
                                                    "tests): exact only under a lock")),
    (r".*", r"(_stat_|cache_stats|_stats$|_compile_stats|compilation_time_metrics|"
            r"cumulative_time_spent|subsystem_call_counter|_triton_kernel_metrics|"
            r"_cumulative_compile_time|_t0$)", (LOCK, "timing/statistics: exact only under a lock")),
    (r".*", r"(lowerings|fallbacks|decompositions|_BACKENDS|_COMPILER_FNS|REGISTRY|_RULES|RULES$|"
            r"rules$|op_implementations|OP_IMPLEMENTATIONS|SUPPORTED_NODES|device_codegens|"
            r"device_interfaces|custom_backend_|device_op_overrides|hop_fake_fns|"
            r"hops_that_skip|_BENCHMARK_DISPATCH|micro_gemm_configs|_side_effectful|"
            r"_custom_builtins|_illegal_names|_proxyable_classes|_wrapped_fns_to_patch|"
            r"_MARKED_WITH_COMPATIBILITY|_BACK_COMPAT_OBJECTS|COMPLEX_OPS_TABLE|"
            r"inplaceable_foreach_ops|_maybe_layout_constraints|_dont_constant_fold|"
            r"op_dtype_propagation_rules|op_requires_libdevice_fp64|POST_GRAD_FUSIONS|"
            r"PRE_GRAD_FUSIONS|pass_patterns|_registered_caches|INTERMEDIATE_HOOKS|"
            r"_aoti_compile_backends|adapters_map|_serialized_patterns|SKIP_DIRS|"
            r"_lazy_module_init|_device_context_manager_map|observed_exception_map|"
            r"_FX_METADATA_REGISTRY|_STACK_TRACE_ANCHORS|FORCE_TEST_LIST|_BACKEND_TAGS|"
            r"_KERNEL_ACCESS_OPS|SIDE_EFFECTS|BINARY_NONLINEAR_OPS|registered_pointwise_ops|"
            r"needs_realized_inputs|foreach_ops|parsed_schema_map|_device_mapping)",
     (OK, "registry filled at import or registration (decorators, register_* calls); a lazy "
          "first-use insert stores an equal value, and dict/list ops are atomic under the GIL")),
    (r".*", r"(cache|CACHE|_cache_|memo)", (OK, "memo keyed by its inputs: equal values, dict ops "
                                                "atomic under the GIL")),
    (r"module-attr", r":.*", (OK, "see the owning module's row")),
)


# inductor's test helpers (run_and_get_code, get_code, ...) patch.object classes
# for the process while they run: not on a compile path (README, Concurrent compiles).
TEST_HELPER_PATCHES = {"torch._inductor.codegen.wrapper:PythonWrapperCodegen.define_kernel",
                       "torch._inductor.graph:GraphLowering.compile_to_module",
                       "torch._inductor.graph:GraphLowering.save_output_code",
                       "torch._inductor.output_code:CompiledFxGraph.__init__",
                       "torch._inductor.scheduler:Scheduler.__init__"}
