"""Compile state stays in the compiling thread: is_compiling(), node meta, make_fx's tracer.

Thread A is held in the middle of a trace or compile by an Event; thread B,
compiling nothing, must not see A's state, A must not see B's, and B's mask
creation must not wait for A.  Each scenario runs guard-off too: on a torch
that keeps the state process-wide the test must fail (strict xfail).
"""
import threading

import pytest
import torch
import torch.fx.traceback as fx_traceback
from guarded import both_ways, needs, run_together
from torch.nn.attention.flex_attention import create_block_mask

HOLD = 30.0  # the longest any thread waits for the other


def compile_flag_leaks() -> bool:
    """torch >= 2.13 sets torch.compiler's module flag for every dynamo compile."""
    return hasattr(torch.compiler, "_compile_session_context") and \
        "_is_compiling_flag" in vars(torch.compiler)


def node_meta_is_process_global() -> bool:
    return isinstance(vars(fx_traceback).get("current_meta"), dict)


def make_fx_tracer_is_process_global() -> bool:
    from torch.fx.experimental import proxy_tensor
    return "_CURRENT_MAKE_FX_TRACER" in vars(proxy_tensor)


def causal(b, h, q, kv):
    return q >= kv


@both_ways(races=compile_flag_leaks)
def test_other_thread_is_not_compiling_and_builds_masks_while_a_compile_is_held(guard):
    inside, release, seen, order = threading.Event(), threading.Event(), {}, []

    def held_backend(gm, example_inputs):
        seen["a"] = torch.compiler.is_compiling()
        inside.set()
        assert release.wait(HOLD)
        order.append("compile ends")
        return gm.forward

    def a():
        torch.compile(lambda x: x.sin() + 7, backend=held_backend)(torch.ones(3))

    def b():
        assert inside.wait(HOLD)
        try:
            seen["b"] = torch.compiler.is_compiling()
            create_block_mask(causal, 1, 1, 256, 256, device="cpu")  # eager: no compile
            order.append("mask built")
        finally:
            release.set()

    run_together(a, b)
    compiles_set_it = hasattr(torch.compiler, "_compile_session_context")  # torch 2.13+
    assert seen["a"] is compiles_set_it, "the compiling thread itself is compiling"
    assert order == ["mask built", "compile ends"], "B's mask waited for A's compile"
    assert seen["b"] is False, "B saw A's compile"


@needs("torch.fx.traceback.annotate")  # torch >= 2.10
@both_ways(races=node_meta_is_process_global)
def test_annotate_and_preserve_node_meta_interleave_without_keyerror(guard):
    """Stock: A's preserve_node_meta exit rebinds current_meta to its saved copy
    while B is inside annotate(); B's exit then deletes a 'custom' key that the
    new dict lacks: KeyError: 'custom' (seen in create_block_mask)."""
    a_in, b_in, a_out, seen = threading.Event(), threading.Event(), threading.Event(), {}

    def a():
        with fx_traceback.preserve_node_meta():
            with fx_traceback.annotate({"owner": "a"}):
                a_in.set()
                assert b_in.wait(HOLD)
                seen["a"] = dict(fx_traceback.current_meta.get("custom", {}))
        a_out.set()

    def b():
        assert a_in.wait(HOLD)
        seen["b_before"] = "custom" in fx_traceback.current_meta
        with fx_traceback.annotate({"owner": "b"}):
            b_in.set()
            assert a_out.wait(HOLD)
            seen["b"] = dict(fx_traceback.get_current_meta().get("custom", {}))
        seen["b_after"] = "custom" in fx_traceback.current_meta

    run_together(a, b)
    assert seen == {"a": {"owner": "a"}, "b_before": False, "b": {"owner": "b"}, "b_after": False}


@both_ways(races=make_fx_tracer_is_process_global)
def test_make_fx_tracer_of_one_thread_is_invisible_to_another(guard):
    from torch.fx.experimental import proxy_tensor
    from torch.fx.experimental.proxy_tensor import make_fx
    inside, release, seen = threading.Event(), threading.Event(), {}

    def traced(x):
        inside.set()
        assert release.wait(HOLD)
        return x.cos()

    def a():
        make_fx(traced)(torch.ones(2))

    def b():
        assert inside.wait(HOLD)
        try:
            seen["b"] = proxy_tensor._CURRENT_MAKE_FX_TRACER
        finally:
            release.set()

    run_together(a, b)
    assert seen["b"] is None


@pytest.mark.slow
def test_fullgraph_compiles_of_the_rewritten_readers_have_no_graph_break():
    import contextlib

    import fxguard
    fxguard.install()
    annotate = getattr(fx_traceback, "annotate", lambda meta: contextlib.nullcontext())  # < 2.10

    def uses_state(x):
        if torch.compiler.is_compiling():  # folded to True by dynamo
            x = x + 1
        with annotate({"k": 1}):
            x = x * 2
        return x + create_block_mask(causal, 1, 1, 128, 128, device="cpu").kv_num_blocks.sum()

    torch._dynamo.reset()
    explain = torch._dynamo.explain(uses_state)(torch.zeros(2))
    assert explain.graph_break_count == 0, explain.break_reasons
    out = torch.compile(uses_state, backend="eager", fullgraph=True)(torch.zeros(2))
    assert torch.equal(out, uses_state(torch.zeros(2)) + 2)  # +1 only when compiled, doubled
