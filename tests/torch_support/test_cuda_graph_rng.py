"""Random numbers and device syncs of CUDA graphs (``reduce-overhead``) in threads.

On a GPU (marker ``gpu``): one thread holds its recording open (a custom op that
waits while its stream captures) while another replays a graph that draws,
draws eagerly from the default CUDA generator, or calls torch.cuda.synchronize();
two threads' graphed dropout replays, gated to run at once, draw masks of their
own; a single thread draws stock's masks.  Each race runs with the row turned
off ("off": every other row on), where it must fail on torch 2.11.
"""
import gc
import threading

import pytest
import torch

import fxguard
from fxguard.torch_support import cudagraph_rng
from guarded import fresh_function, gil_off

OLD_RNG = torch.__version__ < (2, 12)  # the capturing mark is the process's
STOCK_FAILS = pytest.mark.xfail(strict=True, reason="stock: the default generator's state is "
                                "shared by every capture and replay of the device")
FEW = 4  # warm-up, recording, replays


@pytest.fixture(autouse=True)
def row(request):
    guard = request.node.callspec.params.get("guard", "on") if hasattr(request.node, "callspec") \
        else "on"
    rows = {r["what"]: r for r in fxguard.install()["patch_points"]}
    streams = cudagraph_rng.thread_streams
    streams.enabled = guard == "on"
    streams._warned.clear()
    gc.collect()  # the lanes and trees of earlier tests' threads
    torch._dynamo.reset()
    yield rows
    streams.enabled = True
    fxguard.uninstall()


def on_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(),
                                              reason="needs CUDA")(test))


def in_thread(fn, *, name=None):
    """A started thread running fn; join() returns what it returned or raises."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001  (raised in join)
            out["error"] = e
    t = threading.Thread(target=run, name=name)
    t.start()

    def join():
        t.join(600)
        assert not t.is_alive(), "hung"
        if "error" in out:
            raise out["error"]
        return out.get("value")
    return join


# -- holding a recording open ----------------------------------------------------------

capturing, release = threading.Event(), threading.Event()
HOLD_S = [60.0]  # hang guard; a test whose other thread waits for the capture shortens it


@torch.library.custom_op("fxguard_test::hold", mutates_args=())
def hold(x: torch.Tensor) -> torch.Tensor:
    """x, once released, where its stream captures (a recording held open)."""
    if torch.cuda.is_current_stream_capturing():
        capturing.set()
        release.wait(HOLD_S[0])
    return x.clone()


@hold.register_fake
def _(x):
    return torch.empty_like(x)


def recorder(draws: bool):
    """In a thread of its own, on its own stream: a graph recorded under
    reduce-overhead that holds its capture open until released."""
    src = ("def f(x):\n    return torch.nn.functional.dropout(hold(x), 0.5) * 2 + 1\n" if draws
           else "def f(x):\n    return hold(x) * 2 + 1\n")
    f = torch.compile(fresh_function(src, "f", {"hold": hold, "torch": torch}), mode="reduce-overhead")

    def record():
        with torch.cuda.stream(torch.cuda.Stream()), torch.no_grad():
            x = torch.ones(1024, device="cuda")
            for _ in range(FEW):
                f(x)
            torch.cuda.current_stream().synchronize()
    return record


def replayer(draws: bool = True):
    """A graph (dropout if it draws) warmed up and recorded here, and its replay."""
    src = ("def g(x):\n    return torch.nn.functional.dropout(x, 0.5)\n" if draws
           else "def g(x):\n    return x.cos()\n")
    g = torch.compile(fresh_function(src, "g", {"torch": torch}), mode="reduce-overhead")
    x = torch.ones(4096, device="cuda")
    with torch.no_grad():
        for _ in range(FEW):
            g(x)

    def replay():
        with torch.no_grad():
            return (g(x) != 0).clone()
    return replay


def while_recording(recorder_draws, action, hold_s=60.0):
    """action() in this thread while another thread's recording is held open."""
    capturing.clear()
    release.clear()
    HOLD_S[0] = hold_s
    joined = in_thread(recorder(recorder_draws), name="recorder")
    try:
        assert capturing.wait(300), "the recording never began"
        return action()
    finally:
        release.set()
        joined()
        torch.cuda.synchronize()


