"""Threads that reach one graph together: stock dynamo compiles it once per thread."""
from __future__ import annotations

import sys
import threading
import time

from .races import TIMEOUT, RaceResult


def available() -> bool:
    """Whether this torch has the layout the "compile once" row needs."""
    from ..torch_support import compile_once
    try:
        compile_once._find_torch()
    except (compile_once.NotAvailable, RuntimeError):
        return False
    return True


def callback_codes() -> set:
    """Code objects of dynamo's cache-miss callback, as it is now and beneath."""
    from torch._dynamo import convert_frame
    call = convert_frame.CatchErrorsWrapper.__call__
    codes = {call.__code__}
    while hasattr(call, "__wrapped__"):
        call = call.__wrapped__
        codes.add(call.__code__)
    return codes


def in_callback(thread: threading.Thread, codes: set) -> bool:
    frame = sys._current_frames().get(thread.ident)
    while frame is not None and frame.f_code not in codes:
        frame = frame.f_back
    return frame is not None


def duplicate_compile(threads: int = 3) -> RaceResult:
    """3 threads call one cold compiled function together (compile once)."""
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    compiles: list[str] = []
    workers: list[threading.Thread] = []
    codes = callback_codes()

    def backend(gm, example_inputs):
        compiles.append(threading.current_thread().name)
        if len(compiles) == 1:  # hold the first compile until the others missed too
            me, deadline = threading.current_thread(), time.monotonic() + TIMEOUT
            while not all(t is me or not t.is_alive() or in_callback(t, codes) for t in workers):
                if time.monotonic() > deadline:
                    raise TimeoutError("the other threads never reached dynamo's callback")
                time.sleep(0.005)
        return gm.forward

    compiled = torch.compile(lambda x: x.sin() * 2 + 1, backend=backend)
    x, start, errors = torch.randn(8), threading.Barrier(threads), []

    def work() -> None:
        try:
            start.wait(TIMEOUT)
            compiled(x)
        except BaseException as e:  # reported below
            errors.append(e)

    workers += [threading.Thread(target=work, name=f"compile-{i}", daemon=True)
                for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(TIMEOUT)
    torch._dynamo.reset()
    if errors:
        raise errors[0]
    n = len(compiles)
    return RaceResult("duplicate-compile", n > 1,
                      f"{n} compile{'s' * (n != 1)} of one graph for {threads} threads")
