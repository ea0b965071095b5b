"""One compile's state stays in its thread when compiles overlap (concurrent_compiles).

Thread A is held inside its compile (in its backend, or inside dynamo's trace)
while thread B compiles or lowers; each scenario runs three ways
(guarded.concurrent_ways): stock torch and fxguard without the option must fail
(strict xfail), ``install(concurrent_compiles=True)`` must pass.  Where dynamo's
compile_lock keeps two compiles from overlapping, the first two ways run with it
made a no-op; the option needs no such help: A held inside its compile no longer
keeps B out.

- ``initial_global_state``: the grad mode a compile started with, which its
  GLOBAL_STATE guard checks;
- dynamo's saved torch-function mode stack (``torch_function_mode_stack_state_mgr.stack``);
- ``torch.fx.graph_module._forward_from_src``: dynamo's skip wrapper during a
  compile (a GraphModule made meanwhile in another thread got code dynamo skips);
- inductor's class attributes swapped per lowering context (``IRNode._current_origins``
  and friends, ``ComputedBuffer._force_realize``, ``TritonBundler``'s bundle).
"""
import sys
import threading

import pytest
import torch
import torch._dynamo.convert_frame as convert_frame
from guarded import apply_way, concurrent_ways, holding_op, run_together

import torch._inductor.config
from fxguard.machinery import overlay

# torch 2.5 keeps config as plain values: the option's compile lock stands down there
# (compiles one at a time), so nothing here can overlap.
pytestmark = pytest.mark.skipif(
    not all(overlay.can_overlay(e, "user_override") for e in torch._inductor.config._config.values()),
    reason="config of plain values (torch 2.5): concurrent_compiles stands down")

HOLD = 60.0


def run_named(**targets) -> None:
    """One thread per target, named as its keyword in capitals; wait for all."""
    threads = [threading.Thread(target=t, name=n.upper(), daemon=True) for n, t in targets.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * HOLD)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"


def a_until_b_then_b_until_a_done(a_held, b_held, a_done, b_inside=lambda: None):
    """Where a test holds threads A and B (once each): A until B is held there
    too, B until A is done; then ``b_inside()``, in B, still held."""
    def hold():
        me = threading.current_thread().name
        if me == "A" and not a_held.is_set():
            a_held.set()
            assert b_held.wait(HOLD)
        elif me == "B" and not b_held.is_set():
            b_held.set()
            assert a_done.wait(HOLD)
            b_inside()
    return hold


def exists(path: str) -> bool:
    """'pkg.mod:Cls.attr' is in the installed torch (in the class's own dict)."""
    import importlib
    module, _, rest = path.partition(":")
    obj = importlib.import_module(module)
    for name in rest.split("."):
        if name not in vars(obj):
            return False
        obj = vars(obj)[name]
    return True


@pytest.fixture
def clean_leftovers():
    """What a stock race leaves behind, put right for the tests after this one."""
    yield
    if "initial_global_state" in vars(convert_frame):
        convert_frame.initial_global_state = None
    if isinstance(vars(torch.compiler).get("_is_compiling_flag"), bool):
        torch.compiler._is_compiling_flag = False  # stock's overlapping compiles leak it
    from torch._dynamo.variables import torch_function
    mgr = torch_function.torch_function_mode_stack_state_mgr
    if isinstance(vars(mgr).get("stack"), list):
        mgr.__dict__["stack"] = []
    import torch.fx.graph_module as graph_module
    if vars(graph_module).get("_forward_from_src") is not convert_frame.original_forward_from_src \
            and "_forward_from_src" in vars(graph_module):
        graph_module._forward_from_src = convert_frame.original_forward_from_src


# -- initial_global_state ------------------------------------------------------------

