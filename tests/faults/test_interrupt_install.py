"""An interrupt at every line of fxguard's Python that install() and uninstall()
run leaves every change recorded and compiled code working, and the next
uninstall() leaves torch exactly stock.

A first run lists the lines of fxguard's own files each one runs (torch's
modules imported, so every row is planned at once).  Then for each line,
KeyboardInterrupt is raised at that line's first run, as an interrupt delivered
there would be.  Afterwards every attribute fxguard changed is recorded (so
undone by uninstall()), install()'s lock is free, the collector on, and a
compiled function returns the right value from the main thread and a new one.
Then uninstall() must leave torch exactly stock: every attribute fxguard
changes holds the very object it held before, no name is held for a frame, the
C core is off, the import hooks as they were; and the next case's install()
must reach its line (a broken code cache or lock would stop it before).  At
the end install() and a compile from a new thread work.

The cases take minutes: they run in CI on one torch (FXGUARD_TEST_INSTALL_FAULTS=1,
.ci/run), in a child interpreter.
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import time

import pytest

from line_faults import Tracer, short

torch = pytest.importorskip("torch")
import fxguard  # noqa: E402
from fxguard import _core, _install  # noqa: E402
from fxguard.machinery import originals  # noqa: E402

MODULES = ("torch._dynamo", "torch._inductor.compile_fx", "torch.nn.attention.flex_attention",
           "torch.export", "torch.fx.experimental.proxy_tensor", "torch._functorch.aot_autograd")
HANG = 60.0  # a hang guard only


def test_an_interrupt_at_every_line_of_install_and_uninstall():
    if not os.environ.get("FXGUARD_TEST_INSTALL_FAULTS"):
        pytest.skip("minutes: set FXGUARD_TEST_INSTALL_FAULTS=1 (CI does, on one torch)")
    from guarded import run_test_in_child
    run_test_in_child(__file__, "test_every_line_in_this_process", "FXGUARD_TEST_FAULTS_HERE")


@pytest.mark.skipif(not os.environ.get("FXGUARD_TEST_FAULTS_HERE"),
                    reason="run by test_an_interrupt_at_every_line_of_install_and_uninstall")
def test_every_line_in_this_process():
    import importlib
    for name in MODULES:
        importlib.import_module(name)
    fxguard.uninstall()
    reference = Reference()
    failures, count = [], 0
    print(f"cases: install {len(reference.lines['install'])}, uninstall "
          f"{len(reference.lines['uninstall'])}; lines at a NOP, not cases: {reference.nops}", flush=True)
    for what in ("install", "uninstall"):
        lines = reference.lines[what]
        count += len(lines)
        for line in lines:
            problems = one_case(reference, what, line)
            if problems:
                failures.append(f"{what}, KeyboardInterrupt at {short(line)}: " + "; ".join(problems))
                print(failures[-1], flush=True)
    assert count > 100, f"the tracer saw only {count} lines"
    assert not failures, (f"{len(failures)} of {count} cases leave torch between states:\n"
                          + "\n".join(failures))
    fxguard.install()
    assert compiles_in_a_new_thread()
    fxguard.uninstall()


class Reference:
    """What a full install changes (owner, attribute, what was there), and the
    lines install() and uninstall() run."""

    def __init__(self) -> None:
        self.meta_path = list(sys.meta_path)
        import importlib
        for _ in range(5):  # every module a row waits for imported: all rows planned at once
            waiting = fxguard.install()["waiting"]
            fxguard.uninstall()  # fxguard's modules imported: their one-time lines are not cases
            for name in waiting:
                importlib.import_module(name)
        assert not waiting, waiting
        self.lines, self.nops = {}, 0
        for what in ("install", "uninstall"):
            tracer = Tracer(())
            with tracer:
                getattr(fxguard, what)()
            if what == "install":  # what stock had: the first change's original, per attribute
                first = {}
                for p in originals.applied():
                    first.setdefault((id(p.owner), p.attr), (p.owner, p.attr, p.original))
                self.patches = list(first.values())
            self.lines[what] = [line for line in tracer.seen if line not in tracer.nops]
            self.nops += len(tracer.nops)
        assert not self.stock_differences(), self.stock_differences()
        compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
        self.warm = lambda x: torch.equal(compiled(x), x * 2 + 1)
        assert self.warm(torch.ones(3))

    def unrecorded(self) -> list[str]:
        """Attributes fxguard changed that nothing records (uninstall() could
        not put them back)."""
        swept()
        recorded = {(id(p.owner), p.attr) for p in originals.applied()}
        recorded |= {(id(h.change.owner), h.change.attr) for h in originals.held()}
        return [f"{_name(owner)}.{attr} changed and not recorded"
                for owner, attr, original in self.patches
                if _own(owner, attr) is not original and (id(owner), attr) not in recorded]

    def stock_differences(self) -> list[str]:
        swept()
        found = []
        if originals.applied():
            found.append(f"{len(originals.applied())} changes still recorded")
        for owner, attr, original in self.patches:
            now = _own(owner, attr)
            if now is not original:
                found.append(f"{_name(owner)}.{attr} is not what stock had")
        if _core._mode() != _core.MODE_OFF:
            found.append("the C core is on")
        if [f for f in sys.meta_path if f not in self.meta_path]:
            found.append("an import hook left in sys.meta_path")
        return found


def one_case(reference: Reference, what: str, line) -> list[str]:
    if what == "uninstall":
        fxguard.install()
    tracer = Tracer((), line, KeyboardInterrupt)
    raised = None
    try:
        with tracer:
            getattr(fxguard, what)()
    except BaseException as e:  # noqa: BLE001 - the injected one is expected
        raised = e
    problems = []
    if not tracer.fired:
        problems.append(f"the line was not reached (raised {raised!r})")
    elif raised is not None and not isinstance(raised, KeyboardInterrupt):
        problems.append(f"raised {raised!r} instead of the interrupt")
    if not gc.isenabled():
        gc.enable()
        problems.append("the garbage collector was left off")
    if _install._lock.locked():  # nothing else runs install() here: it was left held
        _install._lock.release()
        problems.append("install()'s lock was left held")
    problems += reference.unrecorded()
    if fxguard.is_installed() and fxguard.status()["mode"] == "not-installed":
        problems.append("installed, with the core off")
    for who, run in (("main thread", _here), ("new thread", in_new_thread)):
        if run(lambda: reference.warm(torch.ones(3))) is not True:
            problems.append(f"a compiled function, called from the {who}, fails")
    try:
        fxguard.uninstall()
    except BaseException as e:  # noqa: BLE001
        return problems + [f"uninstall() afterwards raised {e!r}"]
    problems += [f"after uninstall(): {p}" for p in reference.stock_differences()]
    if problems:  # what is left over must not fail the cases after this one
        sys.meta_path[:] = reference.meta_path
    return problems


def swept() -> None:
    """Names uninstall() kept bound for frames are gone once no frame needs them."""
    deadline = time.monotonic() + HANG
    while originals.held() and time.monotonic() < deadline:
        time.sleep(0.005)


def _here(fn):
    try:
        return fn()
    except BaseException as e:  # noqa: BLE001
        return e


def in_new_thread(fn):
    box = []
    t = threading.Thread(target=lambda: box.append(_here(fn)), daemon=True)
    t.start()
    t.join(HANG)
    return box[0] if box else "hangs"


def compiles_in_a_new_thread() -> bool:
    box = []

    def body():
        f = torch.compile(lambda x: x * 2 + 1, backend="eager")
        box.append(torch.equal(f(torch.ones(3)), torch.full((3,), 3.0)))
    t = threading.Thread(target=body)
    t.start()
    t.join(HANG)
    return box == [True]


def _own(owner, attr):
    import types
    if isinstance(owner, types.ModuleType):
        return vars(owner).get(attr, originals.MISSING)
    if type(owner) is dict:
        return owner.get(attr, originals.MISSING)
    return getattr(owner, attr, originals.MISSING)


def _name(owner) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", type(owner).__name__)
