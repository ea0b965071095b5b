"""Race (b): Tracer.trace and _set_compilation_env interleave save/restore; the flag sticks."""
import threading

from guarded import both_ways

from fxguard.demos import races


@both_ways()
def test_flag_not_left_stuck_after_interleaved_save_restore(guard):
    result = races.trace_vs_compilation_env()
    assert not result.raced, result.detail


@both_ways()
def test_every_thread_reads_false_afterwards(guard):
    import torch

    races.trace_vs_compilation_env()
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.fx._symbolic_trace.is_fx_tracing()))
    t.start()
    t.join()
    assert seen == [False]
    assert torch.fx._symbolic_trace.is_fx_tracing() is False
