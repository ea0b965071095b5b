"""Threads that reach one graph together: stock dynamo compiles it once per thread."""
from __future__ import annotations

import sys
import threading
import time
import types

from .races import TIMEOUT, RaceResult


def available() -> bool:
    """Whether this torch has the layout the "compile once" row knows."""
    from ..torch_support import compile_once
    try:
        compile_once.find()
    except (compile_once.NotAvailable, RuntimeError):
        return False
    return True


class CallbackWatch:
    """Which threads have entered dynamo's cache-miss callback (stock or wrapped)
    for a frame of ``code``, as the threads themselves tell: each arms a profile
    hook before its call, which notes that callback and removes itself.  (The
    callback also runs for frames dynamo skips on the way, hence the code.
    Walking another thread's frames, sys._current_frames(), races with that
    thread on a free-threaded build and can crash.)"""

    def __init__(self, code: types.CodeType) -> None:
        self.code = code
        from torch._dynamo import convert_frame
        call, self.codes = convert_frame.CatchErrorsWrapper.__call__, set()
        while call is not None:
            self.codes.add(call.__code__)
            call = getattr(call, "__wrapped__", None)
        self.entered: set[int] = set()

    def arm(self) -> None:
        """In the thread, before it calls the compiled function."""
        def hook(frame, event, arg):
            if event == "call" and frame.f_code in self.codes and \
                    getattr(frame.f_locals.get("frame"), "f_code", None) is self.code:
                self.entered.add(threading.get_ident())
                sys.setprofile(None)
        sys.setprofile(hook)

    @staticmethod
    def disarm() -> None:
        sys.setprofile(None)  # a call that hit the cache never entered the callback

    def inside(self, thread: threading.Thread) -> bool:
        return thread.ident in self.entered


def duplicate_compile(threads: int = 3) -> RaceResult:
    """3 threads call one cold compiled function together (compile once)."""
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    compiles: list[str] = []
    workers: list[threading.Thread] = []
    step = lambda x: x.sin() * 2 + 1  # noqa: E731
    watch = CallbackWatch(step.__code__)

    def backend(gm, example_inputs):
        compiles.append(threading.current_thread().name)
        if len(compiles) == 1:  # hold the first compile until the others missed too
            me, deadline = threading.current_thread(), time.monotonic() + TIMEOUT
            while not all(t is me or not t.is_alive() or watch.inside(t) for t in workers):
                if time.monotonic() > deadline:
                    raise TimeoutError("the other threads never reached dynamo's callback")
                time.sleep(0.005)
        return gm.forward

    compiled = torch.compile(step, backend=backend)
    x, start, errors = torch.randn(8), threading.Barrier(threads), []

    def work() -> None:
        try:
            start.wait(TIMEOUT)
            watch.arm()
            compiled(x)
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            watch.disarm()

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
