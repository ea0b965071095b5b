"""One working thread and a busy helper: a seeded compile that autotunes draws
what stock draws and leaves the generators where stock leaves them.

The review's finding 3 (2026-12-07): with max-autotune on the CPU, inductor
draws example inputs at compile time (``generate_example_value`` in its own
window; the int4 weight-only example weight from ``input_gen_fns`` outside
it), and fxguard's old rule skipped the outer restores whenever another
thread ran, so those draws stayed drawn.  Here run_programs.py runs the two
max-autotune programs in fresh interpreters, stock and with fxguard
installed, on a cold and then a warm inductor cache (fresh FXGUARD_CACHE_DIR
and TORCHINDUCTOR_CACHE_DIR per mode), with a thread computing without pause
beside them (FXGUARD_TEST_BUSY_HELPER=1); outputs and next draws must be
stock's.  The int4 program needs an AVX512 CPU (inductor's int4 template);
elsewhere it reports itself unsupported and only the other one runs.
"""
import os

import pytest

from guarded import child_env, child_json, run_raising

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = ("max_autotune_cpu_freezing", "max_autotune_int4_weight_only")
# install() before run_programs imports torch (the .pth hook needs a real install)
RUN = ("import runpy, sys\n"
       "if sys.argv[1] == 'fxguard':\n"
       "    import fxguard; fxguard.install()\n"
       "sys.argv = ['run_programs.py'] + sys.argv[2:]\n"
       "runpy.run_path('run_programs.py', run_name='__main__')\n")


def _chain(mode: str, folder, results: dict) -> None:
    env = child_env(FXGUARD_TEST_BUSY_HELPER="1", PYTHONHASHSEED="0",
                    FXGUARD_CACHE_DIR=str(folder / f"fxguard-{mode}"),
                    TORCHINDUCTOR_CACHE_DIR=str(folder / f"inductor-{mode}"))
    for state in ("cold", "warm"):
        out = folder / f"{mode}-{state}.json"
        results[mode, state] = child_json(["-c", RUN, mode, str(out), *PROGRAMS], out, env=env,
                                          cwd=HERE, label=f"{mode} ({state})")


@pytest.fixture(scope="module")
def digests(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rng-busy")
    results: dict = {}
    run_raising([lambda m=mode: _chain(m, folder, results) for mode in ("stock", "fxguard")],
                timeout=1300)
    return results


@pytest.mark.parametrize("state", ["cold", "warm"])
@pytest.mark.parametrize("program", PROGRAMS)
def test_draws_and_outputs_are_stocks_beside_a_busy_helper(digests, program, state):
    assert digests["fxguard", state]["fxguard_installed"] is True
    stock = digests["stock", state]["programs"][program]
    guarded = digests["fxguard", state]["programs"][program]
    if "unsupported" in stock:
        pytest.skip(f"{program}: {stock['unsupported']}")
    for field in ("tensors", "error", "torch_cpu", "torch_cuda", "python_random"):
        assert stock.get(field) == guarded.get(field), f"{program} ({state}) {field}"
