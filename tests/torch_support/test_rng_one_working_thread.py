"""One thread's compile leaves the default generator where stock does, and
draws stock's numbers, whatever other threads do (idle, or computing without
pause): the compile's covered draws go to a private generator whose windows
behave as stock's default's would, so skipping every restore loses nothing.
And the row's helpers never raise where no Python frame lies beneath them."""
import sys
import threading

import pytest
import torch

import fxguard


def example_value():
    """A covered site: autotuning's example input (select_algorithm)."""
    from torch._inductor.select_algorithm import AlgorithmSelectorCache
    return AlgorithmSelectorCache.generate_example_value(
        (6,), (1,), torch.device("cpu"), torch.float32, 0)


def a_compiles_draws():
    """What a compile's windows draw at covered sites, and what the thread
    draws after them: the outer window (preserve_rng_state, as around
    inductor's codegen) holds autotuning's example inputs, each in an inner
    window of its own, and an int4-style input_gen_fn draw outside them."""
    from torch._dynamo.utils import preserve_rng_state
    from torch._inductor.kernel.custom_op import _default_input_gen_fn
    torch.manual_seed(0)
    with preserve_rng_state():
        drawn = [example_value(), example_value(), _default_input_gen_fn(torch.empty(5))]
        with preserve_rng_state():
            drawn.append(_default_input_gen_fn(torch.empty(3)))
        drawn.append(_default_input_gen_fn(torch.empty(3)))
    return drawn, torch.rand(4)


@pytest.mark.parametrize("others", ["idle", "computing"])
def test_one_threads_compile_draws_and_leaves_what_stock_does(others):
    stock = a_compiles_draws()
    stop = threading.Event()
    a = torch.ones(192, 192)

    def work():
        while not stop.is_set():
            torch.mm(a, a) if others == "computing" else stop.wait(0.01)
    helpers = [threading.Thread(target=work, daemon=True) for _ in range(2)]
    for t in helpers:
        t.start()
    try:
        fxguard.install()
        guarded = a_compiles_draws()
    finally:
        stop.set()
        for t in helpers:
            t.join(60)
    for want, got in zip(stock[0], guarded[0]):
        assert torch.equal(want, got), "the compile drew other numbers than stock's"
    assert torch.equal(stock[1], guarded[1]), "the default generator is not where stock leaves it"


def test_a_thread_that_draws_during_the_window_is_not_rewound():
    fxguard.install()
    from torch._dynamo.utils import preserve_rng_state
    inside, drew = threading.Event(), threading.Event()
    theirs = []

    def other():
        assert inside.wait(60)
        theirs.append(torch.rand(4))
        drew.set()
    t = threading.Thread(target=other, daemon=True)
    t.start()
    torch.manual_seed(0)
    with preserve_rng_state():
        inside.set()
        assert drew.wait(60)
    t.join(60)
    mine = torch.rand(4)
    assert not torch.equal(mine, theirs[0]), "the other thread's draw was repeated"


@pytest.mark.parametrize("how", ["a thread's target", "atexit"])
@pytest.mark.slow
def test_no_python_caller_is_served_as_stock(how, tmp_path):
    """get_rng_state / set_rng_state as a bare _thread target or atexit
    callback: no Python frame beneath them, so no site, served as stock."""
    import subprocess
    import textwrap
    script = textwrap.dedent(f"""
        import _thread, atexit, sys, threading, time, torch, torch._dynamo
        import fxguard
        fxguard.install()
        raised = []
        sys.unraisablehook = lambda u: raised.append(repr(u.exc_value))
        if {how!r} == "atexit":  # run last to first: the print last
            atexit.register(lambda: print("raised:", raised))
            atexit.register(torch.random.set_rng_state, torch.random.get_rng_state())
            atexit.register(torch.random.get_rng_state)
        else:
            torch.manual_seed(1)
            wanted = torch.random.get_rng_state()
            torch.manual_seed(0)
            _thread.start_new_thread(torch.random.set_rng_state, (wanted,))
            deadline = time.monotonic() + 120  # a hang guard: it ends at once
            while not raised and not torch.equal(torch.random.get_rng_state(), wanted):
                assert time.monotonic() < deadline, "the thread never set the state"
                time.sleep(0.001)
            print("raised:", raised)
    """)
    from guarded import child_env
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=child_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Error" not in out.stderr and "raised: [" not in out.stdout.replace("raised: []", ""), (
        out.stdout + out.stderr[-2000:])
