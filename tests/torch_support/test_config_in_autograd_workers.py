"""Config follows the thread into autograd workers.

torch 2.12+ keeps config overrides per thread (ContextVars).  Backward nodes
do not always run in the thread that called backward(): a GPU's autograd
worker serves every thread, and on any device a reentrant backward deeper than
the engine's limit (60) continues on a pool thread.  There a stock node reads
torch's defaults.  With fxguard the node runs with the overrides of the thread
whose graph task it is (carried with that thread's record).
"""
import threading

import pytest
import torch
import torch._dynamo.config as dyn
import torch._functorch.config as functorch_config
from guarded import both_ways, finish, run_together, stock_loses_config

import fxguard
from fxguard import _core
from fxguard.torch_support import facts

pytestmark = pytest.mark.skipif(not facts.config_is_per_thread(),
                                reason="torch <= 2.11 keeps config process-wide: nothing to carry")

@pytest.fixture
def installed():
    return fxguard.install()


DEEP = 64  # > the engine's reentrant depth limit (60): the rest runs on its pool thread


class Deep(torch.autograd.Function):
    """Each backward starts a nested backward, DEEP levels down; the deepest
    levels record (thread, what they read)."""
    seen: dict
    set_on_worker = None  # a value the deepest levels assign, after reading

    @staticmethod
    def forward(ctx, x, depth, key):
        ctx.depth, ctx.key = depth, key
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.depth >= DEEP - 2:
            Deep.seen.setdefault(ctx.key, []).append(
                (threading.get_ident(), dyn.recompile_limit, _core._carried_context() is not None))
            if Deep.set_on_worker is not None:
                dyn.recompile_limit = Deep.set_on_worker
        if ctx.depth < DEEP:
            with torch.enable_grad():
                x = torch.ones(2, requires_grad=True)
                torch.autograd.grad(Deep.apply(x, ctx.depth + 1, ctx.key).sum(), x)
        return grad, None, None


def deep_backward(key):
    x = torch.ones(2, requires_grad=True)
    Deep.apply(x, 0, key).sum().backward()


def limits_seen_on_a_worker(key, caller):
    rows = Deep.seen[key]
    on_worker = [limit for ident, limit, _ in rows if ident != caller]
    assert on_worker, "the engine ran no level on another thread (its depth limit changed?)"
    return set(on_worker)


@both_ways(races=stock_loses_config)
def test_reentrant_backward_on_the_pool_thread_sees_its_threads_config(guard):
    Deep.seen = {}
    callers = {}
    barrier = threading.Barrier(2, timeout=30)

    def thread(key, limit):
        def body():
            callers[key] = threading.get_ident()
            dyn.recompile_limit = limit  # this thread's own override, set after start()
            barrier.wait()               # both threads' overrides exist before either backward
            deep_backward(key)
        return body

    run_together(thread("a", 33), thread("b", 44))
    assert limits_seen_on_a_worker("a", callers["a"]) == {33}
    assert limits_seen_on_a_worker("b", callers["b"]) == {44}


@both_ways(races=stock_loses_config)
def test_main_threads_override_reaches_the_pool_thread(guard):
    Deep.seen = {}
    with dyn.patch(recompile_limit=21):
        deep_backward("main")
    assert limits_seen_on_a_worker("main", threading.get_ident()) == {21}


def test_what_a_node_sets_on_the_worker_stays_in_that_node(installed):
    """A node's own config change (config.patch inside backward, a lazy
    compile) is neither left in the worker for the next thread's node nor
    written back into the thread it ran for."""
    Deep.seen = {}
    callers, after = {}, {}

    def thread(key, limit):
        def body():
            callers[key] = threading.get_ident()
            dyn.recompile_limit = limit
            deep_backward(key)
            after[key] = dyn.recompile_limit
        return body

    Deep.set_on_worker = 99
    try:
        run_together(thread("setter", 33))
    finally:
        Deep.set_on_worker = None
    run_together(thread("next", 12))
    assert limits_seen_on_a_worker("setter", callers["setter"]) == {33, 99}  # its own change, then
    assert after["setter"] == 33  # not written back into the thread
    assert limits_seen_on_a_worker("next", callers["next"]) == {12}  # not left in the worker


def test_a_thread_started_before_install_is_carried_too():
    """The record is published at backward(), not at start(): a thread that
    was already running when install() came gets its config carried as well."""
    Deep.seen = {}
    installed_now, caller = threading.Event(), []

    def body():
        caller.append(threading.get_ident())
        dyn.recompile_limit = 27
        assert installed_now.wait(30)
        deep_backward("early")

    t = threading.Thread(target=body, daemon=True)
    t.start()
    try:
        fxguard.install()
    finally:
        installed_now.set()
    finish(t)
    assert limits_seen_on_a_worker("early", caller[0]) == {27}


def test_python_threads_answer_none(installed):
    out = []
    run_together(lambda: out.append(_core._carried_context()))
    assert out == [None] and _core._carried_context() is None


def test_status_row(installed):
    rows = {r["what"]: r for r in fxguard.status()["patch_points"]}
    assert rows["config in autograd workers"]["outcome"] == "patched"
    fxguard.install(config_follows_thread=False)
    rows = {r["what"]: r for r in fxguard.status()["patch_points"]}
    assert rows["config in autograd workers"]["outcome"] == "option off"


# -- the device's autograd worker ----------------------------------------------------

class Probe(torch.autograd.Function):
    seen: list

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        Probe.seen.append((threading.get_ident(), functorch_config.donated_buffer,
                           dyn.recompile_limit))
        return grad


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@both_ways(races=stock_loses_config)
def test_cuda_worker_runs_each_threads_backward_with_its_overrides(guard):
    Probe.seen = []
    callers = {}
    barrier = threading.Barrier(2, timeout=30)

    def thread(key, limit):
        def body():
            callers[key] = threading.get_ident()
            dyn.recompile_limit = limit
            functorch_config.donated_buffer = not functorch_config._config["donated_buffer"].default
            barrier.wait()
            for _ in range(20):
                x = torch.ones(4, device="cuda", requires_grad=True)
                Probe.apply(x).sum().backward()
        return body

    run_together(thread("a", 31), thread("b", 41))
    flipped = not functorch_config._config["donated_buffer"].default
    by_limit = {}
    for ident, donated, limit in Probe.seen:
        assert ident not in callers.values()  # the CUDA worker ran it
        by_limit.setdefault(limit, set()).add(donated)
    assert by_limit == {31: {flipped}, 41: {flipped}}