@on_gpu
@pytest.mark.parametrize("recorder_draws", [False, True])
@pytest.mark.parametrize("guard", [pytest.param("off", marks=STOCK_FAILS if OLD_RNG else ()),
                                   "on"])
def test_a_replay_that_draws_while_another_thread_records(guard, recorder_draws):
    with torch.cuda.stream(torch.cuda.Stream()):
        replay = replayer()
        masks = while_recording(recorder_draws, lambda: [replay() for _ in range(3)])
        torch.cuda.current_stream().synchronize()
    assert all(0 < m.sum().item() < m.numel() for m in masks)


@on_gpu
@pytest.mark.parametrize("guard", [pytest.param("off", marks=STOCK_FAILS if OLD_RNG else ()),
                                   "on"])
def test_an_eager_draw_while_another_thread_records_a_graph_that_draws_nothing(guard):
    with torch.cuda.stream(torch.cuda.Stream()):
        drawn = while_recording(False, lambda: [torch.randint(0, 1000, (64,), device="cuda"),
                                                torch.nn.functional.dropout(
                                                    torch.ones(64, device="cuda"), 0.5)])
        torch.cuda.current_stream().synchronize()
    assert drawn[0].unique().numel() > 1 and 0 < (drawn[1] != 0).sum().item() < 64


@on_gpu
@pytest.mark.skipif(not OLD_RNG, reason="torch 2.12+ keeps the capturing mark per capture")
def test_a_recording_that_draws_beside_other_threads_is_named(caplog):
    """torch 2.11: an eager draw while another thread records a graph that draws
    cannot be kept clear; the recording thread is named, with the fix, first."""
    replay = replayer(draws=True)  # this thread keeps the default generator
    with caplog.at_level("WARNING", logger="fxguard"):
        while_recording(True, replay)
    assert "thread 'recorder' records a CUDA graph that draws" in caplog.text
    assert "torch.Generator(device='cuda')" in caplog.text


@on_gpu
@pytest.mark.xfail(OLD_RNG, strict=True, reason="torch <= 2.11: capture_begin marks the state it "
                   "registers capturing for the process and releases the GIL before fxguard puts "
                   "the default state back; another thread's eager draw cannot be ordered against it")
def test_an_eager_draw_in_the_moment_another_thread_begins_a_capture(monkeypatch):
    """The recorder held right after capture_begin returns (before the default
    state is put back): this thread draws from the default generator then."""
    streams, begun, go = cudagraph_rng.thread_streams, threading.Event(), threading.Event()
    put_back = streams.begun

    def held_after_begin(plan):
        if threading.current_thread().name == "recorder" and not begun.is_set():
            begun.set()
            go.wait(60)
        put_back(plan)
    monkeypatch.setattr(streams, "begun", held_after_begin)
    capturing.clear()
    release.set()      # the graph's own hold does not wait
    with torch.cuda.stream(torch.cuda.Stream()):
        replayer(draws=False)()       # this thread's own graphs: other threads' trees live
        joined = in_thread(recorder(False), name="recorder")
        try:
            assert begun.wait(300), "the recording never began"
            drawn = torch.randint(0, 1000, (64,), device="cuda")
        finally:
            go.set()
            joined()
            torch.cuda.synchronize()
    assert drawn.unique().numel() > 1


@on_gpu
@pytest.mark.skipif(not OLD_RNG, reason="torch 2.12+ has no moment to name")
def test_a_capture_beside_other_threads_trees_names_the_moment_once(caplog):
    """torch 2.11: the moment above is named, with the fix, before it can bite."""
    replayer(draws=False)()
    with caplog.at_level("WARNING", logger="fxguard"):
        while_recording(False, lambda: None)
        while_recording(False, lambda: None)
    assert caplog.text.count("begins a CUDA-graph capture") == 1
    assert "thread 'recorder' begins a CUDA-graph capture" in caplog.text
    assert "torch.Generator(device='cuda')" in caplog.text


@on_gpu
@pytest.mark.parametrize("guard", [pytest.param("off", marks=pytest.mark.xfail(
    strict=True, reason="stock: a device sync while another thread captures")), "on"])
