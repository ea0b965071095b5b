"""An interrupt at every line of fxguard's Python that a thread's CUDA-graph
training steps run (``reduce-overhead``: warm-up, recording, replays, backwards
in turn) leaves the function working for every thread (GPU).

The main thread records first (it keeps the device's default generator state)
and stays alive beside the others.  For each scenario (a graph that draws
random numbers, one that draws nothing) a first run lists the lines of
fxguard's Python a new thread's steps run in that thread: its own files and
the code it swapped into torch.  Then, for each line, a new thread (each
thread records graphs of its own) runs the same steps with KeyboardInterrupt
raised at that line's first run.  Afterwards, within seconds: that thread,
a new thread and the main thread each train steps of the same function;
``torch.cuda.synchronize()`` and an eager draw from the default CUDA generator
work; the default generator keeps the process's seed; no live thread is marked
capturing and no backward turn is held.  Lines run in the autograd worker
(the backward's recording) are not in a thread's trace.

A case takes about 0.6 s on an H100 (torch 2.11), and both scenarios hold about
565 cases: split them to fit a machine lent for minutes.
``FXGUARD_FAULT_SHARD=i/n`` runs every n-th case from the i-th (0-based, counted
over both scenarios in order), so the shards 0/n .. n-1/n together run every case
once.  ``FXGUARD_FAULT_BUDGET_S=S`` starts no case once the next would end past S
seconds (from the first case on): a run cut so fails, saying how many of its cases
ran, never passes on the part it reached.
"""
from __future__ import annotations

import faulthandler
import gc
import os
import threading
import time

import pytest

from line_faults import Tracer, short, swapped_codes

torch = pytest.importorskip("torch")
import fxguard  # noqa: E402
from fxguard.torch_support import cudagraph_rng, cuda_thread  # noqa: E402

TIMEOUT = 120.0  # a hang guard only: a step takes milliseconds
STEPS = 4        # warm-up, recording, replays
SEED = 1234
SOURCES = {
    "draws": "def f(x, w):\n    return (torch.nn.functional.dropout(x * w, 0.5) * 2 + 1).sum()\n",
    "draws nothing": "def f(x, w):\n    return ((x * w).sin() * 2 + 1).sum()\n",
}
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def shard() -> tuple[int, int]:
    """(i, n) of FXGUARD_FAULT_SHARD=i/n ((0, 1): every case)."""
    text = os.environ.get("FXGUARD_FAULT_SHARD", "0/1")
    try:
        i, n = (int(p) for p in text.split("/"))
    except ValueError:
        raise ValueError(f"FXGUARD_FAULT_SHARD={text!r}: want i/n, 0 <= i < n") from None
    if not 0 <= i < n:
        raise ValueError(f"FXGUARD_FAULT_SHARD={text!r}: want i/n, 0 <= i < n")
    return i, n


def budget() -> float | None:
    """FXGUARD_FAULT_BUDGET_S in seconds, or None (no budget)."""
    text = os.environ.get("FXGUARD_FAULT_BUDGET_S")
    return float(text) if text else None


class Budget:
    """Whether the next case still fits ``seconds`` from the first case on: the
    next is taken to last as long as the longest so far (a case that waited on a
    hang guard counts as such)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds, self.started, self.longest, self.cut = seconds, time.monotonic(), 0.0, False

    def fits(self) -> bool:
        if self.seconds is not None and time.monotonic() - self.started + self.longest > self.seconds:
            self.cut = True
        return not self.cut

    def took(self, seconds: float) -> None:
        self.longest = max(self.longest, seconds)


def steps(compiled, n=STEPS) -> list[float]:
    """n training steps of ``compiled`` on this thread's stream."""
    x = torch.randn(4096, device="cuda")
    w = torch.ones(4096, device="cuda", requires_grad=True)
    losses = []
    for _ in range(n):
        loss = compiled(x, w)
        loss.backward()
        losses.append(loss.detach().clone())
        w.grad = None
    torch.cuda.current_stream().synchronize()
    return [v.item() for v in losses]


def in_thread(fn, name: str) -> tuple[bool, object]:
    """(returned, value or exception) of fn() on a new thread inside
    cuda_graph_thread(0); (False, 'hangs') past the guard."""
    box: list = []

    def body():
        try:
            with fxguard.cuda_graph_thread(0):
                box.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box.append((False, e))
    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    t.join(TIMEOUT)
    return box[0] if box else (False, "hangs")


def traced_steps(compiled, tracer):
    """The driver's body: steps under the tracer (the injected exception is
    expected), then steps again on the same thread."""
    def body():
        try:
            with tracer:
                steps(compiled)
        except BaseException:
            if not tracer.fired:
                raise
        return steps(compiled)
    return body


def finite(losses) -> bool:
    return all(v == v and abs(v) < float("inf") for v in losses)


def one_case(compiled, swapped, at=None):
    """(tracer, problems) of a new thread's steps with KeyboardInterrupt at ``at``."""
    tracer = Tracer(swapped, at)
    problems = []
    ok, got = in_thread(traced_steps(compiled, tracer), "driver")
    if not ok:
        problems.append(f"same thread: {got!r}")
    for who, run in {"new thread": lambda: in_thread(lambda: steps(compiled), "new"),
                     "main thread": lambda: _here(lambda: steps(compiled))}.items():
        ok, got = run()
        if not ok:
            problems.append(f"{who}: {got!r}")
        elif not finite(got):
            problems.append(f"{who}: losses {got}")
    problems += device_left_clean()
    return tracer, problems


def _here(fn):
    try:
        with fxguard.cuda_graph_thread(0):
            return True, fn()
    except BaseException as e:  # noqa: BLE001
        return False, e


