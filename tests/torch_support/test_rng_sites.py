"""The RNG row's contract with the installed torch (rng_sites.py).

- Every call in torch's compiler source that draws random numbers (or runs a
  generated benchmark harness that does) is classified: covered by a draw
  site the row wraps, or why it is not a compile-time draw.  A new torch's new
  call fails here until someone classifies it.
- Every listed draw site is on this torch as listed; where one is missing or
  changed, the row stands down (NOT_COVERED, a WARNING).
- A compile in one thread (inductor with max-autotune's example inputs,
  training with dropout, aot_eager) leaves the default generator where it
  was: no uncovered draw happened.  A failure names the calls that moved it.
"""
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fxguard
from fxguard.torch_support import rng_sites, rows  # noqa: F401 - rows made before any patching
from guarded import child_env


@pytest.mark.slow
def test_every_draw_call_in_torchs_compiler_is_classified():
    calls = rng_sites.draw_calls(os.path.dirname(torch.__file__))
    assert calls, "the scan found no draw call at all: it is broken"
    unknown = [f"{path}:{line} {qualname} calls {name}" for path, qualname, line, name in calls
               if rng_sites.classify(path, qualname) is None]
    assert not unknown, (
        f"torch {torch.__version__} draws random numbers where nobody classified it; add each "
        "to rng_sites.CLASSIFIED (and to DRAW_SITES if a compile runs it):\n  "
        + "\n  ".join(unknown))


def test_every_listed_draw_site_is_on_this_torch():
    assert rng_sites.broken_draw_sites() == []


def test_a_missing_draw_site_stands_the_row_down(monkeypatch, caplog):
    gone = rng_sites.DrawSite("torch._inductor.select_algorithm.AlgorithmSelectorCache.gone",
                              ("randn",))
    monkeypatch.setattr(rng_sites, "DRAW_SITES", rng_sites.DRAW_SITES + (gone,))
    before = torch.random.set_rng_state.__code__
    with caplog.at_level(logging.WARNING, logger="fxguard"):
        info = fxguard.install()
    __import__("torch._dynamo")  # the row applies with dynamo
    rows = {r["what"]: r for r in fxguard.status()["patch_points"]}
    row = rows["compile keeps others' random numbers"]
    assert row["outcome"] == "not covered", row
    assert any("AlgorithmSelectorCache.gone missing" in m for m in caplog.messages), caplog.messages
    assert torch.random.set_rng_state.__code__ is before
    assert info is not None


def test_a_changed_draw_site_stands_the_row_down(monkeypatch):
    changed = rng_sites.DrawSite("torch._inductor.fx_passes.pad_mm._should_pad",
                                 ("randn", "some_new_drawer"))
    monkeypatch.setattr(rng_sites, "DRAW_SITES", (changed,) + rng_sites.DRAW_SITES[1:])
    assert rng_sites.broken_draw_sites() == [
        "torch._inductor.fx_passes.pad_mm._should_pad no longer uses some_new_drawer"]


# A child interpreter with fresh caches (cold: autotuning draws): each compile
# is seeded, and every torch draw call inside a compile's windows that moved
# the default generator is recorded (sys.setprofile sees builtins called),
# with its Python caller.
CHILD = textwrap.dedent("""
    import json, sys, torch, torch.nn as nn
    import fxguard
    fxguard.install()
    DRAWS = {"rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial",
             "poisson", "rand_like", "randn_like", "randint_like", "normal_", "uniform_",
             "random_", "bernoulli_", "exponential_", "cauchy_", "log_normal_", "geometric_"}
    moved_by = []
    before = {}

    from fxguard.torch_support import rng

    def in_a_window():
        windows = rng._windows.get("cpu")
        return windows is not None and bool(windows._thread().stack)

    def profile(frame, event, arg):
        name = getattr(arg, "__name__", None)
        if name not in DRAWS or event not in ("c_call", "c_return") or not in_a_window():
            return
        if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
            return  # fake tensors draw nothing
        with torch.utils._python_dispatch._disable_current_modes():
            state = torch.random.default_generator.get_state().tolist()
        if event == "c_call":
            before[id(frame)] = state
        elif before.pop(id(frame), state) != state:
            code = frame.f_code
            moved_by.append(f"{code.co_filename}:{frame.f_lineno} {code.co_qualname} -> {name}")

    def compiles():
        import torch._inductor.config as inductor_config
        model = nn.Linear(16, 16)
        with inductor_config.patch(freezing=True, max_autotune_gemm_backends="CPP,ATEN"), \\
                torch.no_grad():
            yield "max-autotune", lambda: torch.compile(
                model, mode="max-autotune-no-cudagraphs")(torch.ones(8, 16))
        block = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.ReLU())
        yield "inductor training", lambda: torch.compile(block)(torch.ones(4, 8)).sum().backward()
        yield "aot_eager", lambda: torch.compile(block, backend="aot_eager")(torch.ones(3, 8))

    found = {}
    for what, run in compiles():
        torch._dynamo.reset()
        torch.manual_seed(0)
        moved_by.clear()
        sys.setprofile(profile)
        try:
            run()  # compiles, then runs: only draws inside the compile's windows count
        finally:
            sys.setprofile(None)
        found[what] = moved_by[:]
    print(json.dumps(found))
""")


@pytest.mark.slow
def test_a_compile_in_one_thread_leaves_the_default_generator(tmp_path):
    env = child_env(FXGUARD_CACHE_DIR=str(tmp_path / "fxguard"),
                    TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(found) == {"max-autotune", "inductor training", "aot_eager"}
    moved = {what: calls for what, calls in found.items() if calls}
    assert not moved, "draws during a compile moved the default generator (sites no row " \
        "covers):\n" + json.dumps(moved, indent=1)
