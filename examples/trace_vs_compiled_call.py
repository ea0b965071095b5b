"""Race (a): thread 1 sits inside torch.fx.symbolic_trace while thread 2 calls
a compiled function.  Stock torch <= 2.13: thread 2 raises "Detected that you
are using FX to symbolically trace a dynamo-optimized function".

    python trace_vs_compiled_call.py                     # exit 1 on stock torch
    fxguard run trace_vs_compiled_call.py                # exit 0
    FXGUARD=1 python trace_vs_compiled_call.py           # exit 0
    FXGUARD=1 torchrun --nproc-per-node 2 trace_vs_compiled_call.py
    pytest --fxguard trace_vs_compiled_call.py           # as a test

No fxguard in here: the point is turning it on from outside.
"""
import os
import sys
import threading

import torch


def compiled_call_during_trace() -> str | None:
    """None if the compiled call ran, else the error's first line."""
    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
    compiled(torch.ones(3))
    inside, release = threading.Event(), threading.Event()

    class Waits(torch.nn.Module):
        def forward(self, x):
            inside.set()
            release.wait(60)
            return x + 1

    tracer = threading.Thread(target=torch.fx.symbolic_trace, args=(Waits(),), daemon=True)
    tracer.start()
    assert inside.wait(60), "the tracer never entered its trace"
    try:
        compiled(torch.ones(3))
        return None
    except RuntimeError as e:
        return str(e).splitlines()[0]
    finally:
        release.set()
        tracer.join(60)


def test_compiled_call_during_trace():
    assert compiled_call_during_trace() is None


if __name__ == "__main__":
    error = compiled_call_during_trace()
    fxguard = sys.modules.get("fxguard")
    installed = fxguard is not None and fxguard.is_installed()
    print(f"trace-vs-compiled-call rank {os.environ.get('RANK', '-')}: fxguard installed: {installed}; "
          + ("compiled call ran" if error is None else f"compiled call raised: {error}"))
    sys.exit(0 if error is None else 1)