def device_left_clean() -> list[str]:
    problems = []
    box: list = []
    t = threading.Thread(target=lambda: box.append(torch.cuda.synchronize()), daemon=True)
    t.start()
    t.join(TIMEOUT)
    if t.is_alive():
        problems.append("torch.cuda.synchronize() hangs")
    try:
        torch.randint(0, 1000, (64,), device="cuda")
    except RuntimeError as e:
        problems.append(f"an eager draw from the default generator: {e}")
    if torch.cuda.default_generators[0].initial_seed() != SEED:
        problems.append("the default generator was left with another state")
    alive = {t.ident for t in threading.enumerate()}
    marked = {i for s in cudagraph_rng.thread_streams._captures.values() for i in s} & alive
    if marked:
        problems.append(f"live threads marked capturing: {marked}")
    if cuda_thread.device_turns(0).waiting():
        problems.append("a backward turn is held")
    return problems


def device_unusable() -> str | None:
    """Why a new thread cannot use the device (a stream left capturing), or None."""
    def use():
        torch.cuda.synchronize()
        return (torch.ones(1 << 20, device="cuda") * 2).sum().item()
    box: list = []
    t = threading.Thread(target=lambda: box.append(_try(use)), daemon=True)
    t.start()
    t.join(TIMEOUT)
    if not box:
        return "a new thread's synchronize() hangs"
    ok, got = box[0]
    return None if ok else repr(got)[:300]


def _try(fn):
    try:
        return True, fn()
    except BaseException as e:  # noqa: BLE001
        return False, e


def test_an_interrupt_at_every_line_of_a_recording_leaves_the_function_working():
    """In a child interpreter (a thread an interrupt breaks may keep torch state)."""
    from guarded import run_test_in_child
    shard()  # a malformed FXGUARD_FAULT_SHARD fails here, not in the child
    seconds = budget()
    run_test_in_child(__file__, "test_every_line_in_this_process", "FXGUARD_TEST_FAULTS_HERE",
                      **({"timeout": seconds + 600} if seconds is not None else {}))


@pytest.mark.skipif(not os.environ.get("FXGUARD_TEST_FAULTS_HERE"),
                    reason="run by test_an_interrupt_at_every_line_of_a_recording_leaves_the_function_working")
def test_every_line_in_this_process():
    from guarded import fresh_function
    fxguard.install()
    torch.manual_seed(SEED)
    which, of = shard()
    clock = Budget(budget())
    failures, not_run_again, count, index, started = [], [], 0, -1, time.monotonic()
    seen = {}  # scenario: its cases (lines), all shards'
    for scenario, source in SOURCES.items():
        compiled = torch.compile(fresh_function(source, "f", {"torch": torch}),
                                 mode="reduce-overhead")
        ok, got = _here(lambda: steps(compiled))  # the main thread's graphs first
        assert ok, got
        swapped = swapped_codes()  # rows applied as inductor's modules were imported too
        tracer, problems = one_case(compiled, swapped)
        assert not problems, f"{scenario} without an exception: {problems}"
        lines = [line for line in tracer.seen if line not in tracer.nops]  # no interrupt at a NOP
        seen[scenario] = len(lines)
        mine = sum(1 for k in range(index + 1, index + 1 + len(lines)) if k % of == which)
        print(f"{scenario}: {len(tracer.seen)} lines, {len(lines)} cases, {mine} in shard "
              f"{which}/{of}", flush=True)
        for line in lines:
            index += 1
            if index % of != which:
                continue
            if not clock.fits():
                break
            count += 1
            if count % 25 == 0:  # a run cut short still says how far it got
                print(f"{count} cases in {time.monotonic() - started:.0f} s", flush=True)
            print(f"case {count}: {short(line)}", flush=True)
            # A case takes about a second: one still running after a minute says where every
            # thread waits (its main-thread run has no guard).
            faulthandler.dump_traceback_later(60, exit=False)
            began = time.monotonic()
            case, problems = one_case(compiled, swapped, line)
            clock.took(time.monotonic() - began)
            faulthandler.cancel_dump_traceback_later()
            if problems:
                failures.append(f"{scenario}: KeyboardInterrupt at {short(line)}: "
                                + "; ".join(problems))
                print("FAILING", failures[-1][:600], flush=True)  # a run cut short still tells
                unusable = device_unusable()
                if unusable:  # every later case would fail for this one
                    pytest.fail(f"the device is unusable after {failures[-1][:300]}: {unusable}; "
                                f"{count} cases run, {len(failures)} failing:\n"
                                + "\n".join(f[:300] for f in failures))
            elif not case.fired:
                not_run_again.append(short(line))
            gc.collect()
        if clock.cut:
            break
    took = time.monotonic() - started
    print(f"{count} cases in {took:.0f} s (shard {which}/{of}); {len(failures)} failing; "
          f"{len(not_run_again)} lines a new thread does not run again")
    if clock.cut:  # a run the budget cut is no pass: say how far it got
        left = [s for s in SOURCES if s not in seen]
        pytest.fail(f"FXGUARD_FAULT_BUDGET_S={clock.seconds:g} cut the run: {count} cases of shard "
                    f"{which}/{of} ran in {took:.0f} s, cases per scenario (all shards) {seen}"
                    + (f", {', '.join(left)} not reached" if left else "")
                    + f"; {len(failures)} failing:\n" + "\n".join(f[:300] for f in failures))
    assert count or of > sum(seen.values()), "the tracer saw none of fxguard's lines"
    assert not failures, (f"{len(failures)} of {count} cases leave the function broken:\n"
                          + "\n".join(failures))
    assert len(not_run_again) <= count // 4, not_run_again