def test_synchronize_on_the_default_stream_while_another_thread_records(guard):
    """This thread on the default stream; the recording held for 3 s at most
    (with the row, this thread's sync waits for it to end)."""
    replayer(draws=False)()  # this thread's own graphs too
    while_recording(False, torch.cuda.synchronize, hold_s=3.0)


@on_gpu
@pytest.mark.parametrize("guard", [pytest.param("off", marks=pytest.mark.xfail(
    strict=True, reason="stock: a device sync in the moment another thread's capture begins")), "on"])
def test_a_sync_in_the_moment_another_thread_begins_a_capture(guard, monkeypatch):
    """The recorder held inside capture_begin, right after torch's C++ begin
    returned (its stream captures; the GIL was released there): another
    thread's torch.cuda.synchronize() then waits for the capture."""
    from guarded import held_in, wait_until
    begun, go, synced = threading.Event(), threading.Event(), {}
    stock_begin = torch._C._CUDAGraph.capture_begin

    def begin_then_hold(self, *args, **kwargs):
        began = stock_begin(self, *args, **kwargs)
        if threading.current_thread().name == "recorder" and not begun.is_set():
            begun.set()
            go.wait(60)
        return began
    monkeypatch.setattr(torch._C._CUDAGraph, "capture_begin", begin_then_hold)
    capturing.clear()
    release.set()      # the graph's own hold does not wait
    replayer(draws=False)()   # this thread's own graphs: other threads' trees live

    def sync():
        try:
            torch.cuda.synchronize()
            synced["ok"] = True
        except BaseException as e:  # noqa: BLE001  (raised below)
            synced["error"] = e
    joined = in_thread(recorder(False), name="recorder")
    try:
        assert begun.wait(300), "the recording never began"
        syncer = threading.Thread(target=sync, name="syncer")
        syncer.start()
        wait_until(lambda: synced or held_in(syncer, lambda f: f.f_code.co_name == "_device_call_begins"),
                   "the sync to wait for the capture or to run")
    finally:
        go.set()
        joined()
    syncer.join(60)
    if "error" in synced:
        raise synced["error"]
    assert synced == {"ok": True}
    torch.cuda.synchronize()


# -- a stream of random numbers per thread ------------------------------------------

def _gated_masks(steps: int, gate_stream):
    """Two threads' graphed dropout, recorded one after the other, then replayed
    together: each step's replays wait on one event behind a sleep, so both
    threads' seeds and offsets are written before either graph runs."""
    recorded, go, done = threading.Barrier(2), threading.Barrier(3), threading.Barrier(3)
    gates = [None]
    turn = threading.Semaphore(1)

    def thread():
        with turn:  # recorded one after the other
            with torch.cuda.stream(torch.cuda.Stream()):
                replay = replayer(draws=True)
                torch.cuda.current_stream().synchronize()
        recorded.wait(300)
        masks = []
        with torch.cuda.stream(torch.cuda.Stream()):
            for _ in range(steps):
                go.wait(300)
                torch.cuda.current_stream().wait_event(gates[0])
                masks.append(replay())
                done.wait(300)
            torch.cuda.current_stream().synchronize()
        return masks
    joins = [in_thread(thread, name=f"drafter-{i}") for i in range(2)]
    for _ in range(steps):
        with torch.cuda.stream(gate_stream):
            torch.cuda._sleep(2_000_000)
            gates[0] = torch.cuda.Event()
            gates[0].record()
        go.wait(300)
        done.wait(300)
    a, b = (j() for j in joins)
    return sum(torch.equal(x, y) for x, y in zip(a, b)), a, b


@on_gpu
@pytest.mark.parametrize("guard", [pytest.param("off", marks=pytest.mark.xfail(
    strict=True, reason="stock (pytorch#176754): replays share the seed and offset tensors")),
    "on"])
def test_each_threads_replays_draw_masks_of_their_own(guard):
    equal, a, b = _gated_masks(40, torch.cuda.Stream())
    assert all(0 < m.sum().item() < m.numel() for m in a + b)
    assert len({m.cpu().numpy().tobytes() for m in a}) == len(a)  # none repeats in a thread
    assert equal == 0, f"{equal} of 40 steps drew the same mask in both threads"


