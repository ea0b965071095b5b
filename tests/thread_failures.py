"""An exception that escapes any thread while a test runs fails that test.

Threads a test starts report what they raise through ``threading.excepthook``
(``threading.Thread``) or ``sys.unraisablehook`` (``_thread.start_new_thread``);
pytest only warns about the first and drops the second, so a test whose
threads failed could pass.  Here each phase of every test (setup, call,
teardown) collects both and raises the first after the phase: a failed call
(which a strict xfail then counts as the expected failure) or an error.  A
thread left running by an earlier test that raises now fails the test running
now, and the message names the test that left it.
tests/conftest.py imports these hooks; any conftest can.
"""
import sys
import threading
import traceback
import weakref

import pytest

_THREAD_START = "Exception ignored in thread started by"


class ThreadRaised(AssertionError):
    """What a test's thread raised, as the test's own failure."""


_left_by = weakref.WeakKeyDictionary()  # thread -> the test that started it and ended first


def _who(thread) -> str:
    if thread is None:
        return "thread <unknown>"
    earlier = _left_by.get(thread)
    return f"thread {thread.name!r}" + (f" (left running by {earlier})" if earlier else "")


def _watch():
    """Install the collecting hooks; returns (what they saw, undo)."""
    seen = []
    thread_hook, unraisable_hook = threading.excepthook, sys.unraisablehook

    def on_thread(args):
        seen.append((_who(args.thread), args.exc_value))

    def on_unraisable(args):
        if (args.err_msg or "").startswith(_THREAD_START) and args.exc_value is not None:
            seen.append((f"thread started by {args.object!r}", args.exc_value))
        else:  # not a thread's: pytest's own handling, as before
            unraisable_hook(args)

    threading.excepthook, sys.unraisablehook = on_thread, on_unraisable

    def undo():
        threading.excepthook, sys.unraisablehook = thread_hook, unraisable_hook
    return seen, undo


def _phase(item, when):
    seen, undo = _watch()
    try:
        result = yield
    except BaseException:  # failed already: that stays the failure, these are shown
        undo()
        _show(item, when, seen)
        raise
    undo()
    if seen:
        _show(item, when, seen[1:])
        who, first = seen[0]
        more = f" (and {len(seen) - 1} more: 'thread exceptions')" if len(seen) > 1 else ""
        raise ThreadRaised(f"{who} raised {type(first).__name__}: {first}{more}") from first
    return result


def _show(item, when, seen):
    if seen:
        item.add_report_section(when, "thread exceptions", "\n".join(
            f"{who} raised:\n" + "".join(traceback.format_exception(type(e), e, e.__traceback__))
            for who, e in seen))


# trylast: the innermost wrapper, so these hooks see the phase's threads rather
# than pytest's own per-phase catcher (pytest < 8.4), whose warning only warns.
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_setup(item):
    item.stash[_before] = set(threading.enumerate())
    return (yield from _phase(item, "setup"))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item):
    return (yield from _phase(item, "call"))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item):
    try:
        return (yield from _phase(item, "teardown"))
    finally:
        before = item.stash.get(_before, set())
        for thread in threading.enumerate():
            if thread not in before and thread not in _left_by:
                _left_by[thread] = item.nodeid


_before = pytest.StashKey[set]()
