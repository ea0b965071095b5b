"""dynamo's _force_inline_flag: while one thread's compile inlines a function
whole (trace_rules._force_inline()), another thread's frame callback must still
skip what dynamo skips.  Process-wide, the other thread's skip check said "don't
skip" for everything: a module call compiled at Module._wrapped_call_impl instead
of its forward (the concurrent-compiles stress test saw its MLP 'not compiled').

Deterministic: thread A holds _force_inline() open while the main thread asks
check_verbose() about a frame dynamo skips.  Without the option the compile lock
keeps compiles apart, but the check runs outside it, in every thread.
"""
import threading

import torch
from torch._dynamo import trace_rules

from guarded import apply_way, concurrent_ways, finish, needs, needs_the_gil

pytestmark = [needs_the_gil, needs("torch._dynamo.trace_rules._force_inline")]


@concurrent_ways()
def test_force_inline_stays_in_its_thread(way, monkeypatch):
    apply_way(way, monkeypatch, lock_hides=False)
    skipped = torch.nn.Module._wrapped_call_impl.__code__
    assert trace_rules.check_verbose(skipped).skipped  # dynamo skips torch.nn's own frames
    inside, done = threading.Event(), threading.Event()

    def a():
        with trace_rules._force_inline():
            inside.set()
            assert done.wait(60)

    thread = threading.Thread(target=a, daemon=True)
    thread.start()
    assert inside.wait(60)
    try:
        result = trace_rules.check_verbose(skipped)
    finally:
        done.set()
        finish(thread, timeout=60)
    assert result.skipped, result  # dynamo's SkipResult, its reason with it