@on_gpu
def test_a_single_thread_draws_stocks_masks():
    """Alone, a thread's graphs register the default generator, as stock."""
    def masks():
        torch._dynamo.reset()
        torch.cuda.manual_seed(1234)
        replay = replayer(draws=True)
        out = [replay() for _ in range(5)]
        return out + [torch.rand(8, device="cuda")]
    with_row = masks()
    fxguard.uninstall()
    stock = masks()
    assert all(torch.equal(x, y) for x, y in zip(with_row, stock))


@on_gpu
def test_the_output_code_says_whether_a_graph_draws():
    seen = {}
    original = cudagraph_rng.draws

    def noting(model):
        seen.setdefault("draws", []).append(original(model))
        return seen["draws"][-1]
    cudagraph_rng.draws = noting
    try:
        replayer(draws=False)
        replayer(draws=True)
    finally:
        cudagraph_rng.draws = original
    assert seen["draws"] == [False, True]


@on_gpu
def test_flex_attention_reads_as_drawing_nothing_and_sdpa_dropout_as_drawing():
    """A drafter's flex attention graph records as one that draws nothing (no
    generator state of the process held for its whole capture); aten's fused
    attention with a dropout argument draws."""
    from torch.nn.attention.flex_attention import flex_attention
    seen = {}
    original = cudagraph_rng.draws

    def noting(model):
        seen.setdefault(now[0], set()).add(original(model))
        return original(model)
    now = [None]
    q = torch.randn(1, 2, 256, 64, device="cuda")
    flex = torch.compile(fresh_function("def f(q):\n    return flex(q, q, q)\n", "f",
                                        {"flex": flex_attention}), mode="reduce-overhead")
    sdpa = torch.compile(fresh_function(
        "def g(q):\n    return F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)\n", "g",
        {"F": torch.nn.functional}), mode="reduce-overhead")
    cudagraph_rng.draws = noting
    try:
        with torch.no_grad():
            for now[0], fn in (("flex", flex), ("sdpa", sdpa)):
                for _ in range(FEW):
                    fn(q)
    finally:
        cudagraph_rng.draws = original
    assert seen == {"flex": {False}, "sdpa": {True}}


def test_no_two_patched_rows_swap_one_function():
    """A Swap's inner is the function as the per-thread globals leave it, not as
    another row's swap does: two rows on one function, and the last one wins."""
    from fxguard.machinery.wrapped import Wrapped
    from fxguard.torch_support import rows as all_rows
    patched = {r["what"] for r in fxguard.install()["patch_points"] if r["patched"]}
    wheres = [swap.where for row in all_rows.ROWS if isinstance(row, Wrapped) and row.what in patched
              for swap in row.swaps]
    assert sorted({w for w in wheres if wheres.count(w) > 1}) == []


def test_device_calls_wait_for_another_threads_capture_only():
    """synchronize()/kernel loads wait while another thread's capture itself
    runs on the device (torch-free part: the marks), never for their own
    thread's, and a mark left by a thread that ended mid-capture is dropped."""
    from guarded import finish
    from fxguard.torch_support.cudagraph_rng import ThreadStreams
    streams = ThreadStreams(lambda: threading.get_ident)
    streams._captures[0] = {threading.get_ident()}
    with streams.no_capture_on(0):  # its own capture: no wait
        pass
    capturing, passed = threading.Event(), threading.Event()
    release = threading.Event()

    def capturer():
        with streams._capture_cond:
            streams._captures[0] = {threading.get_ident()}
        capturing.set()
        assert release.wait(60)
        with streams._capture_cond:
            streams._captures[0].clear()
            streams._capture_cond.notify_all()

    def caller():
        with streams.no_capture_on(0):
            passed.set()
    a = threading.Thread(target=capturer)
    a.start()
    assert capturing.wait(60)
    b = threading.Thread(target=caller)
    b.start()
    assert not passed.wait(0.2), "a device call ran during another thread's capture"
    release.set()
    finish(a, b)
    assert passed.is_set()
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    streams._captures[1] = {dead.ident}
    with streams.no_capture_on(1):  # the ended thread's mark goes
        pass
    assert streams._captures[1] == set()


