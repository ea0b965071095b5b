"""install()/uninstall(): exact undo, idempotence, and no change on a torch it does not know."""
import logging

import pytest
import torch

import fxguard
from fxguard.machinery import originals


TOUCHED = ("torch.fx._symbolic_trace", "torch.compiler", "torch.fx.traceback",
           "torch.fx.experimental.proxy_tensor", "torch.fx._lazy_graph_module", "torch._export.utils",
           "torch._higher_order_ops.utils", "torch._higher_order_ops.flex_attention",
           "torch.nn.attention.flex_attention", "torch.autograd.function", "torch.autograd.graph", "torch.nn.modules.module",
           "torch._ops", "torch.export._trace", "math")


def snapshot():
    """Every object and attribute install() may touch, by identity."""
    import importlib

    import torch._functorch.config as fconfig

    from fxguard.machinery.per_thread_globals import functions_in
    modules = [importlib.import_module(m) for m in TOUCHED]
    return {
        "functions": [(f, f.__code__) for m in modules for f in functions_in(m)],
        "module_class": [type(m) for m in modules],
        "module_dicts": [{k: id(v) for k, v in vars(m).items()} for m in modules],
        "class_attrs": (torch.fx._symbolic_trace.Tracer.__dict__["trace"],
                        torch.autograd.function.BackwardCFunction.__dict__["apply"],
                        torch.autograd.function.BackwardCFunction.__dict__["apply"].__code__,
                        torch.fx._symbolic_trace.Tracer.__dict__["_qualname_counter"]),
        "entry_classes": [(e, type(e)) for m in (importlib.import_module("torch._dynamo.config"),)
                          for e in m._config.values()],
        "module_class_dict": {k: id(v) for k, v in vars(torch.nn.Module).items()},
        "config": {k: (getattr(fconfig, k), e.default) for k, e in fconfig._config.items()
                   if k == "force_non_lazy_backward_lowering"},  # absent before torch 2.10
    }


def test_uninstall_restores_identities_and_code():
    before = snapshot()
    if fxguard.install()["mode"] == "patched":
        assert "_is_fx_tracing_flag" not in vars(torch.fx._symbolic_trace)
    torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2)))  # patches, per thread
    fxguard.uninstall()
    after = snapshot()
    assert after == before
    for (fn, code), (fn2, code2) in zip(before["functions"], after["functions"]):
        assert fn is fn2 and code is code2
    assert not fxguard.is_installed() and fxguard.status()["mode"] == "not-installed"


def test_install_twice_and_uninstall_twice():
    first = fxguard.install()
    applied = originals.applied()
    assert fxguard.install() == first
    assert originals.applied() == applied  # nothing applied twice
    fxguard.uninstall()
    fxguard.uninstall()
    assert originals.applied() == ()


def test_uninstall_without_install_changes_nothing():
    before = snapshot()
    fxguard.uninstall()
    assert snapshot() == before


def test_install_with_other_options_reinstalls():
    fxguard.install()
    s = fxguard.install(block_mask_lock=False)
    rows = {r["what"]: r for r in s["patch_points"]}
    assert rows["block-mask lock"]["outcome"] == "option off"
    assert rows["FX-tracing flag"]["patched"] is (s["mode"] == "patched")


def test_a_refused_reconfiguration_keeps_the_earlier_install(monkeypatch):
    """install() with other options that this torch refuses raises and leaves
    the earlier install as it was (it had uninstalled it first)."""
    from fxguard.torch_support import facts
    before = fxguard.install(block_mask_lock=False)
    monkeypatch.setattr(facts, "concurrent_compiles_refusal", lambda found: "refused here")
    with pytest.raises(Exception, match="refused here"):
        fxguard.install(concurrent_compiles=True)
    assert fxguard.is_installed()
    assert fxguard.status() == before


def test_unknown_option_is_rejected_before_anything_changes():
    before = snapshot()
    with pytest.raises(TypeError, match="unexpected keyword argument .turbo."):
        fxguard.install(turbo=True)
    assert snapshot() == before


@pytest.mark.parametrize("value", [1, 0, 0.0, "yes", None, [], "numpy.bool_"])
def test_non_bool_option_is_a_type_error_before_anything_changes(value):
    if value == "numpy.bool_":
        import numpy
        value = numpy.bool_(True)
    before = snapshot()
    with pytest.raises(TypeError, match="block_mask_lock must be True or False"):
        fxguard.install(block_mask_lock=value)
    assert snapshot() == before and not fxguard.is_installed()


