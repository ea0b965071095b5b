"""Race: torch.compile(mode=...) sets its options process-wide for a moment.

``torch.compile(fn, mode="reduce-overhead")`` asks for its compiler config at
once, outside dynamo's compile_lock: ``get_patched_config_dict`` patches
``torch._inductor.config`` (``triton.cudagraphs = True``), copies it and puts
the old value back.  Where config is process-wide (torch <= 2.11) another
thread reads the option meanwhile (its compile graphs a block mask), and two
such windows that interleave leave it on for good.  Seen on the H200 with three
drafter threads (docs/cuda-graphs.md).  The tests hold a window open where it
copies the config: a config value whose deepcopy waits.
"""
import sys
import threading

import pytest
import torch
from guarded import both_ways, finish, run_raising

from fxguard.torch_support import facts

pytestmark = pytest.mark.skipif(facts.config_is_per_thread(),
                                reason="this torch keeps config per thread: no window to race")
HOLD = 60.0  # hang guard only


def config_is_process_global() -> bool:
    return not facts.config_is_per_thread()


class Held:
    """A custom pass (a config value) whose deepcopy waits in the threads named:
    whoever copies the config stops there, inside torch.compile's window."""

    def __init__(self) -> None:
        self.inside: dict[str, threading.Event] = {}
        self.release: dict[str, threading.Event] = {}

    def hold(self, name: str) -> None:
        self.inside[name], self.release[name] = threading.Event(), threading.Event()

    def __deepcopy__(self, memo):
        name = threading.current_thread().name
        if name in self.inside and not self.inside[name].is_set() and _in_window():
            self.inside[name].set()
            assert self.release[name].wait(HOLD)
        return self

    def __call__(self, graph) -> None:
        pass


def _in_window() -> bool:
    """Copied by get_patched_config_dict (torch.compile also copies the config before)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "get_patched_config_dict":
        frame = frame.f_back
    return frame is not None


@pytest.fixture
def held():
    import torch._inductor.config as config
    before = config.post_grad_custom_post_pass, config.triton.cudagraphs
    config.post_grad_custom_post_pass = value = Held()
    yield value
    for event in value.release.values():
        event.set()
    config.post_grad_custom_post_pass, config.triton.cudagraphs = before  # stock leaves it on


def compile_reduce_overhead() -> None:
    torch.compile(lambda x: x + 1, mode="reduce-overhead")  # the window; nothing compiles yet


@both_ways(races=config_is_process_global)
def test_another_thread_does_not_read_the_options_of_a_torch_compile_call(guard, held):
    import torch._inductor.config as config
    before, seen = config.triton.cudagraphs, []
    held.hold("a")

    def reader():
        try:
            assert held.inside["a"].wait(HOLD)
            seen.append(config.triton.cudagraphs)  # what a compile here would graph by
        finally:
            held.release["a"].set()

    run_raising([compile_reduce_overhead, reader], timeout=HOLD,
                made=lambda threads: setattr(threads[0], "name", "a"))
    assert held.inside["a"].is_set(), "torch.compile copied no config"
    assert seen == [before], f"another thread read triton.cudagraphs={seen[0]} inside the window"


@both_ways(races=config_is_process_global)
def test_interleaved_torch_compile_calls_leave_the_options_as_they_were(guard, held):
    """Window a saves False and sets True; window b saves a's True; a puts False
    back, then b puts True back: stock keeps CUDA graphs on for every later compile."""
    import torch._inductor.config as config
    before = config.triton.cudagraphs
    held.hold("a")
    held.hold("b")
    a = threading.Thread(target=compile_reduce_overhead, name="a", daemon=True)
    b = threading.Thread(target=compile_reduce_overhead, name="b", daemon=True)
    a.start()
    assert held.inside["a"].wait(HOLD)
    b.start()
    assert held.inside["b"].wait(HOLD)  # both windows open at once
    held.release["a"].set()
    finish(a, timeout=HOLD)
    held.release["b"].set()
    finish(b, timeout=HOLD)
    assert held.inside["a"].is_set() and held.inside["b"].is_set()
    assert config.triton.cudagraphs == before, "torch.compile's option outlived both windows"


def test_options_are_what_torch_gives():
    """The row's copy is the dictionary torch's window gives, for the modes."""
    import fxguard
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import get_patched_config_dict
    stock = {mode: get_patched_config_dict(list_mode_options(mode)) for mode in
             ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")}
    fxguard.install()
    for mode, want in stock.items():
        assert get_patched_config_dict(list_mode_options(mode)) == want, mode
    assert get_patched_config_dict({"triton.cudagraphs": True, "max_autotune": True}) == \
        {**stock["default"], "triton.cudagraphs": True, "max_autotune": True}
