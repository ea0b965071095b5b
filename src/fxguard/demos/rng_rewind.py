"""A thread's random draws while another thread compiles, drawn again after it.

Dynamo sets the CPU (and CUDA) generator back to where it was when a compile
started; a thread that drew meanwhile gets the same numbers again.  Forced:
the compile is held in its backend while the other thread draws three times.
"""
from __future__ import annotations

import itertools
import linecache
import threading

from .races import RaceResult

_names = itertools.count()


def _fresh_function():
    """A function in a code object of its own (its own cache entries and
    recompile budget), with source where inspect finds it (torch 2.11 compiles
    a function without one through a wrapper that every such function shares)."""
    source = "def double_plus_one(x):\n    return x * 2 + 1\n"
    filename = f"<fxguard rng demo {next(_names)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["double_plus_one"]


def draws_during_a_compile(device: str = "cpu") -> tuple[list, list]:
    """(draws of a thread made while the main thread's compile was held, the
    main thread's draws after the compile), from ``device``'s generator."""
    import torch
    in_backend, drawn = threading.Event(), threading.Event()

    def backend(gm, example_inputs):
        in_backend.set()
        drawn.wait(60)
        return gm.forward

    during: list = []

    def drafter() -> None:
        in_backend.wait(60)
        during.extend(torch.rand(4, device=device).tolist() for _ in range(3))
        drawn.set()

    thread = threading.Thread(target=drafter, daemon=True)
    thread.start()
    torch.compile(_fresh_function(), backend=backend)(torch.ones(3))
    thread.join(60)
    return during, [torch.rand(4, device=device).tolist() for _ in range(3)]


def rng_rewound() -> RaceResult:
    """A drafter's random draws during another thread's compile, repeated after it."""
    during, after = draws_during_a_compile()
    repeated = sum(d in during for d in after)
    return RaceResult("rng-rewound", repeated > 0, f"{repeated} of {len(after)} draws repeated")
