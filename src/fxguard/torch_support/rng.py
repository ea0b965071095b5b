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


def _codes(fn: object) -> list[types.CodeType]:
    """fn's code and every code nested in it (a contextmanager: its generator's)."""
    fn = getattr(fn, "__wrapped__", fn)
    if not isinstance(fn, types.FunctionType):
        return []
    found, stack = [], [fn.__code__]
    while stack:
        code = stack.pop()
        found.append(code)
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


def _key(code: types.CodeType) -> Key:
    return code.co_filename, code.co_name, code.co_firstlineno


def _resolve(path: str) -> object:
    import importlib
    module, _, name = path.rpartition(".")
    return vars(importlib.import_module(module)).get(name)


def _sites() -> tuple[frozenset[Key], frozenset[Key]]:
    """(codes that save the generator states, codes that set them back) in SITES."""
    codes = [code for path in SITES for code in _codes(_resolve(path))]
    return (frozenset(_key(c) for c in codes if "get_rng_state" in c.co_names),
            frozenset(_key(c) for c in codes if "set_rng_state" in c.co_names))


def restorer_keys() -> frozenset[Key] | None:
    """The codes in preserve_global_state that save and set back the generator
    states; None where it has none (another contract)."""
    return frozenset(_key(c) for c in _codes(_resolve(SAVER))
                     if {"get_rng_state", "set_rng_state"} <= set(c.co_names)) or None


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
        return _key(sys._getframe(3).f_code)  # 0 this, 1 saving/skip, 2 the swapped body

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
