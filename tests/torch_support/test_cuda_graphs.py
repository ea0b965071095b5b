"""CUDA graphs (``mode="reduce-overhead"``) per thread.

On CPU, the thread logic with torch's own functions: a step mark, the
generation a tree reads, a reset, the tree managers of a new thread.  On a GPU
(marker ``gpu``, run on the H200): three threads train under
``reduce-overhead`` with the results each gets alone; one thread's
``cudagraph_mark_step_begin()`` leaves another's replay as it is alone; a
single-threaded trainer's step mark reaches its backward on the autograd
worker.  Each race is also run stock, where it must fail.
"""
import threading

import pytest
import torch
import torch._inductor.cudagraph_trees as trees

import fxguard
from fxguard.torch_support import cudagraphs as fxguard_cudagraphs
from fxguard.torch_support.cudagraphs import lane_getter
from guarded import fresh_function

Manager = trees.CUDAGraphTreeManager
CROSSES = pytest.mark.xfail(strict=True, reason="stock: one step counter and generation "
                            "for the process")
ASSERTS = torch.__version__ < (2, 13)  # get_obj asserts in any thread but the importing one
TREES_SHARED = pytest.mark.xfail(strict=True, reason="stock <= 2.12: trees set up in one thread")


def _install(guard: str) -> None:
    if guard == "on":
        rows = {r["what"]: r for r in fxguard.install(cuda_graphs_per_thread=True)["patch_points"]}
        assert rows["CUDA-graph steps per thread"]["patched"]


@pytest.fixture(autouse=True)
def stock_counter():
    yield
    trees.MarkStepBox.mark_step_counter = 0  # a stock run's mark stays for the process
    lane_getter()().step = 0  # and the main thread's, with fxguard


def in_thread(fn):
    """fn's result in a thread of its own (its exception raised here)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001  (raised below, in the test)
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join(600)
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.parametrize("guard", [pytest.param("off", marks=CROSSES), "on"])
def test_step_mark_stays_in_its_thread(guard):
    _install(guard)
    before = Manager.get_curr_generation()
    in_thread(trees.mark_step_begin)
    assert not Manager.user_invoked_mark_step()
    assert Manager.get_curr_generation() == before
    trees.mark_step_begin()
    assert Manager.user_invoked_mark_step()
    assert in_thread(Manager.user_invoked_mark_step) is False


@pytest.mark.parametrize("guard", [pytest.param("off", marks=CROSSES), "on"])
def test_generation_counts_the_threads_own_compiled_calls(guard):
    _install(guard)
    f = torch.compile(fresh_function("def f(x):\n    return x + 1\n"), backend="eager")
    f(torch.ones(2))
    before = Manager.get_curr_generation()

    def three_calls():
        start = Manager.get_curr_generation()
        for _ in range(3):
            f(torch.ones(2))
        return Manager.get_curr_generation() - start
    assert in_thread(three_calls) == 3
    assert Manager.get_curr_generation() == before
    f(torch.ones(2))
    assert Manager.get_curr_generation() == before + 1


@pytest.mark.parametrize("guard", [pytest.param("off", marks=CROSSES), "on"])
def test_reset_in_one_thread_keeps_anothers_step(guard):
    _install(guard)
    marked, reset_done = threading.Event(), threading.Event()

    def other():
        trees.mark_step_begin()
        marked.set()
        assert reset_done.wait(60)
        return Manager.user_invoked_mark_step()
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("marked", other()))
    t.start()
    assert marked.wait(60)
    trees.reset_cudagraph_trees()
    reset_done.set()
    t.join(60)
    assert result == {"marked": True}


@pytest.mark.parametrize("guard", [pytest.param("off", marks=TREES_SHARED if ASSERTS else ()),
                                   "on"])
def test_a_new_thread_gets_its_own_trees(guard):
    if guard == "off" and not ASSERTS:
        pytest.skip("torch 2.13+ makes them per thread itself: nothing to fail")
    _install(guard)
    mine = trees.get_container(0)
    theirs = in_thread(lambda: trees.get_container(0))
    assert isinstance(theirs, trees.TreeManagerContainer) and theirs is not mine
    assert trees.get_container(0) is mine


@pytest.mark.skipif(ASSERTS, reason="torch <= 2.12: the trees row reads the stash first")
@pytest.mark.parametrize("guard", [pytest.param("off", marks=pytest.mark.xfail(
    strict=True, reason="stock 2.13+: a thread's own trees first, so a worker that once set "
                        "up its own keeps them for every thread's backward")), "on"])
def test_a_thread_with_trees_of_its_own_reads_the_ones_it_is_handed(guard):
    """An autograd worker runs each backward with the stash of the thread whose
    backward it is; one that once set up trees of its own (a backward from a
    thread that had none) must still read the trees it is handed.  Played with
    torch's own functions: a thread sets its trees up (torch's _initialize_tls),
    then is handed another's in its stash, as a graph task hands them."""
    _install(guard)
    handed = {}

    def worker():
        trees._initialize_tls(trees.local)
        torch._C._stash_obj_in_tls("tree_manager_containers", handed)
        return trees.get_obj(trees.local, "tree_manager_containers") is handed
    try:
        assert in_thread(worker)
    finally:
        fxguard.uninstall()


