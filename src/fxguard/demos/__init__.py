"""The races doctor shows on the installed torch, one protocol for all.

A ``Demo`` runs one forced interleaving (``run``) and reports whether the bad
outcome happened; doctor runs every demo that applies to this torch once on
stock torch and once with fxguard installed.  ``setup`` runs first, on stock
torch (a compiled function made before install(), as users' code makes it);
what it returns is passed to both runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..torch_support.facts import TorchFacts
from . import config_limit, duplicate_compile, races, rng_rewind
from .races import RaceResult


@dataclass(frozen=True)
class Demo:
    race: Callable[..., RaceResult]              # race(what setup made), or race()
    setup: Callable[[], Any] | None = None
    applies: Callable[[TorchFacts], bool] = lambda facts: True

    def run(self, state: Any) -> RaceResult:
        return self.race(state) if self.setup else self.race()

    @property
    def doc(self) -> str:
        return (self.race.__doc__ or "").strip().splitlines()[0]


def config_follows_thread() -> RaceResult:
    """Main sets recompile_limit 20; a thread compiles 20 shapes (config_limit)."""
    result = config_limit.recompile_limit_in_thread()
    return RaceResult("config-follows-thread", result["lost"], result["detail"])


DEMOS = (
    Demo(races.trace_vs_compiled_call, setup=races.make_compiled),
    Demo(races.trace_vs_compilation_env),
    Demo(races.compile_vs_is_compiling),
    # Only where torch keeps config per thread: elsewhere there is nothing to follow.
    Demo(config_follows_thread, applies=lambda facts: facts.config_per_thread),
    Demo(duplicate_compile.duplicate_compile,  # the row stands down without the GIL
         applies=lambda facts: facts.gil_enabled and duplicate_compile.available()),
    Demo(rng_rewind.rng_rewound),
)
