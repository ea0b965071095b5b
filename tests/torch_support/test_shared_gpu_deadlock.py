"""Shared-GPU deadlock (compile_lock vs the autograd worker): reproduced on stock, gone with install()."""
import json
import os
import subprocess
import sys

import pytest
import torch

from fxguard.demos import shared_gpu

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_stock_torch_deadlocks_within_seconds():
    outcome = shared_gpu.probe(install=False)
    assert outcome["result"] == "deadlocked", outcome


def test_install_removes_the_deadlock():
    outcome = shared_gpu.probe(install=True)
    assert outcome["result"] == "completed", outcome


def test_three_drafter_threads_on_one_gpu_for_30s(tmp_path):
    """The drafter workload with install(): progress in every thread, 0 errors."""
    bench = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "workarounds.py")
    out = tmp_path / "drafter.json"
    proc = subprocess.run([sys.executable, bench, "--device", "cuda", "--threads", "3",
                           "--modes", "fxguard", "--seconds", "30", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    mode = json.loads(out.read_text())["modes"]["fxguard"]
    assert mode["status"] == "ok" and mode["errors"] == 0
    assert all(n > 0 for n in mode["steps_per_thread"])
