"""Smoke test of benchmarks/workarounds.py: smallest settings, CPU, fxguard mode."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow  # minutes: `pytest --full` (CI) runs it

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "workarounds.py")


@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13),
                    reason="torch <= 2.12 on CPU: inductor's C++ codegen for the forward-only "
                           "flex_attention of one shape fails (CppCompileError), stock torch too")
def test_concurrent_compile_writes_complete_json_with_zero_errors(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, BENCH, "--device", "cpu", "--threads", "2", "--modes", "fxguard",
                           "--seconds", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "workarounds"  # benchmarks/_harness.py's envelope
    assert {"date", "machine", "python", "torch", "fxguard", "commit"} <= set(report)
    assert report["torch"] == torch.__version__ and report["machine"]["name"] == "cpu"
    mode = report["modes"]["fxguard"]
    for key in ("status", "train", "time_to_first_step_s", "steps_per_s", "tokens_per_s", "errors",
                "error_kinds", "graphs_compiled", "memory_samples", "memory_flatness", "steps_per_thread"):
        assert key in mode, key
    assert mode["status"] == "ok" and mode["errors"] == 0, mode.get("error_kinds")
    assert mode["train"] is False  # CPU flex_attention has no backward: forward-only, and it says so
    assert all(n > 0 for n in mode["steps_per_thread"])


DRAFTERS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "cuda_graph_drafters.py")


@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13),
                    reason="torch <= 2.12 on CPU: inductor's C++ codegen of flex_attention fails")
def test_fast_drafter_step_runs_in_three_threads_on_cpu(tmp_path):
    """The fast step's pieces (compiled create_block_mask, compiled model, compiled
    AdamW.step) in 3 threads with fxguard; on the CPU inductor skips CUDA graphs.  A
    window of 4 s: a loaded 2-core CPU makes about a step a second per drafter, and a
    drafter with no step in a window is an error (so is a window begun before every
    drafter compiled: the warm-up may take minutes there, 5 on a 2-core CPU at load 9)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, DRAFTERS, "--device", "cpu", "--modes", "threads-fast",
                           "--seconds", "4", "--repeats", "2", "--warmup-limit", "700", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["args"]["device"] == "cpu"
    mode = report["modes"]["threads-fast"]
    assert mode["errors"] == 0, mode.get("error_kinds")
    assert mode["time_until_all_lengths_s"] is not None, mode  # every drafter ran every length
    assert len(mode["steps_in_window"]) == 3 and mode["gpu_used_peak_gib"] is None
    # two windows of the same warm processes: the median, its spread, each window's figures
    assert mode["windows_measured"] == 2 and len(mode["windows"]) == 2
    low, high = mode["steps_per_s_spread"]
    assert 0 < low <= mode["steps_per_s"] <= high
    assert all(min(w["steps_in_window"]) > 0 for w in mode["windows"])
    assert "threads-fast" in proc.stdout.split("÷ processes-fast")[-1]  # the table


def test_a_drafter_with_no_step_in_a_window_is_an_error_in_every_mode(tmp_path):
    """DRAFTER_IDLE=0: drafter 0 of each process makes no step (no compile either: cheap).
    Each window counts it (a thread mode's and each of processes-fast's), never '0 errors'."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, DRAFTERS, "--device", "cpu", "--modes", "one-plain,processes-fast",
                           "--seconds", "0.5", "--repeats", "2", "--warmup-limit", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, DRAFTER_IDLE="0"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    modes = json.loads(out.read_text())["modes"]
    for name, drafters in (("one-plain", 1), ("processes-fast", 3)):
        mode = modes[name]
        assert mode["windows_measured"] == 2, mode
        assert mode["errors"] == 2 * drafters and mode["error_kinds"] == ["no step in the window"], mode
        assert all(w["steps_in_window"] == [0] * drafters for w in mode["windows"])
