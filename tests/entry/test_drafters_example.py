"""examples/drafters.py, README's first example: three drafter threads show what
they suffer on stock torch (exit 1, or a crash: torch 2.11's CUDA wheels
without a GPU segfault) and nothing with fxguard (exit 0)."""
import os
import subprocess
import sys

import pytest

from guarded import child_env, needs_the_gil_for_compile_once

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "drafters.py")

# Minutes: `pytest --full` (CI) runs it.  Its duplicate-compile count needs compile once.
pytestmark = [pytest.mark.slow, needs_the_gil_for_compile_once]


@pytest.mark.parametrize("way", ["stock", "fxguard"])
def test_drafters_example(way, tmp_path):
    args = [sys.executable, os.path.abspath(EXAMPLE), "--device", "cpu", "--steps", "2"]
    done = subprocess.run(args + (["--fxguard"] if way == "fxguard" else []), cwd=tmp_path,
                          capture_output=True, text=True, timeout=1200, env=child_env())
    if way == "stock":
        assert done.returncode != 0, done.stdout  # 1: it saw something; < 0: torch crashed
    else:
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert "result: clean" in done.stdout
