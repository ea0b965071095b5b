"""An interrupt at every line of the capture marks (a capture's start and end,
a device-wide call: ``ThreadStreams``) leaves no mark that holds another thread
off, while the interrupted thread lives on (torch-free part; the GPU harness,
test_interrupt_cuda_graphs.py, runs them inside real captures).

The interrupted thread runs a capture as capture_begin's and capture_end's
templates do (cleanup on any exception) and a device call as synchronize()'s
does, then stays alive; meanwhile another thread's device call and capture must
each pass within seconds.  With the GIL off other threads' stacks are not
walked, so a device call an interrupt left listed in a live thread lapses only
when that thread ends: lines of the listing are not checked there.
"""
from __future__ import annotations

import threading

import pytest

from guarded import gil_off
from line_faults import Tracer

pytest.importorskip("torch")
from fxguard.torch_support.cudagraph_rng import ThreadStreams, _DeviceCall  # noqa: E402

DEVICE = 0
PASS_WITHIN = 10.0  # a hang guard: each step takes microseconds


def capture_then_call(streams: ThreadStreams) -> None:
    """A capture (marked before capture_begin, unmarked at its end; the templates'
    cleanup on any exception) and then a device call, as one thread makes them."""
    try:
        streams._capture_starts(DEVICE)
        streams.ended()
    except BaseException:
        streams.ended()   # close()'s cleanup (no stream is capturing on the CPU)
        raise
    with streams.no_capture_on(DEVICE):
        pass


def passes(fn) -> bool:
    """Whether fn() returns within PASS_WITHIN seconds on a thread of its own."""
    done = threading.Event()
    threading.Thread(target=lambda: (fn(), done.set()), daemon=True).start()
    return done.wait(PASS_WITHIN)


def interrupted_at(line, streams: ThreadStreams) -> list[str]:
    """Problems another thread meets while a thread interrupted at ``line`` lives on."""
    ran, leave = threading.Event(), threading.Event()

    def body():
        try:
            with Tracer((), line):
                capture_then_call(streams)
        except KeyboardInterrupt:
            pass
        ran.set()
        leave.wait(60)
    t = threading.Thread(target=body, daemon=True)
    t.start()
    assert ran.wait(60)
    problems = []
    if not passes(lambda: capture_then_call(streams)):
        problems.append("another thread's capture or device call waits")
    leave.set()
    t.join(60)
    return problems


def test_an_interrupt_at_every_line_of_the_marks_holds_no_other_thread_off():
    streams = ThreadStreams(lambda: threading.get_ident)
    listing = Tracer(())
    t = threading.Thread(target=lambda: _traced(listing, streams))
    t.start()
    t.join(60)
    lines = [line for line in listing.seen if line not in listing.nops]
    assert len(lines) >= 10, lines
    if gil_off():  # a listed call lapses with its thread there, not with its frame
        lines = [line for line in lines if not any(
            _in(line, f.__code__) for f in (ThreadStreams._device_call_begins, ThreadStreams._device_call_ends,
                                            _DeviceCall.__enter__, _DeviceCall.__exit__))]
    failures = {f"{line[0].rsplit('/', 1)[-1]}:{line[1]}": problems
                for line in lines if (problems := interrupted_at(line, ThreadStreams(lambda: threading.get_ident)))}
    assert not failures, failures


def _in(line, code) -> bool:
    numbers = [n for _, _, n in code.co_lines() if n is not None]
    return line[0] == code.co_filename and min(numbers) <= line[1] <= max(numbers)


def _traced(tracer: Tracer, streams: ThreadStreams) -> None:
    with tracer:
        capture_then_call(streams)
