"""``cuda_graph_thread()``: a stream of its own and backwards in turn, and drafter
threads written as users write them (marker ``gpu``).

The races themselves are forced one by one in test_cuda_graph_rng.py (each
fails with the row off); here three threads run the users' steps whole: the
batch drawn from the default CUDA generator, dropout in the graphed model,
reduce-overhead on the default stream with a device sync each step.
"""
import threading
import traceback

import pytest
import torch

import fxguard
from fxguard.torch_support.cuda_thread import Pace, Turns, cuda_graph_thread, device_turns

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def installed():
    fxguard.install()
    torch._dynamo.reset()
    yield
    fxguard.uninstall()


def test_turns_serve_first_come_first():
    turns, order, asked = Turns(), [], []
    turns.__enter__()  # held: the others queue

    def ask(name):
        with turns:
            order.append(name)
    threads = []
    for i, name in enumerate("abc"):
        threads.append(threading.Thread(target=ask, args=(name,)))
        threads[-1].start()
        while turns.waiting() != i + 2:  # this one holds its ticket
            threading.Event().wait(0.001)
        asked.append(name)
    turns.__exit__(None, None, None)
    for t in threads:
        t.join(60)
    assert order == asked == ["a", "b", "c"]


def test_a_waiter_interrupted_gives_its_turn_up():
    """Ctrl-C in one thread's wait for its turn must not hang the threads after
    it: its ticket is skipped."""
    import signal
    from guarded import finish
    turns, served = Turns(), threading.Event()
    holder_in, holder_out = threading.Event(), threading.Event()

    def holder():
        with turns:
            holder_in.set()
            assert holder_out.wait(60)

    def later():
        with turns:
            served.set()
    a = threading.Thread(target=holder)
    a.start()
    assert holder_in.wait(60)
    main = threading.main_thread().ident
    assert threading.get_ident() == main, "the signal goes to the main thread"
    c = threading.Thread(target=later)

    def interrupt_main_when_both_wait():
        while turns.waiting() != 2:  # the holder and the main thread
            threading.Event().wait(0.001)
        c.start()
        while turns.waiting() != 3:
            threading.Event().wait(0.001)
        signal.pthread_kill(main, signal.SIGINT)
    k = threading.Thread(target=interrupt_main_when_both_wait)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever ran before
    try:
        k.start()
        with pytest.raises(KeyboardInterrupt):
            with turns:
                pass
    finally:
        signal.signal(signal.SIGINT, previous)
        holder_out.set()
    finish(a, k)
    assert served.wait(60), "the thread after the interrupted one was never served"
    finish(c)


def test_a_turn_left_by_a_frame_that_ended_is_skipped():
    """An interrupt anywhere (in __exit__ before the next is served, say) ends
    the frame that held the turn: the next waiter is served all the same."""
    turns, served = Turns(), threading.Event()

    def taken_and_left():
        turns.__enter__()   # no __exit__: as an interrupt inside it would leave it
    holder = threading.Thread(target=taken_and_left)
    holder.start()
    holder.join(60)

    def later():
        with turns:
            served.set()
    waiter = threading.Thread(target=later)
    waiter.start()
    assert served.wait(60), "the turn left by an ended frame was never passed on"
    waiter.join(60)
    assert turns.waiting() == 0


def test_a_turn_holder_may_start_a_backward_inside_its_own():
    turns = Turns()
    with turns:
        with turns:
            pass
        assert turns.waiting() == 1
    assert turns.waiting() == 0


def _start(pace: Pace, times: int = 1) -> None:
    for _ in range(times):
        with pace:
            pass


def _paced_in_thread(pace: Pace, times: int, name: str):
    """A thread that starts ``times`` backwards under ``pace``; (thread, done event)."""
    done = threading.Event()

    def run():
        _start(pace, times)
        done.set()
    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t, done


