"""References taken before install() answer per-thread afterwards: identity is kept."""
import threading

import torch
import torch.fx._symbolic_trace as symbolic_trace
from torch.fx._symbolic_trace import is_fx_tracing as alias_tracing  # imported before install

import fxguard

# torch <= 2.8 has no is_fx_symbolic_tracing (compile_wrapper calls is_fx_tracing there).
alias_symbolic = getattr(symbolic_trace, "is_fx_symbolic_tracing", None)
CHECKER = alias_symbolic or alias_tracing  # what compile_wrapper captures


def _other_thread_sees(fn):
    seen = []
    t = threading.Thread(target=lambda: seen.append(fn()))
    t.start()
    t.join()
    return seen[0]


def test_aliases_imported_before_install_are_the_patched_objects():
    fxguard.install()
    assert alias_tracing is torch.fx._symbolic_trace.is_fx_tracing
    with fxguard.fx_tracing(True):
        assert alias_tracing() is True
        assert CHECKER() is True
        assert _other_thread_sees(alias_tracing) is False
        assert _other_thread_sees(CHECKER) is False
    assert alias_tracing() is False


def test_dynamo_tables_still_key_on_the_same_function_objects():
    from torch._dynamo.variables.torch import tracing_state_functions

    def table_now():  # a function on 2.8+, the dict itself before
        return dict(tracing_state_functions() if callable(tracing_state_functions)
                    else tracing_state_functions)

    before = table_now()
    fxguard.install()
    table = table_now()
    assert torch.fx._symbolic_trace.is_fx_tracing in table
    assert CHECKER in table
    assert table == before


def test_compile_wrapper_closure_holds_the_patched_function():
    compiled = torch.compile(lambda x: x + 1, backend="eager")
    closure = {c.cell_contents for c in compiled.__closure__ or () if callable(c.cell_contents)}
    fxguard.install()
    assert CHECKER in closure
