"""concurrent_compiles, bounded stress: 3 threads compile distinct functions at
once, a few rounds, in a fresh process (a child: cold inductor set-up, no FX
graph cache) and in this warm one.

Thread work, new shapes (so new graphs) every round:
- flex_attention compiled, with an eager ``create_block_mask``;
- an MLP with backward (eager backward: its backward compiles with the forward);
- dynamic shapes across a graph break (three lengths, one compile per piece).

Every round: no error, every result equal to eager, each function compiled
(its code holds a cache entry: a call that ran eager fails) and the guards a
thread built pass in that thread (a second call adds no cache entry), and
afterwards no flag is left set, in any thread.  The deterministic races these
rows fix are in the other ``test_overlapping_*``/``test_compile_*`` files; this
one only says that real compiles overlapping in every way they like still come
out right.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import traceback

import pytest

# Imported at collection, so that tests/conftest.py compiles on the main thread
# first (torch 2.11's CUDA wheels without a GPU otherwise keep a compiling
# thread's fake device guard after that thread ends: README, Limits).
import torch  # noqa: F401
from guarded import child_env, fresh_function, needs_the_gil

pytestmark = [pytest.mark.slow, needs_the_gil]


def cache_entries(code) -> int:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    return len(_debug_get_cache_entry_list(code))


def compiled_and_guards_hold(name: str, code, call_again) -> list[str]:
    """``code`` was just called through torch.compile in this thread: it must
    hold a cache entry (else it ran eager), and calling it again with the same
    input must add none (else the guards it built failed in its own thread)."""
    from torch._dynamo.utils import guard_failures
    entries = cache_entries(code)
    if entries == 0:
        from torch._dynamo.utils import counters
        return [f"{name}: not compiled (ran eager); frames {dict(counters['frames'])}, "
                f"recompile limit hit {dict(counters['recompiles'])}, "
                f"graph breaks {len(counters['graph_break'])}"]
    call_again()
    if cache_entries(code) == entries:
        return []
    return [f"{name}: guards failed in own thread: {guard_failures.get(code, [])[-1:]}"]


def flex_step(r: int) -> list[str]:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    size = 32 * (r + 1)

    def causal(b, h, q, kv):
        return q >= kv

    q, k, v = (torch.randn(1, 2, size, 16) for _ in range(3))
    mask = create_block_mask(causal, 1, 2, size, size, device="cpu")
    compiled = torch.compile(flex_attention)
    out = compiled(q, k, v, block_mask=mask)
    problems = compiled_and_guards_hold("flex", flex_attention.__code__,
                                        lambda: compiled(q, k, v, block_mask=mask))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex_attention's "use torch.compile" warning
        ref = flex_attention(q, k, v, block_mask=mask)
    return problems + ([] if torch.allclose(out, ref, atol=1e-4, rtol=1e-4) else ["flex: differs"])


class MLP(torch.nn.Module):
    """Defined here, not an ``nn.Sequential``: torch.compile routes a module
    whose forward is torch's own through one wrapper code shared by the whole
    process (``external_utils.wrap_inline``), so its cache entries would not be
    on ``forward`` and the checks below would see nothing."""

    def __init__(self, width: int):
        super().__init__()
        self.inner = torch.nn.Linear(width, 2 * width)
        self.outer = torch.nn.Linear(2 * width, 4)

    def forward(self, x):
        return self.outer(torch.relu(self.inner(x)))


def mlp_step(r: int) -> list[str]:
    import torch
    width = 16 * (r + 2)
    torch.manual_seed(r)
    net = MLP(width)
    x = torch.randn(8, width)
    compiled = torch.compile(net)
    out = compiled(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    problems = compiled_and_guards_hold("mlp", MLP.forward.__code__, lambda: compiled(x))
    net.zero_grad()
    ref = net(x)
    ref.sum().backward()
    same = torch.allclose(out, ref, atol=1e-5) and all(
        torch.allclose(g, p.grad, atol=1e-5) for g, p in zip(grads, net.parameters()))
    return problems + ([] if same else ["mlp: forward or grads differ"])


def dynamic_step(r: int) -> list[str]:
    import torch
    f = fresh_function(f"def f(x):\n    y = (x * {r + 2}).cos()\n    torch._dynamo.graph_break()\n"
                       f"    return y.sum(0) + {r}\n", namespace={"torch": torch})
    compiled = torch.compile(f, dynamic=True)
    problems = []
    for n in (5, 9, 13):
        x = torch.randn(n, 3)
        if not torch.allclose(compiled(x), f(x), atol=1e-5):
            problems.append(f"dynamic: differs at length {n}")
    # A new length: the dynamic graph's guards must cover it.
    return problems + compiled_and_guards_hold("dynamic", f.__code__,
                                               lambda: compiled(torch.randn(7, 3)))


STEPS = (flex_step, mlp_step, dynamic_step)


def left_set(last: bool = False) -> list[str]:
    """This thread's state (and, ``last``: once every thread is done, the
    process's) that must be back at rest."""
    import torch
    import torch._dynamo.convert_frame as convert_frame
    import torch.fx.graph_module as graph_module
    from torch._inductor import ir
    from torch._inductor.triton_bundler import TritonBundler
    from torch.utils._python_dispatch import is_in_torch_dispatch_mode

    import fxguard
    found = {
        "is_compiling": torch.compiler.is_compiling(),
        # process-wide, on while any thread traces a joint graph: only at rest once all are done
        "anomaly mode": last and torch.is_anomaly_enabled(),
        "dispatch mode": is_in_torch_dispatch_mode(),
        "fx tracing": fxguard.is_fx_tracing(),
        "origins": bool(ir.IRNode._current_origins),
        "bundle": TritonBundler._entries is not None,
        "force_realize": ir.ComputedBuffer._force_realize,
        "initial_global_state": getattr(convert_frame, "initial_global_state", None) is not None,
        "torch-function modes": bool(torch.overrides._get_current_function_mode_stack()),
        "skip wrapper": graph_module._forward_from_src is not convert_frame.original_forward_from_src,
    }
    lock = convert_frame.compile_lock
    found["compile_lock held"] = lock._is_owned() or (last and lock.state()["holders"] > 0)
    return [name for name, on in found.items() if on]


