"""torch.compile's options read without a config window (torch <= 2.11) give
what stock's window gives, an entry an environment variable forces included:
config.patch cannot override it, so neither may the copy."""
import subprocess
import sys

import pytest

from guarded import child_env

pytestmark = pytest.mark.slow  # minutes: `pytest --full` (CI) runs it

SCRIPT = """
import sys, torch, torch._inductor.compile_fx, fxguard
if sys.argv[1] == "on":
    rows = fxguard.install()["patch_points"]
    if not any(r["what"] == "torch.compile options per thread" and r["patched"] for r in rows):
        print("not patched")
        raise SystemExit
from torch._inductor.compile_fx import get_patched_config_dict
print(get_patched_config_dict({"fx_graph_cache": True, "max_autotune": True})["fx_graph_cache"])
"""


def _run(way: str) -> str:
    env = dict(child_env(), TORCHINDUCTOR_FX_GRAPH_CACHE="0")
    out = subprocess.run([sys.executable, "-c", SCRIPT, way], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_an_env_forced_entry_wins_over_the_options_as_in_stock():
    on = _run("on")
    if on == "not patched":
        pytest.skip("the row is not patched on this torch (config per thread: no window)")
    assert on == _run("off") == "False"
