"""State of one compile that dynamo and inductor keep process-wide, with
dynamo's compile_lock made a no-op (what issue 23's concurrent_compiles does).

- ``torch._dynamo.convert_frame.initial_global_state``: the grad mode, autocast
  ... a frame's compile started with, which its GLOBAL_STATE guard checks.  Set
  by every compile (2.11+: saved and restored); read when an OutputGraph is made
  (2.9+: at the start of every tracing attempt, so again after a restart) and
  when guards are built (2.5-2.8: only there, at the end of the compile).  A
  thread that reads another's gets a guard on the other's grad mode, which
  dynamo's self-check rejects ("Guard failed on the same frame it was created").
- ``torch._inductor.ir.IRNode._current_origins``: the FX nodes an IR node is
  lowered from, a class attribute swapped by ``IRNode.current_origins()``; a
  thread lowering while another does gets the other's nodes, and interleaved
  exits leave a dead graph's nodes there for every later IR node.

Three ways each: ``off`` (stock), ``fxguard`` (install() without these rows) and
``rows`` (install() plus the prototypes of ``overlap_rows``); the first two must
fail (strict xfail).
"""
import threading

import pytest
import torch
import torch._dynamo.convert_frame as convert_frame
from guarded import run_together
from overlap_rows import COMPILE_GLOBALS, installed_with

HOLD = 30.0


def three_ways(races: bool = True):
    fails = pytest.mark.xfail(races, strict=True, reason="process-wide: the test must catch it")
    return pytest.mark.parametrize("way", [pytest.param("off", marks=fails),
                                           pytest.param("fxguard", marks=fails), "rows"])


@pytest.fixture
def applied(way):
    try:
        if way == "off":
            yield way
        elif way == "fxguard":
            import fxguard
            fxguard.install()
            yield way
        else:
            with installed_with(COMPILE_GLOBALS, class_attrs=True):
                yield way
    finally:  # what a stock race leaves behind, for the tests after this one
        from torch._inductor import ir
        from torch.utils._ordered_set import OrderedSet
        if not hasattr(vars(ir.IRNode).get("_current_origins"), "__get__"):
            ir.IRNode._current_origins = OrderedSet()
        if "initial_global_state" in vars(convert_frame):
            convert_frame.initial_global_state = None
        if isinstance(vars(torch.compiler).get("_is_compiling_flag"), bool):
            torch.compiler._is_compiling_flag = False  # stock's overlapping compiles leak it


class NoLock:
    """compile_lock, made a no-op: compiles of distinct frames overlap."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def no_compile_lock(monkeypatch):
    monkeypatch.setattr(convert_frame, "compile_lock", NoLock())


@three_ways("initial_global_state" in vars(convert_frame))
def test_each_compile_guards_on_its_own_threads_grad_mode(applied, no_compile_lock):
    """A (grad on) is held inside its first tracing attempt (a custom op's fake
    implementation), which then restarts at a graph break; meanwhile B (no_grad)
    compiles and is held in its backend.  A's second attempt (2.9+) or A's
    guard building (2.5-2.8) reads the global: B's, stock."""
    a_held, b_inside, a_done, seen = threading.Event(), threading.Event(), threading.Event(), {}
    name = f"fxguard_test::hold_global_state_{applied}"

    @torch.library.custom_op(name, mutates_args=())
    def hold(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @hold.register_fake
    def _(x):
        if threading.current_thread().name == "A" and not a_held.is_set():
            a_held.set()
            assert b_inside.wait(HOLD)
        return torch.empty_like(x)

    def fa(x):
        y = hold(x) * 2
        torch._dynamo.graph_break()
        return y + 1

    def fb(x):
        return x.cos()

    a_graphs = []

    def a_backend(gm, example_inputs):
        a_graphs.append(gm)
        return gm.forward

    def b_backend(gm, example_inputs):
        b_inside.set()
        assert a_done.wait(HOLD)
        return gm.forward

    def a():
        try:
            compiled = torch.compile(fa, backend=a_backend)
            seen["a"] = compiled(torch.ones(3)).tolist()
            compiles = len(a_graphs)
            seen["a again"] = compiled(torch.ones(3)).tolist()
            seen["a recompiled"] = len(a_graphs) - compiles
        except Exception as e:  # noqa: BLE001 - the stock failure is an AssertionError inside dynamo
            seen["a"] = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            a_done.set()

    def b():
        assert a_held.wait(HOLD)
        with torch.no_grad():
            seen["b"] = torch.compile(fb, backend=b_backend)(torch.zeros(3)).tolist()

    threads = [threading.Thread(target=a, name="A", daemon=True),
               threading.Thread(target=b, name="B", daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen == {"a": [3.0] * 3, "a again": [3.0] * 3, "a recompiled": 0, "b": [1.0] * 3}, seen


def origins_are_a_class_attribute() -> bool:
    from torch._inductor import ir
    return "_current_origins" in vars(ir.IRNode) and \
        not hasattr(vars(ir.IRNode)["_current_origins"], "__get__")


def fx_nodes(tag: str) -> list:
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    nodes = list(gm.graph.nodes)
    for node in nodes:
        node.meta["tag"] = tag
    return nodes


@three_ways(origins_are_a_class_attribute())
def test_ir_origins_stay_in_the_lowering_thread(applied):
    """A enters current_origins(A's nodes), B enters current_origins(B's), A
    exits, B exits.  Stock: B's IR nodes get A's FX nodes too, and B's exit
    puts A's set back for good (every later IR node, any thread, gets them)."""
    from torch._inductor import ir
    from torch.utils._ordered_set import OrderedSet
    a_in, b_in, a_out, seen = threading.Event(), threading.Event(), threading.Event(), {}
    nodes_a, nodes_b = fx_nodes("a"), fx_nodes("b")

    def tags(origins) -> list:
        return sorted({n.meta["tag"] for n in origins})

    def a():
        with ir.IRNode.current_origins(OrderedSet(nodes_a)):
            a_in.set()
            assert b_in.wait(HOLD)
            seen["a"] = tags(ir.IRNode._current_origins)
        a_out.set()

    def b():
        assert a_in.wait(HOLD)
        with ir.IRNode.current_origins(OrderedSet(nodes_b)):
            b_in.set()
            assert a_out.wait(HOLD)
            seen["b"] = tags(ir.Buffer._current_origins)  # what a new IR node copies
        seen["b after"] = tags(ir.IRNode._current_origins)

    run_together(a, b)
    seen["main after"] = tags(ir.IRNode._current_origins)
    assert seen == {"a": ["a"], "b": ["b"], "b after": [], "main after": []}, seen


@pytest.mark.parametrize("way", ["rows"])
def test_inductor_compiles_with_per_thread_origins(applied):
    """The rewritten current_origins and the descriptor are what real
    lowering uses: kernels still name their origins (cpp kernel names)."""
    import torch._inductor.utils as inductor_utils
    torch._dynamo.reset()

    def f(x):
        return (x.sin() + 1).relu()

    out, code = inductor_utils.run_and_get_code(torch.compile(f), torch.ones(8))
    assert torch.allclose(out, f(torch.ones(8)))
    assert "sin" in "".join(code), "origins reached kernel naming"
