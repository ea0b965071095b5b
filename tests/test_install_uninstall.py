"""install()/uninstall(): exact undo, idempotence, and no change on a torch it does not know."""
import inspect

import pytest
import torch

import fxguard
from fxguard import patches


def snapshot():
    """Every object and attribute install() may touch, by identity."""
    st = torch.fx._symbolic_trace
    import torch._functorch.config as fconfig
    import torch._higher_order_ops.utils as hop_utils
    import torch.nn.attention.flex_attention as flex
    fns = [st.is_fx_tracing, st.is_fx_symbolic_tracing,
           inspect.unwrap(st.Tracer.trace),
           hop_utils._set_compilation_env.__wrapped__, flex.create_block_mask]
    return {
        "functions": [(f, f.__code__) for f in fns],
        "class_attrs": (st.Tracer.__dict__["trace"], hop_utils._set_compilation_env),
        "module_class": type(st),
        "module_names": {m.__name__: sorted(vars(m)) for m in (st, hop_utils, flex)},
        "flag": vars(st).get("_is_fx_tracing_flag"),
        "config": (fconfig.force_non_lazy_backward_lowering,
                   fconfig._config["force_non_lazy_backward_lowering"].default),
    }


def test_uninstall_restores_identities_and_code():
    before = snapshot()
    if fxguard.install()["mode"] == "patched":
        assert "_is_fx_tracing_flag" not in vars(torch.fx._symbolic_trace)
    fxguard.uninstall()
    after = snapshot()
    assert after == before
    for (fn, code), (fn2, code2) in zip(before["functions"], after["functions"]):
        assert fn is fn2 and code is code2
    assert not fxguard.is_installed() and fxguard.status()["mode"] == "not-installed"


def test_install_twice_and_uninstall_twice():
    first = fxguard.install()
    applied = patches.applied()
    assert fxguard.install() == first
    assert patches.applied() == applied  # nothing applied twice
    fxguard.uninstall()
    fxguard.uninstall()
    assert patches.applied() == ()


def test_uninstall_without_install_changes_nothing():
    before = snapshot()
    fxguard.uninstall()
    assert snapshot() == before


def test_install_with_other_options_reinstalls():
    fxguard.install()
    s = fxguard.install(block_mask_lock=False)
    rows = {r["what"]: r["patched"] for r in s["patch_points"]}
    assert rows["block-mask lock"] is False
    assert rows["flag writer"] is (s["mode"] == "patched")


def test_unknown_option_is_rejected_before_anything_changes():
    before = snapshot()
    with pytest.raises(TypeError, match="unknown options"):
        fxguard.install(turbo=True)
    assert snapshot() == before


def test_unknown_layout_raises_and_leaves_torch_untouched(monkeypatch):
    # Make the real torch look unfamiliar: the flag is no longer a bool.
    st = torch.fx._symbolic_trace
    monkeypatch.setitem(vars(st), "_is_fx_tracing_flag", 0)
    before = snapshot()
    with pytest.raises(fxguard.UnsupportedTorchError, match="_is_fx_tracing_flag"):
        fxguard.install()
    assert snapshot() == before and patches.applied() == ()


def test_missing_later_patch_point_raises_before_earlier_ones_apply(monkeypatch):
    import torch.nn.attention.flex_attention as flex
    monkeypatch.delattr(flex, "create_block_mask")
    before = snapshot_without_flex()
    with pytest.raises(fxguard.UnsupportedTorchError, match="create_block_mask"):
        fxguard.install()
    assert snapshot_without_flex() == before and patches.applied() == ()


def snapshot_without_flex():
    st = torch.fx._symbolic_trace
    return (st.is_fx_tracing.__code__, st.is_fx_symbolic_tracing.__code__, type(st), sorted(vars(st)))


def test_failure_while_applying_rolls_back(monkeypatch):
    before = snapshot()
    real_apply = patches.apply_patch
    calls = []

    def apply_then_fail(*args):
        calls.append(args)
        if len(calls) == 2:  # with one change already applied
            raise RuntimeError("injected failure")
        return real_apply(*args)

    monkeypatch.setattr(patches, "apply_patch", apply_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        fxguard.install()
    assert snapshot() == before and patches.applied() == () and not fxguard.is_installed()


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
    assert "torch.fx._symbolic_trace.Tracer.trace" in wheres
    assert all(r["found"] for r in s["patch_points"] if r["applies"])
    assert fxguard.get_original(torch.fx._symbolic_trace.is_fx_tracing, "__code__") is not \
        torch.fx._symbolic_trace.is_fx_tracing.__code__ or s["mode"] != "patched"
