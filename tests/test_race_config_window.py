"""Race: another thread's dynamo compile runs inside _set_compilation_env's config window.

_set_compilation_env sets process-global torch._dynamo.config.allow_empty_graphs
and capture_scalar_outputs for its window; a compile on another thread during
that window compiles under them (torch <= 2.12; 2.13 keeps config overrides in
ContextVars, so there each thread has its own and nothing races).
"""
import threading

import torch
from guarded import both_ways, run_together
from torch._higher_order_ops.utils import _set_compilation_env

from fxguard.plan import config_is_process_global

WINDOW_HOLD = 1.0  # how long the window waits for the other compile before closing


@both_ways(races=config_is_process_global)  # torch 2.13 keeps config per thread
def test_no_compile_of_another_thread_inside_the_config_window(guard):
    before = (torch._dynamo.config.capture_scalar_outputs, torch._dynamo.config.allow_empty_graphs)
    in_window, compiled, seen = threading.Event(), threading.Event(), []

    def backend(gm, example_inputs):
        seen.append((torch._dynamo.config.capture_scalar_outputs,
                     torch._dynamo.config.allow_empty_graphs))
        compiled.set()
        return gm.forward

    def window():
        with _set_compilation_env():
            in_window.set()
            compiled.wait(WINDOW_HOLD)  # stock: the compile lands in here at once

    def compile_elsewhere():
        in_window.wait(10)
        torch.compile(lambda x: x * 5 - 1, backend=backend)(torch.ones(2))

    run_together(window, compile_elsewhere)
    assert seen == [before], f"compiled under the window's config {seen[0]}"
