"""Stress: many threads mixing symbolic_trace, make_fx and compiled calls, bounded in time.

No lock around the traces: with fxguard, overlapping direct traces patch
only their own thread (tests/test_concurrent_direct_traces.py); traces in some
threads, compiled calls in the others.
"""
import threading
import time

import torch
from guarded import both_ways
from torch.fx.experimental.proxy_tensor import make_fx

import fxguard

THREADS = 9          # three of each kind
SECONDS = 6.0        # wall-clock budget for the mixed phase
MAX_ITERATIONS = 400  # per thread, whichever comes first


class Small(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2 + 1


def _worker(kind, compiled, start, deadline, errors, flags_at_end, counts):
    start.wait()
    n = 0
    try:
        while n < MAX_ITERATIONS and time.monotonic() < deadline:
            if kind == "symbolic_trace":
                torch.fx.symbolic_trace(Small())
            elif kind == "make_fx":
                make_fx(lambda x: x.cos() + 1)(torch.ones(3))
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
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join(SECONDS + 60)
    assert not any(t.is_alive() for t in threads)
    assert errors == [], f"{len(errors)} errors, first: {errors[0]}"
    assert flags == [False] * THREADS
    assert torch.fx._symbolic_trace.is_fx_tracing() is False
    assert all(counts.get(k, 0) > 0 for k in set(kinds)), counts
    if guard == "on":
        assert fxguard._core._tracing_records() == 0