def test_a_capture_begins_once_other_threads_device_calls_have_returned():
    """capture_begin releases the GIL once its stream captures, and a device sync
    or kernel load running then fails, whichever began first: a capture is
    marked before capture_begin (device calls arriving later wait for it) and
    begins once the device calls running there have returned (torch-free part)."""
    from guarded import finish, held_in, wait_until
    from fxguard.torch_support.cudagraph_rng import ThreadStreams
    streams = ThreadStreams(lambda: threading.get_ident)
    in_call, leave, began, end_capture, late_passed = (threading.Event() for _ in range(5))

    def caller():
        with streams.no_capture_on(0):
            in_call.set()
            assert leave.wait(60)

    def capturer():
        streams._capture_starts(0)
        began.set()
        assert end_capture.wait(60)
        streams.ended()

    def late_caller():
        with streams.no_capture_on(0):
            late_passed.set()
    a = threading.Thread(target=caller)
    a.start()
    assert in_call.wait(60)
    b = threading.Thread(target=capturer)
    b.start()
    wait_until(lambda: began.is_set() or held_in(b, lambda f: f.f_code.co_name == "_capture_starts"),
               "the capture to wait for the running call or to begin")
    assert not began.is_set(), "a capture began while another thread's device call ran"
    c = threading.Thread(target=late_caller)
    c.start()
    wait_until(lambda: late_passed.is_set()
               or held_in(c, lambda f: f.f_code.co_name == "_device_call_begins"),
               "the later call to wait for the marked capture or to run")
    assert not late_passed.is_set(), "a device call ran while a capture was marked"
    leave.set()
    assert began.wait(60)
    assert not late_passed.wait(0.2), "a device call ran during the capture"
    end_capture.set()
    finish(a, b, c)
    assert late_passed.is_set()
    assert streams._device_calls[0] == {} and streams._captures[0] == set()


@pytest.mark.skipif(gil_off(), reason="other threads' frames are not walked with the GIL off: "
                    "such a call lapses when its thread ends")
def test_a_device_call_an_interrupt_left_listed_lapses_with_its_frame():
    """A device call whose __exit__ never ran (an interrupt) does not hold a
    capture off once its frame has returned, though its thread lives on."""
    from guarded import finish
    from fxguard.torch_support.cudagraph_rng import ThreadStreams
    streams = ThreadStreams(lambda: threading.get_ident)
    listed, done = threading.Event(), threading.Event()

    def left_listed():
        streams.no_capture_on(0).__enter__()   # no __exit__, as an interrupt leaves it

    def alive_after():
        left_listed()
        listed.set()
        assert done.wait(60)
    t = threading.Thread(target=alive_after)
    t.start()
    assert listed.wait(60)
    streams._capture_starts(0)   # returns: the call's frame is gone
    assert streams._device_calls[0] == {}
    streams.ended()
    done.set()
    finish(t)


def test_a_recordings_plan_lapses_with_its_frame():
    """A plan an interrupt left on the thread's stack (its __exit__ skipped)
    is not the next recording's: it lapses with the frame that made it."""
    from fxguard.torch_support.cudagraph_rng import ThreadStreams, _Plan
    streams = ThreadStreams(lambda: threading.get_ident)

    def recording_left_open():
        _Plan(streams, None, whole=False).__enter__()  # no __exit__, as an interrupt leaves it
        assert streams._current() is not None          # while its frame runs: current
    recording_left_open()
    assert streams._current() is None and streams._stack() == []
    with _Plan(streams, None, whole=False) as plan:
        assert streams._current() is plan
    assert streams._stack() == []


def test_a_capture_on_a_thread_threading_does_not_list_is_waited_for():
    """The autograd worker records a backward's graph on a C++ thread that
    threading.enumerate() does not list; its capture mark must hold a sync off
    all the same (a thread made by _thread stands in for it)."""
    import _thread
    from fxguard.torch_support.cudagraph_rng import ThreadStreams
    from guarded import held_in, wait_until
    streams = ThreadStreams(lambda: threading.get_ident)
    marked, release, done = threading.Event(), threading.Event(), threading.Event()

    def capturer():
        with streams._capture_cond:
            streams._captures[0] = {_thread.get_ident()}
        marked.set()
        release.wait(60)
        with streams._capture_cond:
            streams._captures[0].clear()
            streams._capture_cond.notify_all()
        done.set()
    _thread.start_new_thread(capturer, ())
    assert marked.wait(60)
    passed = threading.Event()

    def caller():
        with streams.no_capture_on(0):
            passed.set()
    b = threading.Thread(target=caller)
    b.start()
    wait_until(lambda: passed.is_set() or held_in(b, lambda f: f.f_code.co_name == "_device_call_begins"),
               "the sync to wait for the capture or to pass it")
    assert not passed.is_set(), "a sync ran during a capture on an unlisted thread"
    release.set()
    b.join(60)
    assert passed.is_set() and done.wait(60)


