"""A compile leaves the random numbers other threads drew.

Dynamo's ``preserve_global_state`` saves the CPU and CUDA generator states
when a compile starts and sets them back when it ends.  A thread that drew
random numbers meanwhile (a warm drafter stepping while another compiles)
draws the same numbers again afterwards: repeated dropout masks, noise and
sampled positions.

With the row, ``torch.random.set_rng_state`` and ``torch.cuda.set_rng_state``
(their code swapped, identity kept) skip the calls those restores make (also
``preserve_rng_state`` inside AOT autograd and inductor, and dynamo's
``checkpoint_params``) while other threads run, so no thread's draws are rewound; in a single-threaded
process the restore happens exactly as stock.  What a compile itself drew
(rarely anything: tracing runs on fake tensors) stays drawn when threads run.
Every other caller of these functions, the user's own included, is served as
stock.
"""
from __future__ import annotations

import sys
import threading
import types
from typing import Any, Callable

from ..machinery.changes import Outcome

CONVERT_FRAME = "torch._dynamo.convert_frame"
SAVER = f"{CONVERT_FRAME}.preserve_global_state"
# Where a compile saves and restores the generators: around the whole compile
# (the contract the row needs), and inside it (AOT autograd's and inductor's
# preserve_rng_state, dynamo's checkpoint_params) where this torch has them.
SITES = (SAVER, "torch._dynamo.utils.preserve_rng_state", "torch._dynamo.utils.checkpoint_params")

Key = tuple[str, str, int]  # (file, name, first line) of a code object


def _sites() -> tuple[frozenset[Key], frozenset[Key]]:
    """(codes that save the generator states, codes that set them back) in SITES."""
    import importlib
    saves, restores = set(), set()
    for path in SITES:
        module, _, name = path.rpartition(".")
        fn = vars(importlib.import_module(module)).get(name)
        fn = getattr(fn, "__wrapped__", fn)  # a contextmanager: its generator function
        if not isinstance(fn, types.FunctionType):
            continue
        stack = [fn.__code__]
        while stack:
            code = stack.pop()
            key = (code.co_filename, code.co_name, code.co_firstlineno)
            if "get_rng_state" in code.co_names:
                saves.add(key)
            if "set_rng_state" in code.co_names:
                restores.add(key)
            stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return frozenset(saves), frozenset(restores)


def restorer_keys() -> frozenset[Key] | None:
    """The codes in preserve_global_state that set the generator states back;
    None where it has none (another contract)."""
    import importlib
    saver = vars(importlib.import_module(CONVERT_FRAME)).get("preserve_global_state")
    if not isinstance(saver, types.FunctionType):
        return None
    found, stack = set(), [saver.__code__]
    while stack:
        code = stack.pop()
        if {"get_rng_state", "set_rng_state"} <= set(code.co_names):
            found.add((code.co_filename, code.co_name, code.co_firstlineno))
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return frozenset(found) or None


def needed(_facts: Any) -> tuple[Outcome, str] | None:
    if restorer_keys() is None:
        return (Outcome.NOT_COVERED,
                f"{SAVER} no longer sets the generator states back as fxguard knows; "
                "a compile there may rewind other threads' random numbers (stock)")
    return None


class Restores:
    """One generator's saves and restores made by the compiles of each thread:
    whether other threads ran when a save was made (a thread that drew and
    ended before the restore still counts)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._saves, self._restores = _sites()

    @staticmethod
    def _caller() -> Key:
        code = sys._getframe(3).f_code  # 0 this, 1 saving/skip, 2 the swapped body, 3 its caller
        return code.co_filename, code.co_name, code.co_firstlineno

    def saving(self) -> None:
        """In get_rng_state: note whether other threads run as a compile saves."""
        if self._caller() in self._saves:
            stack = self._local.__dict__.setdefault("others", [])
            del stack[:-8]  # a save whose restore never came (an exception, no restore call)
            stack.append(threading.active_count() > 1)

    def skip(self) -> bool:
        """In set_rng_state: whether to skip this call (a compile's restore while
        other threads ran at a save of this thread's or run now)."""
        if self._caller() not in self._restores:
            return False
        stack = self._local.__dict__.get("others")
        others_at_save = stack.pop() if stack else True
        return others_at_save or threading.active_count() > 1


_generators: dict[str, Restores] = {}


def helpers(generator: str) -> tuple[tuple[str, Callable[[], Any]], ...]:
    """The swapped get/set bodies' helpers for one generator ("cpu", "cuda")."""
    def restores() -> Restores:
        return _generators.setdefault(generator, Restores())
    return (("saving", lambda: restores().saving), ("skip", lambda: restores().skip))
