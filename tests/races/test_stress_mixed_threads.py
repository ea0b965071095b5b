"""Stress: many threads mixing symbolic_trace, make_fx and compiled calls, bounded in time.

No lock around the traces: with fxguard, overlapping direct traces patch
only their own thread (tests/races/test_concurrent_direct_traces.py); traces in some
threads, compiled calls in the others.
"""
import sys
import threading
import time

import torch
from guarded import both_ways
from torch.fx.experimental.proxy_tensor import make_fx

import fxguard

THREADS = 9          # three of each kind
SECONDS = 6.0        # wall-clock budget for the mixed phase
MAX_ITERATIONS = 400  # per thread, whichever comes first


SWITCH_INTERVAL = 1e-5  # seconds; at the default 5 ms most traces run unbroken


class Small(torch.nn.Module):
    """Its Linear is a leaf: a trace whose patches another thread reverted inlines it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2 + 1


def _check(kind, result):
    """A trace that raised nothing can still be wrong: look at what it built."""
    if kind == "symbolic_trace":
        ops = [(n.op, n.target) for n in result.graph.nodes]
        assert ("call_module", "lin") in ops, f"leaf Linear not kept: {ops}"
    elif kind == "make_fx":
        assert "cos" in result.code, result.code


def _worker(kind, compiled, start, deadline, errors, flags_at_end, counts):
    start.wait()
    n = 0
    try:
        while n < MAX_ITERATIONS and time.monotonic() < deadline:
            if kind == "symbolic_trace":
                _check(kind, torch.fx.symbolic_trace(Small()))
            elif kind == "make_fx":
                _check(kind, make_fx(lambda x: x.cos() + 1)(torch.ones(3)))
            else:
                compiled(torch.ones(3))
            n += 1
    except Exception as e:  # every failure counts
        errors.append(f"{kind}: {type(e).__name__}: {str(e).splitlines()[0]}")
    counts[kind] = counts.get(kind, 0) + n
    flags_at_end.append(torch.fx._symbolic_trace.is_fx_tracing())


@both_ways(lambda: True)  # stock: overlapping direct traces race on every torch so far
def test_mixed_threads_zero_errors_and_flag_false_everywhere(guard):
    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
    compiled(torch.ones(3))
    start = threading.Event()
    deadline = time.monotonic() + SECONDS
    errors, flags, counts = [], [], {}
    kinds = ["symbolic_trace", "make_fx", "compiled"] * (THREADS // 3)
    threads = [threading.Thread(target=_worker, args=(k, compiled, start, deadline, errors, flags, counts))
               for k in kinds]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)  # more interleavings per second
    try:
        for t in threads:
            t.start()
        start.set()
        for t in threads:
            t.join(SECONDS + 60)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads)
    assert errors == [], f"{len(errors)} errors, first: {errors[0]}"
    assert flags == [False] * THREADS
    assert torch.fx._symbolic_trace.is_fx_tracing() is False
    assert all(counts.get(k, 0) > 0 for k in set(kinds)), counts
    if guard == "on":
        assert fxguard._core._tracing_records() == 0
