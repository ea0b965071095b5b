"""Trace state follows autograd: backward run for a tracing thread sees its state, others do not.

AOTAutograd's joint tracing calls torch.autograd.grad inside make_fx; on a GPU
the backward nodes run on the device's autograd worker thread, which serves
every thread's graph tasks.  fxguard carries the tracing thread's cell there
through torch's ThreadLocalPythonObjects.  On CPU the caller runs its own
backward (case "cpu": the same property without a worker), except past the
engine's reentrant depth limit, where the engine's pool thread takes over
(case "cpu-pool": a real worker on CPU).
"""
import threading

import pytest
import torch
from guarded import both_ways, run_together, torch_races

FLAG_IS_MODULE_GLOBAL = torch_races()  # asked before any install() (it reads torch's module)
DEVICES = ["cpu", "cpu-pool", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


class Probe(torch.autograd.Function):
    """Identity whose backward records which thread ran it and what it saw."""
    records: list

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        Probe.records.append((threading.get_ident(), (torch.fx._symbolic_trace.is_fx_tracing(),
                                                      torch.compiler.is_compiling())))
        return grad


class Reenter(torch.autograd.Function):
    """Backward starts a nested backward, 62 levels down: past the engine's
    reentrant limit (60) the levels run on its pool thread, a real worker on
    CPU; the last level runs the Probe there."""

    @staticmethod
    def forward(ctx, x, depth):
        ctx.depth = depth
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        with torch.enable_grad():
            x = torch.ones(4, requires_grad=True)
            if ctx.depth < 62:
                torch.autograd.grad(Reenter.apply(x, ctx.depth + 1).sum(), x)
            else:
                Probe.apply(x).sum().backward()
        return grad, None


def run_backward(device):
    if device == "cpu-pool":
        x = torch.ones(4, requires_grad=True)
        Reenter.apply(x, 0).sum().backward()
        return
    x = torch.ones(4, device=device, requires_grad=True)
    Probe.apply(x).sum().backward()


def state_is_process_wide() -> bool:
    """The FX flag (torch <= 2.13) or is_compiling()'s flag (2.13+, set by every compile)."""
    return torch_races() or "_is_compiling_flag" in vars(torch.compiler) and \
        hasattr(torch.compiler, "_compile_session_context")


@pytest.mark.parametrize("device", DEVICES)
@both_ways(races=state_is_process_wide)
def test_backward_sees_the_state_of_the_thread_it_runs_for(guard, device):
    Probe.records = []
    a_inside, b_done = threading.Event(), threading.Event()
    who = {}

    class TracesAndBackprops(torch.nn.Module):
        def forward(self, x):
            who["a"] = threading.get_ident()
            run_backward(device)      # a real backward, started by the tracing thread
            a_inside.set()
            assert b_done.wait(30)    # B's backward runs while A is still tracing
            return x + 1

    def a():
        session = getattr(torch.compiler, "_compile_session_context", None)
        if session is None:  # torch < 2.13: is_compiling() is not set by compiles
            torch.fx.symbolic_trace(TracesAndBackprops())
            return
        with session():
            torch.fx.symbolic_trace(TracesAndBackprops())

    def b():
        try:
            assert a_inside.wait(30)
            who["b"] = threading.get_ident()
            run_backward(device)
        finally:
            b_done.set()

    run_together(a, b)
    (a_thread, a_saw), (b_thread, b_saw) = Probe.records
    if device == "cuda":  # both ran on the device's worker, not on A or B
        assert a_thread not in (who["a"], who["b"]) and b_thread == a_thread
    if device == "cpu-pool":  # both ran on the engine's pool thread
        assert a_thread not in (who["a"], who["b"]) and b_thread not in (who["a"], who["b"])
    compiling = hasattr(torch.compiler, "_compile_session_context")
    # torch >= 2.14 keeps the FX flag in its own threading.local, which fxguard
    # leaves alone: a worker sees its own (False) there (README, Limits).
    flag = device == "cpu" or FLAG_IS_MODULE_GLOBAL
    assert a_saw == (flag, compiling), "backward run for the tracing thread must see its state"
    assert b_saw == (False, False), "backward run for another thread must not"