def test_option_on_by_default():
    rows = {r["what"]: r for r in fxguard.install()["patch_points"]}
    assert rows["CUDA-graph steps per thread"]["patched"]


def test_option_off_keeps_stock():
    rows = {r["what"]: r for r in fxguard.install(cuda_graphs_per_thread=False)["patch_points"]}
    assert rows["CUDA-graph steps per thread"]["outcome"] == "option off"
    in_thread(trees.mark_step_begin)
    assert Manager.user_invoked_mark_step()  # stock: the other thread's mark


def test_uninstall_restores_process_wide_counters():
    fxguard.install(cuda_graphs_per_thread=True)
    trees.mark_step_begin()
    fxguard.uninstall()
    assert not Manager.user_invoked_mark_step()  # stock's counter, untouched meanwhile
    trees.mark_step_begin()
    assert trees.MarkStepBox.mark_step_counter == -1


# -- on a GPU ------------------------------------------------------------------------

def on_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(),
                                              reason="needs CUDA")(test))


def _mlp(seed: int):
    """Made in the main thread: initialisation draws from torch's one CPU generator."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                               torch.nn.Linear(128, 64)).cuda()


def train(model, seed: int, steps: int = 8) -> list[float]:
    """An MLP trained under reduce-overhead: its losses and a checksum of its weights.
    Its data come from a generator of its own, clear of torch <= 2.11's default CUDA
    generator, which another thread's recording marks as capturing."""
    compiled = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator(device="cuda").manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 64, device="cuda", generator=g)
        loss = compiled(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses + [sum(p.double().sum().item() for p in model.parameters())]


@on_gpu
@pytest.mark.parametrize("guard", [pytest.param("off", marks=TREES_SHARED), "on"] if ASSERTS
                         else ["on"])
def test_threads_train_under_reduce_overhead_as_alone(guard):
    _install(guard)
    torch._dynamo.reset()
    alone = {seed: train(_mlp(seed), seed) for seed in (1, 2, 3)}
    torch._dynamo.reset()
    models = {seed: _mlp(seed) for seed in (1, 2, 3)}
    barrier, together, errors = threading.Barrier(3), {}, []

    def drafter(seed):
        barrier.wait()
        try:
            together[seed] = train(models[seed], seed)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(f"{type(e).__name__}: {e}")
    threads = [threading.Thread(target=drafter, args=(s,)) for s in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert errors == []
    for seed, expected in alone.items():
        assert together[seed] == pytest.approx(expected, rel=1e-4), seed


def _replay_outcome(mark_elsewhere: bool) -> list:
    """In this thread: y2 = f(x), y3 = f(x) under reduce-overhead, inference; whether
    y2 was overwritten by y3 (as torch does when each call is a new step).  With
    mark_elsewhere, another thread marks a step before."""
    f = torch.compile(fresh_function("def f(x):\n    return x * 2 + 1\n"), mode="reduce-overhead")
    x = torch.ones(16, device="cuda")
    with torch.no_grad():
        for _ in range(4):  # warm-up, recording, replays
            f(x)
        if mark_elsewhere:
            in_thread(torch.compiler.cudagraph_mark_step_begin)
        y2 = f(x)
        y3 = f(x)
        try:
            overwritten = y2.sum().item() is None
        except RuntimeError:
            overwritten = True
        return [overwritten, y3.tolist()]


@on_gpu
@pytest.mark.parametrize("guard", [pytest.param("off", marks=CROSSES), "on"])
def test_one_threads_step_mark_leaves_anothers_replay(guard):
    _install(guard)
    alone = in_thread(lambda: _replay_outcome(False))
    torch._dynamo.reset()
    assert in_thread(lambda: _replay_outcome(True)) == alone


def _probe(on_backward):
    """An identity autograd.Function whose backward (on the device's autograd
    worker, for CUDA tensors) calls on_backward() first."""
    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, grad):
            on_backward()
            return grad
    return Probe


@on_gpu
@pytest.mark.parametrize("guard", ["off", "on"])
def test_a_single_threaded_trainers_step_mark_reaches_its_backward(guard):
    """The backward of CUDA tensors runs on the device's autograd worker: it must
    read the step marks and generation of the thread whose backward it is."""
    _install(guard)
    seen = {}
    probe = _probe(lambda: seen.update(thread=threading.get_ident(),
                                       marked=Manager.user_invoked_mark_step(),
                                       generation=Manager.get_curr_generation()))
    torch.compiler.cudagraph_mark_step_begin()
    x = torch.ones(4, device="cuda", requires_grad=True)
    probe.apply(x).sum().backward()
    assert seen["thread"] != threading.get_ident()  # it did run on the worker
    assert seen["marked"] and seen["generation"] == Manager.get_curr_generation()


@on_gpu
def test_backwards_from_threads_that_ran_no_compiled_code_share_the_workers_own():
    """.backward() from a thread that never ran a compiled function: the worker
    finds no lane (nor, <= 2.12, trees) in that thread's stash, which it gets
    afresh for each backward.  It must reuse its own, as torch 2.13 does with
    its trees, not make (and record) anew each time."""
    _install("on")
    torch._dynamo.reset()
    f = torch.compile(fresh_function("def f(x):\n    return x.sin() * 2\n"), mode="reduce-overhead")
    lanes = []
    probe = _probe(lambda: lanes.append(lane_getter()()))  # kept: ids of freed lanes could repeat
    x = torch.ones(8, device="cuda", requires_grad=True)
    for _ in range(4):
        y = probe.apply(f(x))
        in_thread(lambda: y.sum().backward())  # a new thread each time
    assert len({id(lane) for lane in lanes}) == 1
    assert torch.allclose(x.grad, torch.full_like(x, 8 * torch.cos(torch.tensor(1.0)).item()))
    fxguard.uninstall()


def _changed_mark_step_begin():
    trees.MarkStepBox.mark_step_counter -= 2


CHANGED = [("CUDA-graph steps per thread", f"{fxguard_cudagraphs.TREES}.mark_step_begin",
            _changed_mark_step_begin)]


@pytest.mark.parametrize("row, where, changed_to", CHANGED, ids=[c[0] for c in CHANGED])
def test_a_changed_function_stands_the_row_down_with_a_warning(monkeypatch, caplog, row, where,
                                                                changed_to):
    """On a torch whose function is not the one fxguard knows, its row stands
    down (WARNING) and touches nothing; the other rows go on."""
    fn = fxguard_cudagraphs.plain_function(where)
    monkeypatch.setattr(fn, "__code__", changed_to.__code__)
    with caplog.at_level("WARNING", logger="fxguard"):
        rows = {r["what"]: r for r in fxguard.install(cuda_graphs_per_thread=True)["patch_points"]}
    assert rows[row]["outcome"] == "not covered"
    assert where.rsplit(".", 1)[1] in caplog.text
    assert fn.__code__ is changed_to.__code__
    assert rows["CUDA-graph callable per thread"]["patched"]
    fxguard.uninstall()