@concurrent_ways("initial_global_state" in vars(convert_frame))
@pytest.mark.slow
def test_each_compile_guards_on_its_own_threads_grad_mode(way, monkeypatch, clean_leftovers):
    """A (grad on) is held inside its first tracing attempt (a custom op's fake
    implementation), which then restarts at a graph break; meanwhile B
    (no_grad) compiles and is held in its backend.  A's second attempt (2.9+)
    or A's guard building reads the global: B's, stock."""
    apply_way(way, monkeypatch, lock_hides=True)
    a_held, b_inside, a_done, seen = threading.Event(), threading.Event(), threading.Event(), {}

    def hold_a_once():
        if threading.current_thread().name == "A" and not a_held.is_set():
            a_held.set()
            assert b_inside.wait(HOLD)

    hold = holding_op(f"fxguard_test::hold_global_state_{way.replace(' ', '_')}", hold_a_once)

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
        except Exception as e:  # noqa: BLE001 - the stock failure is an error inside dynamo
            seen["a"] = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            a_done.set()

    def b():
        assert a_held.wait(HOLD)
        with torch.no_grad():
            seen["b"] = torch.compile(fb, backend=b_backend)(torch.zeros(3)).tolist()

    run_named(a=a, b=b)
    assert seen == {"a": [3.0] * 3, "a again": [3.0] * 3, "a recompiled": 0, "b": [1.0] * 3}, seen


# -- config patches made inside a compile ---------------------------------------------

def config_is_process_wide() -> bool:
    from fxguard.torch_support import facts
    return not facts.config_is_per_thread()


@concurrent_ways(config_is_process_wide)
def test_a_compiles_config_patch_stays_in_that_compile(way, monkeypatch):
    """Inductor patches its config inside a compile (``with config.patch(...)``).
    A is held inside such a patch (in its backend); B's compile reads the
    config, then patches it itself and ends after A's patch.  torch <= 2.11
    keeps config process-wide: B read A's value, and B's patch put A's value
    back for good."""
    import torch._inductor.config as inductor_config
    apply_way(way, monkeypatch, lock_hides=True)
    before = inductor_config.inplace_buffers
    a_in, b_in, a_out, seen = threading.Event(), threading.Event(), threading.Event(), {}

    def a_backend(gm, example_inputs):
        with inductor_config.patch(inplace_buffers=not before):
            a_in.set()
            assert b_in.wait(HOLD)
        a_out.set()
        return gm.forward

    def b_backend(gm, example_inputs):
        seen["b reads"] = inductor_config.inplace_buffers
        try:
            with inductor_config.patch(inplace_buffers=not before):
                b_in.set()
                assert a_out.wait(HOLD)
        finally:
            b_in.set()
        return gm.forward

    def a():
        torch.compile(lambda x: x + 3, backend=a_backend)(torch.ones(2))

    def b():
        assert a_in.wait(HOLD)
        torch.compile(lambda x: x * 4, backend=b_backend)(torch.ones(2))

    try:
        run_named(a=a, b=b)
        seen["after"] = inductor_config.inplace_buffers
    finally:
        inductor_config.inplace_buffers = before
    assert seen == {"b reads": before, "after": before}, seen


# -- anomaly mode around AOTAutograd's joint trace ---------------------------------------

@concurrent_ways()
def test_overlapping_joint_traces_leave_anomaly_mode_off(way, monkeypatch):
    """AOTAutograd traces every forward+backward inside
    ``torch.autograd.detect_anomaly()``, which sets anomaly mode for the process
    and puts back what it found.  A is held inside its joint trace until B's
    has begun; B until A's has ended.  Stock: B's window was off while B was in
    it, and on for good after (every autograd node then records a stack)."""
    apply_way(way, monkeypatch, lock_hides=True)
    a_held, b_held, a_done, seen = threading.Event(), threading.Event(), threading.Event(), {}

    def in_joint_trace() -> bool:  # this thread's AOTAutograd joint trace, not dynamo's
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_name == "inner_fn_with_anomaly":
                return True
            frame = frame.f_back
        return False

    def b_inside():
        seen["b inside its trace"] = torch.is_anomaly_enabled()

    a_then_b = a_until_b_then_b_until_a_done(a_held, b_held, a_done, b_inside)
    hold = holding_op(f"fxguard_test::hold_joint_{way.replace(' ', '_')}",
                      lambda: in_joint_trace() and a_then_b())
    hold.register_autograd(lambda ctx, grad: grad)

    def a():
        try:
            x = torch.ones(3, requires_grad=True)
            torch.compile(lambda x: hold(x).sin(), backend="aot_eager")(x)
        finally:
            a_done.set()

    def b():
        assert a_held.wait(HOLD)
        try:
            x = torch.ones(3, requires_grad=True)
            torch.compile(lambda x: hold(x).cos(), backend="aot_eager")(x)
        finally:
            b_held.set()

    try:
        run_named(a=a, b=b)
        seen["after"] = torch.is_anomaly_enabled()
    finally:
        torch.set_anomaly_enabled(False)
    assert seen == {"b inside its trace": True, "after": False}, seen


