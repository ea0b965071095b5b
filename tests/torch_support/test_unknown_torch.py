"""A torch fxguard has not seen: a row whose contract differs stands down with
a WARNING that names what differed, and that part of torch runs as stock;
concurrent_compiles is refused outside the torch it was stress-tested on.

A new release is simulated by changing the real torch function the row
relies on (monkeypatch puts it back).
"""
import logging

import pytest
import torch
from torch._dynamo import convert_frame

import fxguard
from fxguard.machinery import originals
from fxguard.torch_support import facts
from guarded import fresh_function, needs_the_gil_for_compile_once


def _row(info, what):
    return next(r for r in info["patch_points"] if r["what"] == what)


@needs_the_gil_for_compile_once
def test_a_callback_with_another_signature_stands_down(monkeypatch, caplog):
    stock = convert_frame.CatchErrorsWrapper.__call__

    def __call__(self, frame, cache_entry, frame_state, *, hooks=None):  # "a new release"
        return stock(self, frame, cache_entry, frame_state)

    monkeypatch.setattr(convert_frame.CatchErrorsWrapper, "__call__", __call__)
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="fxguard"):
        info = fxguard.install()
    row = _row(info, "compile once")
    assert row["outcome"] == "not covered"
    assert any("compile once" in m and "hooks" in m for m in caplog.messages)
    assert convert_frame.CatchErrorsWrapper.__call__ is __call__  # not wrapped, not half-swapped
    f = fresh_function("def f(x):\n    return x.sin() * 2\n")
    x = torch.randn(4)
    assert torch.allclose(torch.compile(f, backend="eager")(x), f(x))
    fxguard.uninstall()
    torch._dynamo.reset()


def test_a_compile_that_restores_otherwise_leaves_the_rng_row_down(monkeypatch, caplog):
    def preserve_global_state(fn):  # "a new release" that keeps the RNG elsewhere
        return fn

    monkeypatch.setattr(convert_frame, "preserve_global_state", preserve_global_state)
    before = torch.random.set_rng_state.__code__
    with caplog.at_level(logging.WARNING, logger="fxguard"):
        info = fxguard.install()
    row = _row(info, "compile keeps others' random numbers")
    assert row["outcome"] == "not covered"
    assert any("set_rng_state" in m and "preserve_global_state" in m for m in caplog.messages)
    assert torch.random.set_rng_state.__code__ is before


def test_concurrent_compiles_refused_on_an_untested_torch(monkeypatch):
    monkeypatch.delenv(facts.ALLOW_UNTESTED, raising=False)
    monkeypatch.setattr(facts, "CONCURRENT_COMPILES_STRESSED", ("0.0.0",))
    with pytest.raises(fxguard.UnsupportedTorchError, match=facts.ALLOW_UNTESTED):
        fxguard.install(concurrent_compiles=True)
    assert originals.applied() == () and not fxguard.is_installed()
    assert fxguard.install()["options"]["concurrent_compiles"] is False  # the default still installs
    fxguard.uninstall()
    monkeypatch.setenv(facts.ALLOW_UNTESTED, "concurrent_compiles")
    assert fxguard.install(concurrent_compiles=True)["concurrent_compiles"]["enabled"]


def _with_a_new_writer(monkeypatch, name):
    """torch's source as a release with one more writer of ``name`` would have it."""
    from fxguard.machinery import writers
    real = writers.attribute_writes

    def attribute_writes(root, marker, names):
        found = dict(real(root, marker, names))
        found[name] = found.get(name, ()) + (("_new_release.py", 7, (("def", "new_writer"),)),)
        return found

    monkeypatch.setattr(writers, "attribute_writes", attribute_writes)


def test_a_new_writer_of_a_per_thread_global_stands_its_row_down(monkeypatch, caplog):
    _with_a_new_writer(monkeypatch, "_is_compiling_flag")
    with caplog.at_level(logging.WARNING, logger="fxguard"):
        info = fxguard.install()
    row = next(r for r in info["patch_points"] if r["where"] == "torch.compiler._is_compiling_flag")
    assert row["outcome"] == "not covered"
    assert any("_is_compiling_flag" in m and "new_writer" in m for m in caplog.messages)
    assert "_is_compiling_flag" in vars(torch.compiler)  # stays the module global, as stock
    assert torch.compiler.is_compiling() is False


def test_a_new_writer_of_the_fx_flag_refuses_install(monkeypatch):
    from fxguard.torch_support.facts import MODULE_GLOBAL, detect
    if detect().layout != MODULE_GLOBAL:
        pytest.skip("torch keeps the FX flag per thread")
    _with_a_new_writer(monkeypatch, "_is_fx_tracing_flag")
    with pytest.raises(fxguard.UnsupportedTorchError, match="new_writer"):
        fxguard.install()
    assert originals.applied() == () and not fxguard.is_installed()


def test_a_user_of_a_per_thread_global_whose_source_differs_stands_its_row_down(
        monkeypatch, caplog):
    """A release whose module has a function using the global that fxguard cannot
    match to its source file: that global's row stands down, the others apply."""
    import torch.fx.traceback as fx_traceback
    namespace = {}
    exec(compile("\n" * 3 + "def new_reader():\n    return should_preserve_node_meta\n",
                 fx_traceback.__file__, "exec"), vars(fx_traceback), namespace)
    monkeypatch.setitem(vars(fx_traceback), "new_reader", namespace["new_reader"])
    with caplog.at_level(logging.WARNING, logger="fxguard"):
        info = fxguard.install()
    rows = {r["where"]: r["outcome"] for r in info["patch_points"]}
    assert rows["torch.fx.traceback.should_preserve_node_meta"] == "not covered"
    assert rows["torch.compiler._is_compiling_flag"] == "patched"
    assert any("should_preserve_node_meta" in m and "new_reader" in m for m in caplog.messages)
    assert "should_preserve_node_meta" in vars(fx_traceback)  # stays the module global
    stock = vars(fx_traceback)["should_preserve_node_meta"]  # whatever earlier tests left
    assert fx_traceback.new_reader() is stock and fx_traceback.has_preserved_node_meta() is stock


