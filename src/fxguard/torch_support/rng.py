"""A compile leaves the random numbers other threads drew.

Dynamo's ``preserve_global_state`` saves the CPU and CUDA generator states
when a compile starts and sets them back when it ends.  A thread that drew
random numbers meanwhile (a warm drafter stepping while another compiles)
draws the same numbers again afterwards: repeated dropout masks, noise and
sampled positions.

With the row, ``torch.random.set_rng_state`` and ``torch.cuda.set_rng_state``
(their code swapped, identity kept) skip the calls those restores make (also
``preserve_rng_state`` inside AOT autograd and inductor, and dynamo's
``checkpoint_params``) where another thread may have drawn meanwhile: another
Python thread ran (used CPU time), started or ended between the save and the
restore.  Threads that sit idle (a DataLoader's or logger's thread waiting,
inductor's own compile pool and tqdm monitor between jobs) do not count, so a
program with one working thread restores exactly as stock, and a seed
reproduces a run.  Where a thread did run, what the compile itself drew stays
drawn (never another thread's draws repeated).  Where threads' CPU times cannot
be read (no ``/proc``), any other live thread counts.  Every other caller of
these functions, the user's own included, is served as stock.
"""
from __future__ import annotations

import sys
import threading
import types
from typing import Any, Callable

from ..machinery.changes import Outcome
from ..machinery.wrapped import Swap, Wrapped
from .options import Option
from .shared_bodies import DYNAMO

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


def others_activity() -> dict[int, int] | None:
    """CPU time (ns) of every other Python thread, by native id: unchanged
    between two readings only where none of them ran, started or ended.  None
    where it cannot be read."""
    me = threading.get_native_id()
    times = {}
    for thread in threading.enumerate():
        native = thread.native_id
        if native is None or native == me:
            continue
        try:
            with open(f"/proc/self/task/{native}/schedstat", "rb") as f:
                times[native] = int(f.read().split()[0])
        except FileNotFoundError:
            times[native] = -1  # it ended
        except (OSError, ValueError, IndexError):
            return None
    return times


def _others_ran(at_save: dict[int, int] | None) -> bool:
    now = others_activity()
    if at_save is None or now is None:  # cannot tell: any other thread may have drawn
        return threading.active_count() > 1
    return now != at_save


class Restores:
    """One generator's saves and restores made by the compiles of each thread:
    whether another thread ran between a save and its restore (one that ran
    and ended meanwhile counts too)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._saves, self._restores = _sites()

    @staticmethod
    def _caller() -> Key | None:
        try:
            return _key(sys._getframe(3).f_code)  # 0 this, 1 saving/skip, 2 the swapped body
        except ValueError:  # no Python caller (a thread's target, atexit): not a site
            return None

    def saving(self) -> None:
        """In get_rng_state: what the other threads had run when a compile saves."""
        if self._caller() in self._saves:
            stack = self._local.__dict__.setdefault("saves", [])
            del stack[:-8]  # a save whose restore never came (an exception, no restore call)
            stack.append(others_activity())

    def skip(self) -> bool:
        """In set_rng_state: whether to skip this call (a compile's restore where
        another thread ran since this thread's save)."""
        if self._caller() not in self._restores:
            return False
        stack = self._local.__dict__.get("saves")
        return _others_ran(stack.pop() if stack else None)


_generators: dict[str, Restores] = {}


def helpers(generator: str) -> tuple[tuple[str, Callable[[], Any]], ...]:
    """The swapped get/set bodies' helpers for one generator ("cpu", "cuda")."""
    def restores() -> Restores:
        return _generators.setdefault(generator, Restores())
    return (("saving", lambda: restores().saving), ("skip", lambda: restores().skip))


# A compile's get_rng_state notes what the other threads had run; its
# set_rng_state is skipped where another thread ran since.
SAVE_RNG = """\
    if not {ns}.is_dynamo_compiling():
        {ns}.saving()
    return {ns}.inner({call})
"""
RESTORE_RNG = """\
    if not {ns}.is_dynamo_compiling() and {ns}.skip():
        return None
    return {ns}.inner({call})
"""

ROWS = (
    Wrapped("compile keeps others' random numbers",
            tuple(Swap(f"{module}.{verb}_rng_state", body, (DYNAMO,) + helpers(generator))
                  for module, generator in (("torch.random", "cpu"), ("torch.cuda.random", "cuda"))
                  for verb, body in (("set", RESTORE_RNG), ("get", SAVE_RNG))),
            needed, option=Option.RNG_NOT_REWOUND),
)