# -- dynamo's saved torch-function mode stack ----------------------------------------

def mode_stack_is_shared() -> bool:
    from torch._dynamo.variables import torch_function
    mgr = getattr(torch_function, "torch_function_mode_stack_state_mgr", None)
    return mgr is not None and "stack" in vars(mgr)


@pytest.mark.skipif(not mode_stack_is_shared(), reason="torch <= 2.5: no saved mode stack")
@concurrent_ways(mode_stack_is_shared)
def test_each_compile_keeps_its_threads_torch_function_modes(way, monkeypatch, clean_leftovers):
    """A compiles under its TorchFunctionMode and is held in its backend (dynamo
    has saved A's modes and cleared them from A's thread); B compiles under
    another mode meanwhile.  When A's compile ends, A's thread must have its own
    mode back.  Stock: B's compile overwrote the saved stack, and A ends up with
    none ("pop from empty mode stack" when its with-block exits)."""
    from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
    apply_way(way, monkeypatch, lock_hides=True)

    class Tag(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    a_inside, b_done, seen = threading.Event(), threading.Event(), {}

    def a_backend(gm, example_inputs):
        a_inside.set()
        assert b_done.wait(HOLD)
        return gm.forward

    def a():
        mode = Tag()
        try:
            with mode:
                seen["a out"] = torch.compile(lambda x: x * 3, backend=a_backend)(
                    torch.ones(2)).tolist()
                seen["a modes"] = [m is mode for m in _get_current_function_mode_stack()]
        except Exception as e:  # noqa: BLE001 - stock: RuntimeError popping an empty stack
            seen["a"] = f"{type(e).__name__}: {e}"

    def b():
        assert a_inside.wait(HOLD)
        try:
            with Tag():
                seen["b out"] = torch.compile(lambda x: x - 1, backend="eager")(
                    torch.ones(2)).tolist()
            seen["b modes"] = len(_get_current_function_mode_stack())
        finally:
            b_done.set()

    run_together(a, b, timeout=2 * HOLD)
    assert seen == {"a out": [3.0, 3.0], "a modes": [True], "b out": [0.0, 0.0],
                    "b modes": 0}, seen


# -- _forward_from_src ---------------------------------------------------------------

@concurrent_ways()
def test_overlapping_compiles_leave_graph_module_codegen_as_it_was(way, monkeypatch,
                                                                  clean_leftovers):
    """Every compile swaps dynamo's skip wrapper into
    ``torch.fx.graph_module._forward_from_src`` and puts back what it found.  A
    is held inside its trace until B's trace has begun, B until A's compile has
    ended.  Stock: B saved A's wrapper and puts it back last, for good; every
    GraphModule made afterwards, in any thread, gets code marked for dynamo to
    skip.  Meanwhile a thread that compiles nothing sees a compile's wrapper."""
    import torch.fx.graph_module as graph_module
    apply_way(way, monkeypatch, lock_hides=True)
    original = convert_frame.original_forward_from_src
    a_held, b_held, a_done, seen = threading.Event(), threading.Event(), threading.Event(), {}
    hold = holding_op(f"fxguard_test::hold_codegen_{way.replace(' ', '_')}",
                      a_until_b_then_b_until_a_done(a_held, b_held, a_done))

    def a():
        try:
            torch.compile(lambda x: hold(x) + 1, backend="eager")(torch.ones(2))
        finally:
            a_done.set()

    def b():
        assert a_held.wait(HOLD)
        try:
            torch.compile(lambda x: hold(x) * 2, backend="eager")(torch.ones(2))
        finally:
            b_held.set()

    def outside():  # a thread between the two compiles' windows, compiling nothing
        assert a_held.wait(HOLD)
        seen["outside a compile"] = graph_module._forward_from_src is original

    run_named(a=a, b=b, outside=outside)
    seen["after both"] = graph_module._forward_from_src is original
    assert seen == {"outside a compile": True, "after both": True}, seen


# -- class attributes swapped per lowering context -------------------------------------

def fx_nodes(tag: str) -> list:
    nodes = list(torch.fx.symbolic_trace(lambda x: x + 1).graph.nodes)
    for node in nodes:
        node.meta["tag"] = tag
    return nodes


def origins_case():
    from torch._inductor import ir
    from torch.utils._ordered_set import OrderedSet

    def enter(tag):
        return ir.IRNode.current_origins(OrderedSet(fx_nodes(tag)))

    def read():  # what a new IR node copies (through a subclass, as they do)
        return sorted({n.meta["tag"] for n in ir.Buffer._current_origins})
    return enter, read, {"a": ["a"], "b": ["b"], "b after": [], "main": []}


def value_case(context: str, attr: str, a, b, none=None):
    def case():
        from torch._inductor import ir
        return ((lambda tag: getattr(ir.IRNode, context)(a if tag == "a" else b)),
                (lambda: getattr(ir.IRNode, attr)),
                {"a": a, "b": b, "b after": none, "main": none})
    return case


def force_realize_case():
    from torch._inductor import ir
    return ((lambda tag: ir.ComputedBuffer.force_realize()),
            (lambda: ir.ComputedBuffer._force_realize),
            {"a": True, "b": True, "b after": False, "main": False})


def bundler_case():
    from torch._inductor.triton_bundler import TritonBundler
    import contextlib

    @contextlib.contextmanager
    def bundle(tag):
        TritonBundler.begin_compile()  # stock: asserts that no compile is bundling
        try:
            TritonBundler.put(f"kernel-{tag}", 0)
            yield
        finally:
            TritonBundler.end_compile()

    def read():
        entries = TritonBundler._entries
        return None if entries is None else [e.kernel_hash for e in entries]
    return bundle, read, {"a": ["kernel-a"], "b": ["kernel-b"], "b after": None, "main": None}


def bundler():
    """torch's TritonBundler; None where this torch has none (2.5)."""
    try:
        from torch._inductor.triton_bundler import TritonBundler
    except ImportError:
        return None
    return TritonBundler


def bundling_on() -> bool:
    return bundler() is not None and bundler().is_enabled()


IR = "torch._inductor.ir:"
CASES = [
    pytest.param(origins_case, id="IRNode._current_origins"),
    pytest.param(value_case("current_stream_idx", "_current_stream_idx", 1, 2), id="_current_stream_idx",
                 marks=pytest.mark.skipif(not exists(IR + "IRNode._current_stream_idx"),
                                          reason="torch <= 2.12")),
    pytest.param(value_case("current_mempool", "_current_mempool", (1, 1), (2, 2)), id="_current_mempool",
                 marks=pytest.mark.skipif(not exists(IR + "IRNode._current_mempool"),
                                          reason="torch <= 2.13")),
    pytest.param(force_realize_case, id="ComputedBuffer._force_realize"),
    pytest.param(bundler_case, id="TritonBundler",
                 marks=pytest.mark.skipif(not bundling_on(), reason="bundling off in this torch")),
]


@pytest.fixture
def clean_class_attrs():
    yield
    from torch._inductor import ir
    from torch.utils._ordered_set import OrderedSet
    bundles = [(bundler(), name, None) for name in ("_entries", "_static_autotuners", "_winners")]
    for cls, name, value in ((ir.IRNode, "_current_origins", OrderedSet()),
                             (ir.IRNode, "_current_stream_idx", None),
                             (ir.IRNode, "_current_mempool", None),
                             (ir.ComputedBuffer, "_force_realize", False),
                             (ir.FlexibleLayout, "allow_indexing", False),
                             (ir.ConstantBuffer, "override_device", None),
                             *(bundles if bundler() else ())):
        if name in vars(cls) and not hasattr(type(vars(cls)[name]), "__get__"):
            setattr(cls, name, value)


@pytest.mark.parametrize("case", CASES)
@concurrent_ways()
def test_lowering_context_stays_in_its_thread(case, way, monkeypatch, clean_class_attrs):
    """A enters its context, B enters its own, A exits, B reads, B exits.
    Stock: B reads A's value (or, for the bundle, its begin asserts), and B's
    exit puts A's value back for every later IR node, in every thread."""
    enter, read, expected = case()
    apply_way(way, monkeypatch, lock_hides=False)
    a_in, b_in, a_out, seen = threading.Event(), threading.Event(), threading.Event(), {}

    def a():
        with enter("a"):
            seen["a"] = read()
            a_in.set()
            assert b_in.wait(HOLD)
        a_out.set()

    def b():
        assert a_in.wait(HOLD)
        try:
            with enter("b"):
                b_in.set()
                assert a_out.wait(HOLD)
                seen["b"] = read()
            seen["b after"] = read()
        except AssertionError as e:
            seen["b"] = f"AssertionError {e}"
        finally:
            b_in.set()

    run_together(a, b)
    seen["main"] = read()
    assert seen == expected, seen


@concurrent_ways()
def test_layout_indexing_allowed_only_in_the_thread_that_allows_it(way, monkeypatch,
                                                                  clean_class_attrs):
    """inductor wraps every indexing of a not yet fixed layout in
    ``patch.object(FlexibleLayout, "allow_indexing", True)`` (here: counting an
    IR node's ops).  A inside its patch, B inside its own, A's ends, B still
    inside reads it.  Stock: False under B (inductor then asserts "convert
    FlexibleLayout to FixedLayout first"), and True for good once B's ends."""
    from torch._inductor import ir
    from torch._inductor.virtualized import ops
    apply_way(way, monkeypatch, lock_hides=False)
    a_in, b_in, a_out, seen = threading.Event(), threading.Event(), threading.Event(), {}

    def node(inner):
        return ir.Pointwise(device=torch.device("cpu"), dtype=torch.float32, inner_fn=inner,
                            ranges=[4])

    def inner_a(index):
        seen["a"] = ir.FlexibleLayout.allow_indexing
        a_in.set()
        assert b_in.wait(HOLD)
        return ops.constant(1.0, torch.float32)

    def inner_b(index):
        b_in.set()
        assert a_out.wait(HOLD)
        seen["b"] = ir.FlexibleLayout.allow_indexing
        return ops.constant(2.0, torch.float32)

    def a():
        node(inner_a).inner_fn_opcount()
        a_out.set()

    def b():
        assert a_in.wait(HOLD)
        try:
            node(inner_b).inner_fn_opcount()
        finally:
            b_in.set()
        seen["b after"] = ir.FlexibleLayout.allow_indexing

    run_together(a, b)
    seen["main"] = ir.FlexibleLayout.allow_indexing
    assert seen == {"a": True, "b": True, "b after": False, "main": False}, seen


@pytest.mark.parametrize("way", ["on"])
@pytest.mark.slow
def test_inductor_compiles_with_per_thread_origins(way, monkeypatch):
    """The rewritten writers and the descriptors are what real lowering uses:
    kernels still name their origins (cpp kernel names)."""
    import torch._inductor.utils as inductor_utils
    apply_way(way, monkeypatch, lock_hides=False)

    def f(x):
        return (x.sin() + 1).relu()

    out, code = inductor_utils.run_and_get_code(torch.compile(f), torch.ones(8))
    assert torch.allclose(out, f(torch.ones(8)))
    assert "sin" in "".join(code), "origins reached kernel naming"
