"""A shared Triton kernel's first launches from several threads: one thread
tunes it, the others wait and launch the config it picked (pytorch#198257).

On a GPU (marker ``gpu``): a reduction compiled under max-autotune (several
configs per kernel) is first called by thread "tuner"; while it benchmarks the
kernel's configs, thread "second" calls the same compiled function, which
compile once hands the tuner's graph, so the very same kernels.  With the row,
"second" waits for the tuning (seen parked in fxguard's lock) and never
benchmarks beside it; with the row off ("off": every other row on), it
benchmarks the kernel the tuner is tuning, as stock does: strict xfail.  Then
eight threads make their first call of a fresh function together.

On any machine: the row is patched once inductor's runtime is imported, stands
down with a WARNING on an autotune it does not know, and its helper holds one
kernel's tuning to one thread at a time.
"""
import itertools
import threading

import pytest
import torch

import fxguard
from fxguard.torch_support import kernel_tuning
from guarded import fresh_function, held_in, wait_until

# A constant of its own per function: a kernel inductor's caches never handed out
# (a kernel tuned by an earlier test is shared, already tuned, by a later one).
SOURCE = "def f(x):\n    return (x * x).sum(dim=-1) * {k} + x.amax(dim=-1)\n"
_kernels = itertools.count(3)


def on_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(),
                                              reason="needs CUDA")(test))


@pytest.fixture
def guard(request):
    return getattr(request, "param", "on")


@pytest.fixture(autouse=True)
def installed(guard):
    fxguard.install()
    kernel_tuning.kernel_tuning.enabled = guard == "on"
    torch._dynamo.reset()
    yield
    kernel_tuning.kernel_tuning.enabled = True
    fxguard.uninstall()


def test_the_row_is_patched_once_inductor_runs():
    import torch._inductor.runtime.triton_heuristics  # noqa: F401 - what the row waits for
    rows = {r["what"]: r for r in fxguard.status()["patch_points"]}
    assert rows["a shared kernel tuned by one thread at a time"]["outcome"] == "patched"


def test_an_autotune_fxguard_does_not_know_stands_down_with_a_warning(monkeypatch, caplog):
    """A torch whose autotune_to_one_config is another (it keeps no launchers):
    the row stands down with a WARNING, the function is left as it is."""
    fxguard.uninstall()
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    def autotune_to_one_config(self, *args, **kwargs):
        return self.pick(*args, **kwargs)
    monkeypatch.setattr(CachingAutotuner, "autotune_to_one_config", autotune_to_one_config)
    code = autotune_to_one_config.__code__
    with caplog.at_level("WARNING", logger="fxguard"):
        rows = {r["what"]: r for r in fxguard.install()["patch_points"]}
    row = rows["a shared kernel tuned by one thread at a time"]
    assert row["outcome"] == "not covered" and not row["patched"]
    assert "kernels tune as stock" in caplog.text
    assert CachingAutotuner.autotune_to_one_config is autotune_to_one_config
    assert autotune_to_one_config.__code__ is code


def test_one_kernels_tuning_is_one_threads_at_a_time():
    """The helper alone (any machine): a second thread's hold on the same kernel
    waits for the first's; another kernel's does not; off, nothing is held."""
    tuning = kernel_tuning.KernelTuning()
    kernel, other = type("Kernel", (), {})(), type("Kernel", (), {})()
    inside, second_in, release = threading.Event(), threading.Event(), threading.Event()

    def first():
        with tuning.lock_for(kernel):
            inside.set()
            assert release.wait(60)

    def second():
        with tuning.lock_for(kernel):
            second_in.set()
    a = threading.Thread(target=first)
    a.start()
    assert inside.wait(60)
    with tuning.lock_for(other):  # another kernel: no wait
        pass
    b = threading.Thread(target=second)
    b.start()
    wait_until(lambda: second_in.is_set() or held_in(b, second.__code__),
               "the second thread to wait or to pass")
    assert not second_in.is_set(), "two threads held one kernel's tuning"
    release.set()
    a.join(60)
    b.join(60)
    assert second_in.is_set()
    tuning.enabled = False
    first_off = tuning.lock_for(kernel)
    with first_off, tuning.lock_for(kernel):
        assert not isinstance(first_off, type(threading.RLock()))


def _compiled():
    f = fresh_function(SOURCE.format(k=next(_kernels)), "f", {"torch": torch})
    # Several configs per kernel, each benchmarked at the first launch (no best
    # config from an earlier run's autotune cache).
    return f, torch.compile(f, dynamic=False, options={
        "max_autotune": True, "max_autotune_pointwise": True, "autotune_local_cache": False})


def _parked_in_tuning(frame) -> bool:
    """Blocked on the kernel's tuning lock, in the swapped function's own ``with``."""
    return frame.f_code.co_name == "autotune_to_one_config"


@on_gpu
@pytest.mark.parametrize("guard", [
    pytest.param("off", marks=pytest.mark.xfail(
        strict=True, reason="stock: a kernel's first launches benchmark it together")),
    "on"], indirect=True)
def test_a_second_first_launch_waits_for_the_tuning(guard, monkeypatch):
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    bench = CachingAutotuner.bench
    lock, inside, benched, overlaps = threading.Lock(), {}, set(), []
    tuning = threading.Event()
    threads = {}

    def watched_bench(self, launcher, *args, **kwargs):
        me = threading.current_thread().name
        with lock:
            benched.add(me)
            inside.setdefault(id(self), set()).add(me)
            if len(inside[id(self)]) > 1:
                overlaps.append(self.fn.__name__)
            first = me == "tuner" and not tuning.is_set()
        try:
            if first:
                tuning.set()   # "second" starts now
                wait_until(lambda: "second" in threads and (
                    len(inside[id(self)]) > 1 or held_in(threads["second"], _parked_in_tuning)),
                    "the second thread to wait for the tuning or to benchmark beside it", 300)
            return bench(self, launcher, *args, **kwargs)
        finally:
            with lock:
                inside[id(self)].discard(me)
    monkeypatch.setattr(CachingAutotuner, "bench", watched_bench)

    f, compiled = _compiled()
    x = torch.randn(512, 4096, device="cuda")
    out = {}

    def call(name):
        out[name] = compiled(x)
        torch.cuda.synchronize()
    threads["tuner"] = threading.Thread(target=call, args=("tuner",), name="tuner")
    threads["tuner"].start()
    assert tuning.wait(300), "the tuner never benchmarked a kernel (no kernel with several configs)"
    threads["second"] = threading.Thread(target=call, args=("second",), name="second")
    threads["second"].start()
    for t in threads.values():
        t.join(600)
        assert not t.is_alive(), f"{t.name} hangs"
    want = f(x)
    for name in ("tuner", "second"):
        torch.testing.assert_close(out[name], want)
    assert not overlaps, f"benchmarked by two threads at once: {overlaps}"
    assert benched == {"tuner"}


@on_gpu
@pytest.mark.parametrize("threads", [8])
def test_first_launches_of_eight_threads_together(threads):
    f, compiled = _compiled()
    x = torch.randn(512, 4096, device="cuda")
    start = threading.Barrier(threads)
    out = [None] * threads

    def call(i):
        start.wait(60)
        out[i] = compiled(x)
        torch.cuda.synchronize()
    workers = [threading.Thread(target=call, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(600)
        assert not t.is_alive(), "hangs"
    want = f(x)
    for got in out:
        torch.testing.assert_close(got, want)