def run(rounds: int) -> dict:
    report: dict = {"errors": [], "problems": [], "left set": [], "steps": 0}

    def worker(step):
        try:
            for r in range(rounds):
                report["problems"] += step(r)
                report["steps"] += 1
        except Exception:  # noqa: BLE001 - every error counts
            report["errors"].append(traceback.format_exc()[-1500:])
        report["left set"] += [f"{step.__name__}: {x}" for x in left_set()]

    threads = [threading.Thread(target=worker, args=(s,), daemon=True) for s in STEPS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    report["left set"] += [f"main: {x}" for x in left_set(last=True)]
    report["stuck"] = sum(t.is_alive() for t in threads)
    return report


def check(report: dict, rounds: int) -> None:
    assert report["errors"] == [], report["errors"][0]
    assert report == {"errors": [], "problems": [], "left set": [], "steps": rounds * len(STEPS),
                      "stuck": 0}, report


def test_fresh_process():
    """A child that installs fxguard with the option, then compiles cold."""
    env = child_env(TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    done = subprocess.run([sys.executable, __file__, "1"], capture_output=True, text=True,
                          env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    check(json.loads(done.stdout.strip().splitlines()[-1]), 1)


def test_warm_process():
    import fxguard
    fxguard.install(concurrent_compiles=True)
    check(run(2), 2)


if __name__ == "__main__":
    import fxguard
    import torch
    fxguard.install(concurrent_compiles=True)
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))  # see tests/conftest.py
    rounds = int(sys.argv[1])
    print(json.dumps(run(rounds)))
