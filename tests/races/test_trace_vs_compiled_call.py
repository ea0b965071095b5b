"""Race (a): a compiled call on one thread while another thread is inside symbolic_trace."""
from guarded import both_ways

from fxguard.demos import races


@both_ways()
def test_compiled_call_is_unaffected_by_other_threads_trace(guard):
    result = races.trace_vs_compiled_call()
    assert not result.raced, result.detail


@both_ways()
def test_compiled_function_created_before_install(guard):
    # races.make_compiled() ran before install() would have: compile_wrapper's
    # closure captured the stock is_fx_symbolic_tracing function object.
    import fxguard
    fxguard.uninstall()
    compiled = races.make_compiled()
    if guard == "on":
        fxguard.install()
    result = races.trace_vs_compiled_call(compiled)
    assert not result.raced, result.detail
