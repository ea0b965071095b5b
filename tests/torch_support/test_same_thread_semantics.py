"""On one thread, fxguard changes nothing that stock torch does."""
import pytest
import torch

import fxguard


def _nested_trace_outcome():
    compiled = torch.compile(lambda x: x * 3, backend="eager")

    class M(torch.nn.Module):
        def forward(self, x):
            return compiled(x)

    try:
        torch.fx.symbolic_trace(M())
        return "traced"
    except RuntimeError as e:
        return str(e).split(".")[0]


@pytest.mark.parametrize("inline", [False, True])
def test_compiled_call_inside_symbolic_trace_same_thread(inline):
    if "error_on_nested_fx_trace" not in torch._dynamo.config._config:
        pytest.skip("this torch has no error_on_nested_fx_trace switch")
    # Not monkeypatch: pytest 9.2 undoes a module attribute missing from the
    # module's __dict__ with delattr(), which hides a torch <= 2.12 config entry.
    with torch._dynamo.config.patch(error_on_nested_fx_trace=not inline):
        stock = _nested_trace_outcome()
        fxguard.install()
        assert _nested_trace_outcome() == stock
    assert stock == ("traced" if inline else
                     "Detected that you are using FX to symbolically trace a dynamo-optimized function")


def _graphs_and_breaks(fn):
    torch._dynamo.reset()
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(fn, backend=counting_backend, fullgraph=True)
    out = compiled(torch.ones(4))
    explain = torch._dynamo.explain(fn)(torch.ones(4))
    return len(graphs), explain.graph_break_count, out


# torch <= 2.8 has no is_fx_symbolic_tracing.
_CHECKER = getattr(torch.fx._symbolic_trace, "is_fx_symbolic_tracing",
                   torch.fx._symbolic_trace.is_fx_tracing)


def _uses_flags(x):
    from torch.fx._symbolic_trace import is_fx_tracing
    if is_fx_tracing() or _CHECKER() or torch.fx._symbolic_trace.is_fx_tracing():
        return x - 1
    return x + 1


def test_fullgraph_compile_of_is_fx_tracing_has_no_graph_break():
    fxguard.install()
    graphs, breaks, out = _graphs_and_breaks(_uses_flags)
    assert (graphs, breaks) == (1, 0)
    assert torch.equal(out, torch.full((4,), 2.0))


def test_fx_tracing_inside_symbolic_trace_is_true_on_that_thread():
    fxguard.install()
    seen = []

    class M(torch.nn.Module):
        def forward(self, x):
            seen.append((torch.fx._symbolic_trace.is_fx_tracing(), fxguard.is_fx_tracing(),
                         getattr(torch.fx._symbolic_trace, "_is_fx_tracing_flag", True)))
            return x + 1

    torch.fx.symbolic_trace(M())
    assert seen == [(True, True, True)]
    assert fxguard.is_fx_tracing() is False


def test_make_fx_traces_with_the_flag_set():
    from torch.fx.experimental.proxy_tensor import make_fx
    fxguard.install()
    seen = []

    def f(x):
        seen.append(fxguard.is_fx_tracing())
        return x.sin()

    make_fx(f)(torch.ones(2))
    assert seen == [True] and fxguard.is_fx_tracing() is False
