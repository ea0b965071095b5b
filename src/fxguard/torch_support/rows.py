"""Every row fxguard plans, in order: the index.  Each feature module owns its
rows, their code templates and helpers:

- ``trace_state``: module globals a trace or compile writes and another
  thread's run-time code reads, made per thread (``PER_THREAD``); Tracer.trace's
  process-wide patches and class state, per thread (``ROWS``).
- ``concurrent_compiles``: what option ``concurrent_compiles`` (off by default)
  makes per thread (``PER_THREAD``), once or exact (``ROWS``);
  ``compile_lock``: dynamo's compile_lock no longer held across a whole compile.
- ``config_window``, ``compile_options``: config windows per thread where
  torch's config is process-wide; ``config_follows_thread``: new threads
  (``THREADS``) and autograd workers (``WORKERS``) take their thread's config
  where it is per thread.
- ``block_mask_lock``, ``graph_codegen_lock``: functions run under a lock;
  ``rng``: a compile leaves the random numbers other threads drew;
  ``eager_backward``: a torch config default changed for every thread.
- ``cudagraphs``: CUDA-graph trees (``reduce-overhead``) per thread;
  ``cudagraph_capture_lock``: torch 2.13+'s capture lock per device;
  ``cudagraph_rng``: CUDA-graph random numbers per thread, syncs wait for
  recordings; ``cuda_thread``: backwards in turn in ``cuda_graph_thread()`` blocks.
- ``kernel_tuning``: a shared Triton kernel tuned by one thread at a time.
- ``compile_once``: threads that miss dynamo's cache together share one compile;
  ``device_guard``: the CUDA device guard of a machine without a GPU, up front.
- ``shared_bodies``: what several modules' swapped bodies share.

Each row is a machinery.changes.RowKind (its option, why a torch may not need
it, how it is planned).  ``prepare.py`` turns the rows that apply to the
installed torch (facts.py) into changes, without changing anything.
"""
from __future__ import annotations

from . import (block_mask_lock, compile_lock, compile_once, compile_options, concurrent_compiles,
               config_follows_thread, config_window, cuda_thread, cudagraph_capture_lock,
               cudagraph_rng, cudagraphs, device_guard, eager_backward, graph_codegen_lock,
               kernel_tuning, rng, trace_state)

# -- every row, in the order prepare() plans them and status() shows them ----------
# Per-thread globals first: what the other rows wrap is their code as those leave it.
# The config default before THREADS in status(): new threads start with their
# starter's config.  Compile once before the compile lock, which reads what it provides.
# The compile lock last: once it opens, compiles overlap.
ROWS = (trace_state.PER_THREAD + concurrent_compiles.PER_THREAD + trace_state.ROWS
        + config_window.ROWS + compile_options.ROWS + block_mask_lock.ROWS
        + config_follows_thread.WORKERS + graph_codegen_lock.ROWS + rng.ROWS
        + eager_backward.ROWS + config_follows_thread.THREADS
        + cudagraphs.ROWS + cudagraph_capture_lock.ROWS + cudagraph_rng.ROWS + cuda_thread.ROWS
        + kernel_tuning.ROWS + compile_once.ROWS + device_guard.ROWS + concurrent_compiles.ROWS + compile_lock.ROWS)
