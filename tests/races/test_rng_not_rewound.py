"""A compile must not rewind the random numbers other threads drew meanwhile.

Dynamo saves the generator states when a compile starts and sets them back
when it ends (preserve_global_state): a thread that drew while another thread
compiled draws the same numbers again.  Deterministic: the compile is held in
its backend while the other thread draws; stock repeats every draw (every
torch 2.5-2.15 restores), fxguard none.  Single-threaded, the stream after a
compile stays exactly stock's (in a child process: no other thread there).
"""
import subprocess
import sys
import textwrap

import pytest
import torch

import fxguard
from fxguard.demos.rng_rewind import draws_during_a_compile
from guarded import child_env


@pytest.mark.parametrize("guard", [
    pytest.param("off", marks=pytest.mark.xfail(strict=True, reason="stock rewinds the draws")),
    "on"])
def test_draws_during_another_threads_compile_are_not_repeated(guard):
    if guard == "on":
        assert next(r for r in fxguard.install()["patch_points"]
                    if r["what"] == "compile keeps others' random numbers")["patched"]
    during, after = draws_during_a_compile()
    repeated = [d for d in after if d in during]
    assert repeated == [], f"{len(repeated)} of {len(after)} draws repeated"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("guard", [
    pytest.param("off", marks=pytest.mark.xfail(strict=True, reason="stock rewinds the draws")),
    "on"])
def test_cuda_draws_during_another_threads_compile_are_not_repeated(guard):
    if guard == "on":
        fxguard.install()
    during, after = draws_during_a_compile("cuda")
    repeated = [d for d in after if d in during]
    assert repeated == [], f"{len(repeated)} of {len(after)} CUDA draws repeated"


def test_option_off_keeps_stock_restore():
    fxguard.install(rng_not_rewound=False)
    during, after = draws_during_a_compile()
    assert after == during  # stock: rewound, every draw repeated


CHILD = textwrap.dedent("""
    import sys, torch
    if sys.argv[1] == "fxguard":
        import fxguard
        fxguard.install()
    def backend(gm, example_inputs):
        torch.rand(8)  # a compile that draws (as autotuning does)
        return gm.forward
    torch.manual_seed(0)
    torch.rand(2)
    torch.compile(lambda x: x * 3, backend=backend)(torch.ones(2))
    print(torch.rand(4).tolist())
""")


def test_single_threaded_stream_is_stock():
    def run(way):
        done = subprocess.run([sys.executable, "-c", CHILD, way], capture_output=True, text=True,
                              env=child_env(), timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]
    assert run("fxguard") == run("stock")
