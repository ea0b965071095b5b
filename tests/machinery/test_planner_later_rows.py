"""per_thread_globals.Planner going on after its changes were applied (rows whose
module came later, install on import), torch-free."""
import types

import pytest
from guarded import apply

from fxguard.machinery import codegen
from fxguard.machinery.changes import NotCovered, Outcome
from fxguard.machinery.per_thread_globals import PerThread, Planner

SOURCE = """
a = 1
b = 2

def f():
    return a + b
"""


def test_a_later_row_lists_only_what_is_new_and_keeps_the_slots_going(source_module):
    mod = source_module(SOURCE)
    planner = Planner()
    assert planner.add(PerThread(mod.__name__, "a", 1)) is Outcome.PATCHED
    first = planner.changes("per-thread")
    assert planner.defaults() == ((1,), (None,))
    planner.emitted()
    apply(first)
    assert planner.add(PerThread(mod.__name__, "b", 2)) is Outcome.PATCHED
    later = planner.changes("per-thread")
    assert planner.defaults() == ((2,), (None,))    # the new slot only, after a's
    assert planner.initial() == [(mod, "b", 2)]
    attrs = [(c.owner, c.attr) for c in later]
    assert (mod.f, "__code__") in attrs             # f gained a name: its code again
    assert (mod, "a") not in attrs and (mod, "b") in attrs  # a's deletion is not listed again


def test_a_later_row_stands_down_on_a_function_another_row_changed_since(source_module):
    mod = source_module(SOURCE)
    planner = Planner()
    planner.add(PerThread(mod.__name__, "a", 1))
    made = planner.changes("per-thread")
    planner.emitted()
    apply(made)
    # a wrapped row (applied when its own module came) swaps f's code
    inner = codegen.shadow_function(mod.f, mod.f.__code__)
    apply(codegen.swap_code("wrapped", mod.f, "    return {ns}.inner({call})\n",
                            types.SimpleNamespace(inner=inner)))
    with pytest.raises(NotCovered):  # either check: its users, or its code changed since
        planner.add(PerThread(mod.__name__, "b", 2))
    assert planner.changes("per-thread") == []      # the planner is as it was