# -- seeds over a process's life, and torch.cuda.manual_seed ----------------------------

def _recorded_then(steps: int, ready: threading.Barrier, go: threading.Barrier):
    """A thread's body: records a graphed dropout on a stream of its own, waits
    at ``ready``, then replays ``steps`` masks, each step in lockstep at ``go``."""
    def body():
        with torch.cuda.stream(torch.cuda.Stream()):
            replay = replayer(draws=True)
            torch.cuda.current_stream().synchronize()
            ready.wait(300)
            masks = []
            for _ in range(steps):
                go.wait(300)
                masks.append(replay().cpu())
            return masks
    return body


@on_gpu
def test_a_thread_started_after_another_ended_never_takes_a_live_threads_seed():
    """The main thread keeps the default state; A and B get states of their own;
    A ends; C starts while B lives.  B's and C's replays (the same graph, the
    same offsets) must draw different masks: C never reuses B's seed."""
    with torch.cuda.stream(torch.cuda.Stream()):
        replayer(draws=True)()   # the main thread's: it keeps the default state
    a = in_thread(_recorded_then(1, threading.Barrier(1), threading.Barrier(1)), name="a")
    ready, go = threading.Barrier(3), threading.Barrier(2)
    b = in_thread(_recorded_then(8, ready, go), name="b")
    a()    # A has ended
    gc.collect()
    c = in_thread(_recorded_then(8, ready, go), name="c")
    ready.wait(300)
    masks_b, masks_c = b(), c()
    equal = sum(torch.equal(x, y) for x, y in zip(masks_b, masks_c))
    assert equal == 0, f"{equal} of 8 steps drew the same mask in B and C"


@on_gpu
def test_manual_seed_reseeds_every_threads_graphed_draws():
    """torch.cuda.manual_seed(s) sets every thread's graphed stream back to a
    start fixed by s, as stock's graphs follow the default generator's seed."""
    ready, seeded, go = threading.Barrier(2), threading.Event(), threading.Event()

    def thread():
        with torch.cuda.stream(torch.cuda.Stream()):
            replay = replayer(draws=True)
            ready.wait(300)
            runs = []
            for _ in range(2):
                seeded.wait(300)
                seeded.clear()
                runs.append([replay().cpu() for _ in range(3)])
                go.set()
            return runs
    with torch.cuda.stream(torch.cuda.Stream()):
        replayer(draws=True)()   # the main thread keeps the default state
    joined = in_thread(thread, name="drafter")
    ready.wait(300)
    for _ in range(2):
        go.clear()
        torch.cuda.manual_seed(5)
        seeded.set()
        assert go.wait(300)
    first, second = joined()
    assert all(torch.equal(x, y) for x, y in zip(first, second))
    assert not torch.equal(first[0], first[1])


def test_a_manual_seed_fxguard_does_not_know_stands_its_row_down_alone(monkeypatch):
    """A changed torch.cuda.manual_seed stands the reseed row down (not covered)
    and leaves the graphs' per-thread streams patched."""
    import torch._inductor.cudagraph_trees  # noqa: F401 - the rows wait for it
    fxguard.uninstall()

    def manual_seed(value):  # another signature
        return None
    monkeypatch.setattr(torch.cuda.random, "manual_seed", manual_seed)
    rows = {r["what"]: r for r in fxguard.install()["patch_points"]}
    assert rows["CUDA-graph streams follow torch.cuda.manual_seed"]["outcome"] == "not covered"
    assert rows["CUDA-graph random numbers per thread"]["outcome"] == "patched"