def test_a_paced_thread_waits_once_it_is_lead_ahead_of_the_slowest():
    pace, behind_started = Pace(lead=2, idle=3600), threading.Event()
    go_on = threading.Event()

    def behind():
        _start(pace)                      # 1 backward
        behind_started.set()
        assert go_on.wait(120)
        _start(pace)                      # 2: the one ahead may go on
    b = threading.Thread(target=behind, daemon=True)
    b.start()
    assert behind_started.wait(120)
    a, done = _paced_in_thread(pace, 4, "ahead")   # 1, 2, 3 pass; the 4th is 3 ahead: waits
    while pace._started.get(a.ident, (0,))[0] < 3:
        threading.Event().wait(0.001)
    assert not done.wait(0.2), "a thread three ahead of the slowest started a backward"
    go_on.set()
    assert done.wait(120), "the thread ahead was not let go when the slowest caught up"
    b.join(120)
    a.join(120)


def test_the_slowest_paced_thread_never_waits():
    pace = Pace(lead=0, idle=3600)
    a, done = _paced_in_thread(pace, 1, "ahead")
    assert done.wait(120)
    b, done = _paced_in_thread(pace, 1, "level")   # level with the other: no wait
    assert done.wait(120)
    for t in (a, b):
        t.join(120)


def test_a_paced_thread_that_left_or_idles_is_not_waited_for():
    pace = Pace(lead=0, idle=3600)
    left = threading.Thread(target=lambda: (_start(pace), pace.leave()), daemon=True)
    left.start()
    left.join(120)
    idle = threading.Thread(target=lambda: _start(pace), daemon=True)  # ends without leave()
    idle.start()
    idle.join(120)
    pace.idle = 0.05    # a thread that started none for that long is not waited for
    a, done = _paced_in_thread(pace, 5, "alone")
    assert done.wait(120), "a paced thread waited for a thread that left or stopped starting backwards"
    a.join(120)


def test_a_paced_wait_interrupted_leaves_nothing_held():
    """Pace holds nothing while a backward runs; a wait cut short changes no count."""
    import ctypes
    pace = Pace(lead=0, idle=3600)
    _start(pace)     # the main thread: 1 backward, then it stays behind
    done, interrupted = threading.Event(), threading.Event()

    def ahead():
        try:
            _start(pace, 3)      # its 3rd start waits for the main thread
            done.set()
        except KeyboardInterrupt:
            interrupted.set()
    a = threading.Thread(target=ahead, daemon=True)
    a.start()
    while pace._started.get(a.ident, (0,))[0] < 2:
        threading.Event().wait(0.001)
    assert not done.wait(0.1)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(a.ident), ctypes.py_object(KeyboardInterrupt))
    a.join(120)
    assert interrupted.is_set() and not done.is_set()
    assert pace._started[a.ident][0] == 2 and pace.waiting() == 0
    _start(pace)     # the main thread goes on, waiting for nobody


def test_blocks_know_the_other_threads_inside_them():
    from fxguard.torch_support.cuda_thread import Blocks
    blocks, inside, leave = Blocks(), threading.Event(), threading.Event()

    def other():
        with blocks.inside(0):
            inside.set()
            assert leave.wait(60)
    t = threading.Thread(target=other, daemon=True)
    with blocks.inside(0):
        assert not blocks.others(0)           # itself does not count
        t.start()
        assert inside.wait(60)
        assert blocks.others(0) and not blocks.others(1)
        leave.set()
        t.join(60)
        assert not blocks.others(0)


def test_cuda_graph_thread_names_what_turns_takes():
    with pytest.raises(ValueError, match="True, False or 'paced'"):
        with cuda_graph_thread(turns="fair"):
            pass


@pytest.mark.gpu
@CUDA
def test_a_block_runs_on_a_stream_of_its_own_after_the_threads_earlier_work():
    x = torch.ones(1 << 20, device="cuda")
    torch.cuda._sleep(1_000_000)
    x.mul_(3)  # queued behind the sleep on the default stream
    with cuda_graph_thread() as stream:
        assert torch.cuda.current_stream() == stream != torch.cuda.default_stream()
        y = x * 2
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert y.sum().item() == 6 * x.numel()


