"""machinery.process_hooks, torch-free: each hook once, in the order it came.
The fork and exit cases run in a fresh interpreter: a hook set on the process
stays for its life, and this one's were set when fxguard was imported."""
import os
import subprocess
import sys
import textwrap
import types

import pytest

from fxguard.machinery import process_hooks

needs_fork = pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="no fork() here")


def run_python(body: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FXGUARD")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(body)], env=environ,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@needs_fork
def test_one_fork_hook_serves_every_callback_once_each_in_order():
    proc = run_python("""
        import os
        made = []
        real = os.register_at_fork
        os.register_at_fork = lambda **hooks: (made.append(hooks), real(**hooks))[1]
        from fxguard.machinery import process_hooks
        ran = []
        first, second = (lambda: ran.append("first")), (lambda: ran.append("second"))
        for callback in (first, second, first, second):
            process_hooks.after_fork_in_child(callback)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if ran == ["first", "second"] else 1)
        _, status = os.waitpid(pid, 0)
        hooks = [h["after_in_child"] for h in made]
        rooms = sum(h is process_hooks._run_in_forked_child for h in hooks)
        cores = sum(type(getattr(h, "__self__", None)).__name__ == "PyCapsule" for h in hooks)
        print(os.waitstatus_to_exitcode(status), rooms, cores, ran)
    """)
    # the child ran each once, in order; one hook for the room, one of the C core's own
    assert proc.stdout.splitlines()[0] == "0 1 1 []"


@needs_fork
def test_a_child_registers_though_another_thread_held_the_rooms_lock_at_fork():
    run_python("""
        import os, signal, threading
        from fxguard.machinery import process_hooks
        held, leave = threading.Event(), threading.Event()
        def hold():
            with process_hooks._lock:
                held.set()
                leave.wait(60)
        t = threading.Thread(target=hold)
        t.start()
        assert held.wait(60)
        pid = os.fork()
        if pid == 0:  # the holder is gone here: registering must not wait for it
            signal.alarm(60)  # a hang guard: a child that waited dies of SIGALRM
            process_hooks.after_fork_in_child(lambda: None)
            process_hooks.at_exit(print)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        leave.set()
        t.join()
        assert os.waitstatus_to_exitcode(status) == 0
    """)


def test_exit_hooks_once_per_callback_and_arguments_last_first():
    proc = run_python("""
        from fxguard.machinery import process_hooks
        for _ in range(3):
            process_hooks.at_exit(print, "registered first")
            process_hooks.at_exit(print, "registered second")
    """)
    assert proc.stdout.splitlines() == ["registered second", "registered first"]


def finder(log: list, name: str):
    """A finder that notes the names it is asked for and finds nothing."""
    return types.SimpleNamespace(find_spec=lambda n, path=None, target=None: log.append(name))


def test_a_finder_watches_once_and_stops():
    log: list = []
    mine = finder(log, "mine")
    try:
        process_hooks.watch_imports(mine)
        process_hooks.watch_imports(mine)
        assert sys.meta_path[0] is mine and sys.meta_path.count(mine) == 1
    finally:
        process_hooks.stop_watching(mine)
    assert mine not in sys.meta_path
    process_hooks.stop_watching(mine)  # not on it: nothing


def test_spec_after_asks_only_the_finders_after_it():
    log: list = []
    before, me = finder(log, "before"), finder(log, "me")
    sys.meta_path[:0] = [before, me]
    try:
        spec = process_hooks.spec_after(me, "json", None, None)
    finally:
        for f in (before, me):
            process_hooks.stop_watching(f)
    assert spec is not None and spec.name == "json" and log == []
