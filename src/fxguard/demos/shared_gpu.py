"""The shared-GPU deadlock between dynamo's compile_lock and the autograd worker.

Every Python thread on one GPU shares that device's single autograd worker
thread.  Forced interleaving (``python -m fxguard.demos.shared_gpu [--install]``):

  1. B runs a compiled function forward; its backward is compiled lazily.
  2. A takes torch._dynamo.convert_frame.compile_lock (as any dynamo compile
     does) and then needs the worker: it runs a backward on the GPU.
  3. B's backward got to the worker first; the lazy backward compile there
     waits for compile_lock.  A waits for the worker: neither moves.

With install() (eager backward) step 1 compiles B's backward with its forward,
so the worker never needs the lock.  ``probe()`` runs the scenario in a
subprocess with a watchdog, so a deadlock is reported in seconds, not a hang.
"""
from __future__ import annotations

import faulthandler
import os
import subprocess
import sys
import threading
import time

STALL_SECONDS = 20.0  # after setup, the interleaving needs well under a second
DEADLOCK_EXIT = 3
COMPLETED, DEADLOCKED, ERROR = "completed", "deadlocked", "error"  # probe()'s results


def scenario(install: bool) -> None:
    import torch
    from torch._dynamo.convert_frame import compile_lock

    if install:
        import fxguard
        fxguard.install()
    device = "cuda"
    compiled = torch.compile(lambda x: (x.sin() * 2).cos())
    b_forward_done, a_has_lock, b_started_backward = (threading.Event() for _ in range(3))
    errors: list[BaseException] = []

    def b() -> None:
        try:
            x = torch.randn(64, device=device, requires_grad=True)
            out = compiled(x)  # forward compiled; backward lazy on stock torch
            b_forward_done.set()
            a_has_lock.wait(60)
            b_started_backward.set()
            out.sum().backward()  # lazy backward compile on the worker: needs compile_lock
        except BaseException as e:
            errors.append(e)

    def a() -> None:
        try:
            b_forward_done.wait(120)
            with compile_lock:
                a_has_lock.set()
                b_started_backward.wait(60)
                time.sleep(0.5)  # let B's backward reach the worker first
                y = torch.randn(64, device=device, requires_grad=True)
                (y * 3).sum().backward()  # needs the same worker
        except BaseException as e:
            errors.append(e)

    tb, ta = threading.Thread(target=b, daemon=True), threading.Thread(target=a, daemon=True)
    tb.start()
    ta.start()
    b_forward_done.wait(300)
    # From here on the scenario takes well under a second unless it deadlocks.
    faulthandler.dump_traceback_later(STALL_SECONDS, exit=False)
    ta.join(STALL_SECONDS)
    tb.join(1)
    faulthandler.cancel_dump_traceback_later()
    if ta.is_alive() or tb.is_alive():
        print(DEADLOCKED, flush=True)
        os._exit(DEADLOCK_EXIT)
    if errors:
        raise errors[0]
    print(COMPLETED, flush=True)


def probe(install: bool, timeout: float = 600.0) -> dict:
    """Run the scenario in a subprocess: {'result': COMPLETED | DEADLOCKED | ERROR, ...}."""
    cmd = [sys.executable, "-m", "fxguard.demos.shared_gpu"] + (["--install"] if install else [])
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"result": DEADLOCKED, "seconds": timeout, "detail": "no answer before timeout"}
    seconds = round(time.monotonic() - start, 1)
    if proc.returncode == DEADLOCK_EXIT:
        return {"result": DEADLOCKED, "seconds": seconds, "detail": proc.stderr[-3000:]}
    if proc.returncode == 0 and COMPLETED in proc.stdout.split():
        return {"result": COMPLETED, "seconds": seconds, "detail": ""}
    return {"result": ERROR, "seconds": seconds, "detail": (proc.stdout + proc.stderr)[-3000:]}


if __name__ == "__main__":
    scenario(install="--install" in sys.argv[1:])
