"""Stock where nothing races: single-thread programs give stock's digests under fxguard.

Every program in programs.py runs in fresh interpreters, stock (FXGUARD=0)
and with FXGUARD=1 (installed on ``import torch`` by the .pth hook), first on
a cold inductor cache and then warm (the same folder again; stock and fxguard
each have their own), with idle threads alive.  What each computed, the next
draws of every generator, dynamo's counters and the warnings and log records
it raised must be stock's, field by field.

Programs are batched: one interpreter per (mode, cache state), the stock and
fxguard chains side by side, so the suite costs about a minute and a half of a
2-core machine.
"""
import os
import time

import pytest

from guarded import child_env, child_json, run_raising

pytest.importorskip("torch")
import torch  # noqa: E402

from programs import GPU, PROGRAMS  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = {"stock": "0", "fxguard": "1"}
CACHES = ("cold", "warm")
NOT_COMPARED = {"seconds"}


def _chain(mode: str, folder, results: dict) -> None:
    """Cold then warm, in one inductor cache folder of this mode's own."""
    cache = folder / f"inductor-{mode}"
    for state in CACHES:
        out = folder / f"{mode}-{state}.json"
        env = child_env(FXGUARD=MODES[mode], TORCHINDUCTOR_CACHE_DIR=str(cache),
                        PYTHONHASHSEED="0")
        results[mode, state] = child_json([os.path.join(HERE, "run_programs.py"), str(out)], out,
                                          env=env, cwd=HERE, label=f"{mode} ({state})")


@pytest.fixture(scope="module")
def digests(tmp_path_factory):
    folder = tmp_path_factory.mktemp("differential")
    results: dict = {}
    start = time.perf_counter()
    run_raising([lambda m=mode: _chain(m, folder, results) for mode in MODES], timeout=1300)
    results["wall_s"] = round(time.perf_counter() - start, 1)
    print(f"differential suite: 4 interpreters in {results['wall_s']} s")
    return results


def test_fxguard_is_installed_in_its_runs_only(digests):
    """The comparison means something only if FXGUARD=1 really installed fxguard."""
    for state in CACHES:
        assert digests["fxguard", state]["fxguard_installed"] is True, state
        assert digests["stock", state]["fxguard_installed"] is False, state


# Programs whose compile draws where fxguard does not cover it (docs/limits.md):
# those draws stay drawn where stock sets them back.
NOT_STOCK: dict[str, str] = {}


def _cases():
    for name in PROGRAMS:
        marks = [pytest.mark.gpu, pytest.mark.skipif(
            not torch.cuda.is_available(), reason="needs CUDA")] if name in GPU else []
        if name in NOT_STOCK:
            marks.append(pytest.mark.xfail(strict=True, reason=NOT_STOCK[name]))
        for state in CACHES:
            yield pytest.param(name, state, marks=marks, id=f"{name}-{state}")


@pytest.mark.parametrize("program, state", list(_cases()))
def test_same_as_stock(digests, program, state):
    stock = digests["stock", state]["programs"][program]
    guarded = digests["fxguard", state]["programs"][program]
    if "unsupported" in stock:
        pytest.skip(f"{program}: {stock['unsupported']}")
    differ = [f"{program} ({state} cache) {field}:\n  stock:   {stock.get(field)!r}\n"
              f"  fxguard: {guarded.get(field)!r}"
              for field in sorted((set(stock) | set(guarded)) - NOT_COMPARED)
              if stock.get(field) != guarded.get(field)]
    assert not differ, "\n".join(differ)
