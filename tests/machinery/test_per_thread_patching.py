"""A thread reads a patched name while another withdraws one Dispatch and places the next.

Found by the mixed stress test at a 10 µs switch interval (torch 2.15.0, 2026-12-03):
a Tracer saved the Dispatch itself as "the original", wrote it back when its
trace ended, and every later call through it recursed until the process died.
Events force the interleaving here; no torch needed.
"""
import threading

import pytest

from fxguard import _core
from fxguard.machinery import per_thread_patching


def original():
    return "original"


def tracer_a():
    return "a"


def tracer_a_again():
    return "a again"


class PausingRegistry(dict):
    """``_dispatchers`` that stops one thread right after its lookup."""

    def __init__(self, thread_name):
        super().__init__()
        self.thread_name = thread_name
        self.looked_up = threading.Event()
        self.resume = threading.Event()

    def get(self, key, default=None):
        value = super().get(key, default)
        if threading.current_thread().name == self.thread_name and not self.looked_up.is_set():
            self.looked_up.set()
            assert self.resume.wait(30), "the test did not resume the reader"
        return value


@pytest.fixture
def registry(monkeypatch):
    reg = PausingRegistry("reader")
    monkeypatch.setattr(per_thread_patching, "_dispatchers", reg)
    return reg


def test_a_stale_lookup_never_hands_out_the_dispatch(registry):
    module_globals = {"fn": original}
    view = per_thread_patching.view(module_globals)
    view["fn"] = tracer_a                  # main traces: first Dispatch placed
    first = module_globals["fn"]
    assert isinstance(first, _core.Dispatch)

    seen, wrote_back, errors = [], [], []

    def reader():  # a Tracer in another thread: save what is there, later put it back
        try:
            saved = per_thread_patching.view(module_globals)["fn"]
            seen.append(saved)
            per_thread_patching.view(module_globals)["fn"] = saved
            wrote_back.append(module_globals["fn"]())
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=reader, name="reader")
    t.start()
    assert registry.looked_up.wait(30)     # the reader holds the first entry...
    view["fn"] = original                  # ...main's trace ends: first Dispatch withdrawn
    assert module_globals["fn"] is original
    view["fn"] = tracer_a_again            # main traces again: a second Dispatch placed
    second = module_globals["fn"]
    assert isinstance(second, _core.Dispatch) and second is not first
    registry.resume.set()
    t.join(30)
    assert not t.is_alive()
    assert errors == []
    assert seen == [original]              # what the reader's thread runs, not the Dispatch
    assert wrote_back == ["original"]
    assert second.overriding == 1          # only main's override is left
    view["fn"] = original
    assert module_globals["fn"] is original


def test_a_dispatch_refuses_to_run_itself():
    d = _core.Dispatch(original, original)
    with pytest.raises(ValueError, match="cannot run itself"):
        d.set(d)
    assert d.overriding == 0