@pytest.mark.skipif(facts.config_is_per_thread(), reason="the row is not needed where config is per thread")
def test_a_changed_torch_compile_options_window_stands_down(monkeypatch, caplog):
    from torch._inductor import compile_fx
    stock = compile_fx.get_patched_config_dict
    changed = fresh_function(  # "a new release" that reads its options otherwise
        "def get_patched_config_dict(config_patches=None):\n"
        "    return {**stock(), **(config_patches or {})}\n",
        "get_patched_config_dict", {"stock": stock})
    monkeypatch.setattr(compile_fx, "get_patched_config_dict", changed)
    before = changed.__code__
    with caplog.at_level(logging.WARNING, logger="fxguard"):
        info = fxguard.install()
    row = _row(info, "torch.compile options per thread")
    assert row["outcome"] == "not covered"
    assert any("get_patched_config_dict" in m for m in caplog.messages)
    assert changed.__code__ is before  # runs as stock, not half-swapped
    fxguard.uninstall()


@pytest.mark.skipif(facts.config_is_per_thread(), reason="config per thread: no entries to keep per compile")
def test_config_of_plain_values_leaves_concurrent_compiles_down(monkeypatch, caplog):
    """torch 2.5 keeps config as plain values, not entries fxguard can keep per
    compile: the compile lock stands down (compiles one at a time, as stock)."""
    from torch._inductor import config
    name = next(iter(config._config))
    monkeypatch.setitem(config._config, name, False)  # "an older release": a plain value
    monkeypatch.setenv(facts.ALLOW_UNTESTED, "concurrent_compiles")
    lock, classes = convert_frame.compile_lock, {n: type(e) for n, e in config._config.items()}
    with caplog.at_level(logging.WARNING, logger="fxguard"):
        info = fxguard.install(concurrent_compiles=True)
    row = _row(info, "compile lock")
    assert row["outcome"] == "not covered"
    assert any("compile lock" in m and "plain values" in m for m in caplog.messages)
    assert convert_frame.compile_lock is lock  # torch's own lock: compiles one at a time
    assert {n: type(e) for n, e in config._config.items()} == classes  # no entry overlaid
    fxguard.uninstall()


@pytest.mark.skipif(facts.config_is_per_thread(), reason="config per thread: the window row is not needed")
def test_a_windowed_config_of_plain_values_stands_down(monkeypatch, caplog):
    """The eager flex config window keeps two dynamo entries per thread; where
    they are plain values the row stands down with a WARNING, nothing overlaid."""
    from torch._dynamo import config
    entry = type(config._config["capture_scalar_outputs"])
    if _row(fxguard.install(), "config window per thread")["outcome"] != "patched":
        pytest.skip("no config window row on this torch")
    assert type(config._config["capture_scalar_outputs"]) is not entry  # the check can fail
    fxguard.uninstall()
    monkeypatch.setitem(config._config, "allow_empty_graphs", False)  # "an older release"
    with caplog.at_level(logging.WARNING, logger="fxguard"):
        info = fxguard.install()
    row = _row(info, "config window per thread")
    assert row["outcome"] == "not covered"
    assert any("config window per thread" in m and "plain values" in m for m in caplog.messages)
    assert type(config._config["capture_scalar_outputs"]) is entry  # not overlaid, nothing half-done
    fxguard.uninstall()


def test_an_export_that_no_longer_swaps_math_stands_its_row_down(monkeypatch, caplog, tmp_path):
    """A release whose non-strict export swaps only builtins (no math.pow): that
    row stands down with a WARNING, the function keeps its code, the rest applies."""
    import torch._export.non_strict_utils as nsu
    if not hasattr(nsu, "_override_builtin_ops"):
        pytest.skip("this torch has no _override_builtin_ops")
    source = tmp_path / "non_strict_utils.py"
    source.write_text("import builtins\nimport contextlib\n\n\n@contextlib.contextmanager\n"
                      "def _override_builtin_ops():\n    original_max = builtins.max\n"
                      "    try:\n        yield\n    finally:\n        builtins.max = original_max\n")
    namespace = {"__name__": nsu.__name__}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    monkeypatch.setattr(nsu, "__file__", str(source))  # its functions are the new release's
    monkeypatch.setitem(vars(nsu), "_override_builtin_ops", namespace["_override_builtin_ops"])
    code = namespace["_override_builtin_ops"].__wrapped__.__code__
    with caplog.at_level(logging.WARNING, logger="fxguard"):
        info = fxguard.install()
    rows = {r["where"]: r["outcome"] for r in info["patch_points"]}
    assert rows["torch._export.non_strict_utils._override_builtin_ops"] == "not covered"
    assert rows["torch.fx._symbolic_trace._PatchedFnSetItem"] == "patched"
    assert any("_override_builtin_ops" in m and "math" in m for m in caplog.messages)
    assert namespace["_override_builtin_ops"].__wrapped__.__code__ is code  # not half-swapped
    with nsu._override_builtin_ops():
        pass
    fxguard.uninstall()