def test_preview_changes_nothing_and_says_what_install_does():
    before = snapshot()
    preview = fxguard.preview(eager_backward=False)
    assert snapshot() == before and not fxguard.is_installed() and originals.applied() == ()
    assert preview["preview"] is True
    installed = fxguard.install(eager_backward=False)
    keys = ("mode", "layout", "options", "patch_points", "autograd_workers")
    assert {k: preview[k] for k in keys} == {k: installed[k] for k in keys}
    assert fxguard.preview(eager_backward=False)["preview"] is False  # installed: its status
    with pytest.raises(TypeError, match="eager_backward must be True or False"):
        fxguard.preview(eager_backward="no")
    with pytest.raises(TypeError, match="unexpected keyword argument 'turbo'"):
        fxguard.preview(turbo=True)


def test_unknown_layout_raises_and_leaves_torch_untouched(monkeypatch):
    # Make the real torch look unfamiliar: the flag is no longer a bool.
    st = torch.fx._symbolic_trace
    monkeypatch.setitem(vars(st), "_is_fx_tracing_flag", 0)
    before = snapshot()
    with pytest.raises(fxguard.UnsupportedTorchError, match="_is_fx_tracing_flag"):
        fxguard.install()
    assert snapshot() == before and originals.applied() == ()


def test_missing_optional_patch_point_is_reported_not_refused(monkeypatch):
    import torch.nn.attention.flex_attention as flex
    monkeypatch.delattr(flex, "create_block_mask")
    s = fxguard.install()
    rows = {r["what"]: r["outcome"] for r in s["patch_points"]}
    assert rows["block-mask lock"] == "not available"
    assert rows["FX-tracing flag"] == ("patched" if s["mode"] == "patched" else
                                       "not needed")  # torch keeps it per thread


def test_unreadable_source_of_the_flag_module_raises_and_changes_nothing(monkeypatch):
    if fxguard.install()["mode"] != "patched":
        pytest.skip("this torch keeps the FX flag per thread itself")
    fxguard.uninstall()
    import linecache
    real = linecache.getlines
    target = torch.fx._symbolic_trace.__file__
    monkeypatch.setattr(linecache, "getlines",
                        lambda name, *a: [] if name == target else real(name, *a))
    before = snapshot()
    with pytest.raises(fxguard.UnsupportedTorchError, match="no source"):
        fxguard.install()
    assert snapshot() == before and originals.applied() == ()


def test_failure_while_applying_rolls_back(monkeypatch):
    before = snapshot()
    real_apply = originals.apply
    calls = []

    def apply_then_fail(*args):
        calls.append(args)
        if len(calls) == 2:  # with one change already applied
            raise RuntimeError("injected failure")
        return real_apply(*args)

    monkeypatch.setattr(originals, "apply", apply_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        fxguard.install()
    assert snapshot() == before and originals.applied() == () and not fxguard.is_installed()


def test_uninstall_refuses_while_a_thread_traces():
    if fxguard.install()["mode"] != "patched":
        pytest.skip("only the patched mode owns the trace state")
    with fxguard.fx_tracing(True):
        with pytest.raises(RuntimeError, match="inside an FX trace"):
            fxguard.uninstall()
        assert fxguard.is_installed()
    fxguard.uninstall()


def test_status_reports_patch_points():
    s = fxguard.install()
    assert s["mode"] in ("patched", "upstream-thread-local")
    assert s["torch"] == torch.__version__
    wheres = [r["where"] for r in s["patch_points"]]
    assert "torch.fx._symbolic_trace._is_fx_tracing_flag" in wheres
    assert "torch.compiler._is_compiling_flag" in wheres
    assert all(r["patched"] == (r["outcome"] == "patched") for r in s["patch_points"])
    assert fxguard.get_original(torch.fx._symbolic_trace.is_fx_tracing, "__code__") is not \
        torch.fx._symbolic_trace.is_fx_tracing.__code__ or s["mode"] != "patched"


def test_a_row_that_cannot_be_covered_is_reported_and_leaves_its_module_alone(monkeypatch, caplog):
    import linecache
    real = linecache.getlines
    target = torch.compiler.__file__
    monkeypatch.setattr(linecache, "getlines",
                        lambda name, *a: [] if name == target else real(name, *a))
    code = torch.compiler.is_compiling.__code__
    with caplog.at_level(logging.WARNING, logger="fxguard"):
        s = fxguard.install()
    rows = {r["where"]: r["outcome"] for r in s["patch_points"]}
    assert rows["torch.compiler._is_compiling_flag"] == "not covered"
    assert any("_is_compiling_flag" in m and "no source" in m for m in caplog.messages)
    assert torch.compiler.is_compiling.__code__ is code
    assert "_is_compiling_flag" in vars(torch.compiler)
    assert "__fxguard_tls__" not in vars(torch.compiler)
    assert rows["torch.fx.traceback.current_meta"] == "patched"
