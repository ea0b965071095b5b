"""torch 2.13+'s CUDA-graph capture lock, per device (row "CUDA-graph capture
lock per device", option cuda_graphs_per_thread).  On CPU: the tree manager's
__init__ (the lock, then the device, which fails without a GPU) run in a thread
while the test holds the lock as torch's code for another device would."""
import threading

import pytest
import torch
import torch._inductor.cudagraph_trees as trees

import fxguard
from fxguard.torch_support import cudagraph_capture_lock as capture
from guarded import finish, fresh_function, wait_until

pytestmark = pytest.mark.skipif(not hasattr(trees, "graph_capture_lock"),
                                reason="torch <= 2.12 holds no capture lock")
ONE_FOR_ALL = pytest.mark.xfail(strict=True, reason="stock: one capture lock for every device")


def _install(guard: str) -> None:
    if guard == "on":
        rows = {r["what"]: r for r in fxguard.install(cuda_graphs_per_thread=True)["patch_points"]}
        assert rows["CUDA-graph capture lock per device"]["patched"]


def _innermost_code(ident):
    """The code the thread runs now (where it waits, if it waits in a C lock)."""
    from fxguard.machinery.settle import current_frames
    frame = current_frames().get(ident) if ident else None
    return frame.f_code if frame is not None else None


def _at_torchs_lock(ident) -> bool:
    """The thread's innermost frame is the stock __init__ (blocked in the Lock it takes)."""
    return _innermost_code(ident) is fxguard.get_original(trees.CUDAGraphTreeManager.__init__,
                                                          "__code__")


def _init_while_held(held_device: int, init_device: int) -> bool:
    """Whether the tree manager's __init__ for init_device got past the capture
    lock (and failed on the device: no GPU here) while this thread held it as
    code for held_device does."""
    lock, outcome = trees.graph_capture_lock, {}
    per_device = isinstance(lock, capture.DeviceCaptureLock)

    def init():
        manager = trees.CUDAGraphTreeManager.__new__(trees.CUDAGraphTreeManager)
        try:
            manager.__init__(init_device)
        except RuntimeError:  # the device: no GPU on this machine
            outcome["past the lock"] = True
    if per_device:
        lock.enter_device(held_device)
    try:
        with lock:
            t = threading.Thread(target=init, daemon=True)
            t.start()
            # fxguard's lock: only "past the lock" ends the wait (a hang fails the test);
            # stock's Lock: so does the thread waiting in __init__, where it takes it.
            wait_until(lambda: outcome or (not per_device and _at_torchs_lock(t.ident)) or
                       (per_device and held_device == init_device and _waits_in_fxguard(t.ident)),
                       "the other thread's __init__ to pass the lock or wait for it")
            past = bool(outcome)
    finally:
        if per_device:
            lock.leave_device()
    finish(t)
    return past


def _waits_in_fxguard(ident) -> bool:
    return _innermost_code(ident) is capture.DeviceCaptureLock.acquire.__code__


@pytest.mark.parametrize("guard", [pytest.param("off", marks=ONE_FOR_ALL), "on"])
def test_a_device_sets_up_while_another_device_captures(guard):
    _install(guard)
    try:
        assert _init_while_held(held_device=1, init_device=0)
    finally:
        fxguard.uninstall()


@pytest.mark.parametrize("guard", ["off", "on"])
def test_the_same_device_waits_as_stock(guard):
    _install(guard)
    try:
        assert not _init_while_held(held_device=0, init_device=0)
    finally:
        fxguard.uninstall()


def test_uninstall_puts_torchs_lock_back():
    stock = trees.graph_capture_lock
    _install("on")
    assert isinstance(trees.graph_capture_lock, capture.DeviceCaptureLock)
    fxguard.uninstall()
    assert trees.graph_capture_lock is stock


def test_a_lock_taken_elsewhere_stands_the_row_down(monkeypatch, caplog):
    """A torch that takes graph_capture_lock in a function fxguard does not know:
    the row stands down (WARNING), torch's lock stays; the other rows go on."""
    user = fresh_function("def capture_elsewhere():\n    with graph_capture_lock:\n        pass\n",
                          name="capture_elsewhere")
    user.__module__ = trees.__name__  # as if torch defined it there
    monkeypatch.setattr(trees, "capture_elsewhere", user, raising=False)
    stock = trees.graph_capture_lock
    with caplog.at_level("WARNING", logger="fxguard"):
        rows = {r["what"]: r for r in fxguard.install(cuda_graphs_per_thread=True)["patch_points"]}
    try:
        assert rows["CUDA-graph capture lock per device"]["outcome"] == "not covered"
        assert "graph_capture_lock" in caplog.text
        assert trees.graph_capture_lock is stock
        assert rows["CUDA-graph steps per thread"]["patched"]
    finally:
        fxguard.uninstall()


# -- on two GPUs ---------------------------------------------------------------------

HOLD = {"in_capture": None}


@torch.library.custom_op("fxguard_test::held_in_capture_on_device", mutates_args=())
def _held(x: torch.Tensor) -> torch.Tensor:
    hold = HOLD["in_capture"]
    if hold is not None and torch.cuda.is_current_stream_capturing():
        HOLD["in_capture"] = None
        hold()
    return x.clone()


@_held.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("guard", [pytest.param("off", marks=ONE_FOR_ALL), "on"])
def test_a_drafter_on_another_gpu_records_while_one_records(guard):
    """Thread A is held inside a recording on cuda:0 until thread B has warmed up
    and recorded on cuda:1, or waits for torch's lock (stock)."""
    _install(guard)
    b, capturing = {}, threading.Event()

    def in_capture():
        capturing.set()
        wait_until(lambda: "done" in b or _at_torchs_lock_on_gpu(b.get("ident")),
                   "the other GPU's drafter to record or wait")
        b["while held"] = "done" in b

    f = torch.compile(fresh_function("def f(x):\n    return held(x) * 2\n",
                                     namespace={"held": _held}), mode="reduce-overhead")
    g = torch.compile(fresh_function("def g(x):\n    return x * 3\n", name="g"),
                      mode="reduce-overhead")

    def other_gpu():
        b["ident"] = threading.get_ident()
        torch.cuda.set_device(1)
        assert capturing.wait(300)
        x = torch.ones(4, device="cuda:1")
        with torch.no_grad():
            b["out"] = [g(x).tolist() for _ in range(3)]  # warm-up, recording, replay
        b["done"] = True
    try:
        tb = threading.Thread(target=other_gpu, daemon=True)
        tb.start()
        x = torch.ones(4, device="cuda:0")
        with torch.no_grad():
            f(x)  # warm-up
            HOLD["in_capture"] = in_capture
            out = f(x).tolist()  # recording, held inside the capture
        finish(tb, timeout=300)
    finally:
        HOLD["in_capture"] = None
        fxguard.uninstall()
    assert out == [2.0] * 4 and b["out"] == [[3.0] * 4] * 3
    assert b["while held"]


def _at_torchs_lock_on_gpu(ident) -> bool:
    """Stock: the thread's innermost frame is the tree manager's __init__ or _run
    (where torch takes its one lock) and that lock is held."""
    takers = {fxguard.get_original(getattr(trees.CUDAGraphTreeManager, name), "__code__")
              for name in ("__init__", "_run")}
    locked = getattr(trees.graph_capture_lock, "locked", lambda: False)  # fxguard's: never waited for
    return _innermost_code(ident) in takers and locked()
