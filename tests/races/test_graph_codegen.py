"""Two threads generating one FX graph's code at once (Graph.python_code).

python_code points every node's _repr_fn at its own namespace for the length
of the call and, on exit, puts back what it found.  That happens whenever two
threads make the first call of one fresh lazy GraphModule together (compile
once hands one compile to every waiting thread at once).  Forced interleaving:
A is held inside its code generation; B starts its own; once B is held there
too (stock) or waits for A (fxguard), A finishes, then B.  Stock: B puts back
A's repr functions, so the graph's nodes keep A's finished namespace for good.
"""
import sys
import threading
import time

import torch
from guarded import both_ways, run_together

WAIT = 10.0  # seconds any thread waits for another before the test fails


class Hold:
    """Holds the thread that armed it at its first emit_node call, inside
    python_code (after the nodes' repr was pointed at its namespace)."""

    def __init__(self) -> None:
        self.inside, self.release = threading.Event(), threading.Event()

    def arm(self) -> None:
        def hook(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "emit_node":
                sys.setprofile(None)
                self.inside.set()
                assert self.release.wait(WAIT), "never released"
        sys.setprofile(hook)


def codegen_lock_waiters() -> int:
    namespace = vars(torch.fx.graph).get("__fxguard_Graph_python_code__")
    return namespace.lock.stats()["waiters"] if namespace is not None else 0


def net(x):
    return torch.relu(x.sin() * 2) + x.cos()


def always_races() -> bool:
    return True  # every torch so far swaps _repr_fn on the shared nodes


@both_ways(always_races)
def test_two_threads_generate_one_graphs_code(guard):
    graph = torch.fx.symbolic_trace(net).graph
    alone = graph.python_code("self").src
    a, b, got = Hold(), Hold(), {}
    done = {"a": threading.Event(), "b": threading.Event()}

    def thread(hold, name):
        def run():
            hold.arm()
            try:
                got[name] = graph.python_code("self").src
            finally:
                sys.setprofile(None)
                done[name].set()
        return run

    def conductor():
        assert a.inside.wait(WAIT)
        b_started.set()
        deadline = time.monotonic() + WAIT  # against a hang only
        while not (b.inside.is_set() or codegen_lock_waiters()):  # B held, or waiting for A
            assert time.monotonic() < deadline, "B is neither inside nor waiting"
            time.sleep(0.001)
        a.release.set()  # A finishes first (stock: restores what it found), then B
        assert done["a"].wait(WAIT)
        b.release.set()

    b_started = threading.Event()

    def thread_b():
        assert b_started.wait(WAIT)
        thread(b, "b")()

    run_together(thread(a, "a"), thread_b, conductor)
    assert got == {"a": alone, "b": alone}
    assert all(node._repr_fn is None for node in graph.nodes), \
        "the nodes' repr still points at a finished code generation's namespace"