def _probe(on_backward):
    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, grad):
            on_backward()
            return grad
    return Probe


@pytest.mark.gpu
@CUDA
def test_backwards_start_in_the_order_the_threads_asked():
    """A's backward holds the worker; B asks, then C, whose graph has more nodes
    (the engine's queue alone would run C's first)."""
    turns = device_turns(torch.cuda.current_device())
    started, release, order = threading.Event(), threading.Event(), []

    def holder():
        started.set()
        assert release.wait(120)
        order.append("a")

    def thread(name, nodes, on_backward):
        def run():
            with cuda_graph_thread():
                x = torch.ones(8, device="cuda", requires_grad=True)
                y = x
                for _ in range(nodes):
                    y = y * 1
                _probe(on_backward).apply(y).sum().backward()
        t = threading.Thread(target=run, name=name)
        t.start()
        return t
    a = thread("a", 1, holder)
    assert started.wait(120)
    b = thread("b", 1, lambda: order.append("b"))
    for _ in range(120_000):
        if turns.waiting() == 2:
            break
        threading.Event().wait(0.001)
    c = thread("c", 500, lambda: order.append("c"))
    for _ in range(120_000):
        if turns.waiting() == 3:
            break
        threading.Event().wait(0.001)
    release.set()
    for t in (a, b, c):
        t.join(120)
    assert order == ["a", "b", "c"]


def _drafter_step(variant, seed):
    """A user's small drafter under reduce-overhead: losses of a few steps."""
    layers = [torch.nn.Embedding(100, 64), torch.nn.Linear(64, 64), torch.nn.GELU()]
    if variant == "dropout":
        layers.append(torch.nn.Dropout(0.1))
    model = torch.nn.Sequential(*layers, torch.nn.Linear(64, 100)).cuda()
    forward = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    own = torch.Generator(device="cuda").manual_seed(seed)
    losses = []
    for _ in range(12):
        gen = None if variant == "default-generator" else own
        ids = torch.randint(0, 100, (32,), device="cuda", generator=gen)
        loss = torch.nn.functional.cross_entropy(forward(ids), ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if variant == "default-stream":
            torch.cuda.synchronize()
        losses.append(loss.item())
    return losses


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("variant", ["default-generator", "dropout", "default-stream", "paced"])
def test_three_drafters_as_users_write_them(variant, caplog):
    """On torch <= 2.11 an eager draw from the default generator in the moment
    another thread begins a capture can fail (test_cuda_graph_rng.py forces it):
    there the only error allowed is that one, after fxguard's WARNING named it."""
    caplog.set_level("WARNING", logger="fxguard")
    barrier, errors, losses = threading.Barrier(3), [], {}

    def drafter(seed):
        try:
            barrier.wait(120)
            if variant == "default-stream":
                losses[seed] = _drafter_step(variant, seed)
            else:
                with cuda_graph_thread(turns="paced" if variant == "paced" else True):
                    losses[seed] = _drafter_step(variant, seed)
        except Exception:  # noqa: BLE001  (reported below, with where it was raised)
            errors.append(traceback.format_exc()[-3000:])
    threads = [threading.Thread(target=drafter, args=(s,), name=f"drafter-{s}") for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not any(t.is_alive() for t in threads), "a drafter stalls"
    if variant == "default-generator" and torch.__version__ < (2, 12):
        known = [e for e in errors if "Offset increment outside graph capture" in e]
        if known:
            assert "begins a CUDA-graph capture" in caplog.text, "the moment bit unnamed"
        assert [e for e in errors if e not in known] == [], "\n".join(errors)
        return
    assert errors == [], "\n".join(errors)
    assert sorted(losses) == [0, 1, 2]
    assert all(len(v) == 12 and all(x == x for x in v) for v in losses.values())
