"""install(), install() with other options and uninstall() while another thread
is inside a trace, a TorchDispatchMode or a node-meta with-block.

Before install() the globals fxguard makes per thread are process-wide: they
hold whatever another thread's trace or with-block set at that moment.  No
thread may take another's: the installing thread starts from its own state
(or the default), and so does every other thread (a mode's flags from the
thread's own mode stack).  Where that cannot be exact (a trace: torch's code,
retired by install(), sets the FX flag back in the module, never in the
thread's slot) install() refuses, naming the thread, and changes nothing, as
uninstall() does.  Afterwards every thread reads its own state, and the next
install()/uninstall() works.

Deterministic: Events hold the other thread inside until the step is done;
timeouts only end a hung test.
"""
import threading

import pytest
import torch
import torch.fx.traceback as fx_traceback
from guarded import finish, wait_until
from torch.fx._symbolic_trace import is_fx_tracing
from torch.utils._python_dispatch import TorchDispatchMode, is_in_torch_dispatch_mode

import fxguard
from fxguard import interpreter
from fxguard.machinery import originals

pytestmark = pytest.mark.skipif(not interpreter.gil_enabled(),
                                reason="other threads' frames are not walked with the GIL off")

HANG = 120  # seconds: a hang guard only
OTHER = {"compile_once": False}  # install() with other options
MOMENTS = ("install", "install-other-options", "uninstall")
KEY = "fxguard-other-thread"  # what the other thread's node meta carries


class Hold:
    """The other thread, held inside until the step in the main thread is done."""

    def __init__(self):
        self.inside, self.done, self.seen = threading.Event(), threading.Event(), {}
        self.held = False

    def __call__(self, x=None):
        if not self.held:  # a trace may run the body more than once: hold the first
            self.held = True
            self.inside.set()
            assert self.done.wait(HANG)
            self.seen["inside"] = own_state()
        return x


def own_state() -> dict:
    """What the calling thread reads of the trace state fxguard keeps per thread."""
    from torch.utils._python_dispatch import is_in_any_mode_without_ignore_compile_internals
    return {"tracing": is_fx_tracing(), "mode": is_in_torch_dispatch_mode(),
            "non-infra mode": is_in_torch_dispatch_mode(include_infra_modes=False),
            "mode not ignoring": is_in_any_mode_without_ignore_compile_internals(),
            "preserves meta": fx_traceback.has_preserved_node_meta(),
            "other's meta": KEY in fx_traceback.get_current_meta()}


DEFAULT = {"tracing": False, "mode": False, "non-infra mode": False, "mode not ignoring": False,
           "preserves meta": False, "other's meta": False}


class Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class Held(torch.nn.Module):
    def __init__(self, hold):
        super().__init__()
        self.hold = hold

    def forward(self, x):
        self.hold()
        return x + 1


def _node_with_meta():
    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    node.meta[KEY] = 1
    return node


def in_symbolic_trace(hold):
    torch.fx.symbolic_trace(Held(hold))


def in_make_fx(hold):
    from torch.fx.experimental.proxy_tensor import make_fx
    make_fx(lambda x: hold(x) * 2)(torch.ones(2))


def in_export(hold):
    torch.export.export(Held(hold), (torch.ones(2),), strict=False)


def in_mode(hold):
    with Mode():
        hold()


def in_preserve_node_meta(hold):
    with fx_traceback.preserve_node_meta():
        hold()


def in_set_current_meta(hold, node=_node_with_meta()):
    with fx_traceback.preserve_node_meta(), fx_traceback.set_current_meta(node):
        hold()


TRACES = (in_symbolic_trace, in_make_fx, in_export)
BLOCKS = (in_mode, in_preserve_node_meta, in_set_current_meta)
# What the held thread reads of its own state inside (where fxguard can give it).
INSIDE = {in_mode: {"mode": True, "non-infra mode": True, "mode not ignoring": True},
          in_preserve_node_meta: {"preserves meta": True},
          in_set_current_meta: {"preserves meta": True, "other's meta": True}}


def _other_thread(body):
    hold = Hold()

    def run():
        body(hold)
        hold.seen["after"] = own_state()
    thread = threading.Thread(target=run, name=f"held-{body.__name__}", daemon=True)
    thread.start()
    assert hold.inside.wait(HANG)
    return thread, hold


def _step(moment):
    if moment == "install":
        return fxguard.install()
    if moment == "uninstall":
        return fxguard.uninstall()
    return fxguard.install(**OTHER)


def _before(moment):
    if moment != "install":
        fxguard.install()


def _in_new_thread(fn):
    box = []
    thread = threading.Thread(target=lambda: box.append(fn()))
    thread.start()
    finish(thread, timeout=HANG)
    return box[0]


def _every_thread_reads_its_own():
    """Names that waited for the other thread's frames are settled, the main
    thread and a new one read the default, the next install() and uninstall()
    work (and leave the default)."""
    wait_until(lambda: not originals.held(), "the names held for frames to be settled")
    assert own_state() == DEFAULT
    assert _in_new_thread(own_state) == DEFAULT
    for step in (fxguard.install, lambda: fxguard.install(**OTHER), fxguard.uninstall,
                 fxguard.install):
        step()
        assert own_state() == DEFAULT
        assert _in_new_thread(own_state) == DEFAULT
    compiled = torch.compile(lambda x: x * 2, backend="eager")
    assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 2.0))
    fxguard.uninstall()
    assert own_state() == DEFAULT and originals.applied() == ()


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("body", TRACES, ids=lambda b: b.__name__)
def test_refused_while_another_thread_traces(body, moment):
    """install() (any options) and uninstall() refuse while another thread is
    inside a trace, naming it, and change nothing; once it finished they work."""
    _before(moment)
    thread, hold = _other_thread(body)  # (its trace may import modules rows wait for)
    before = (fxguard.status()["options"], originals.applied())
    try:
        with pytest.raises(RuntimeError, match=rf"inside an FX trace \(held-{body.__name__}\)"):
            _step(moment)
        assert (fxguard.status()["options"], originals.applied()) == before
        if moment != "install":  # still installed: this thread's own (stock: process-wide)
            assert own_state() == DEFAULT
    finally:
        hold.done.set()
        finish(thread, timeout=HANG)
    assert hold.seen["after"] == DEFAULT
    _step(moment)  # now it works
    _every_thread_reads_its_own()


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("body", BLOCKS, ids=lambda b: b.__name__)
def test_another_threads_with_block_stays_its_own(body, moment):
    """A thread inside a mode or a node-meta with-block over the step: the
    main thread reads its own state (the default) during and after, the other
    thread reads its own after it left (inside too where fxguard can tell
    it), and the next install()/uninstall() work."""
    _before(moment)
    thread, hold = _other_thread(body)
    try:
        _step(moment)
        assert own_state() == DEFAULT
        assert _in_new_thread(own_state) == DEFAULT
    finally:
        hold.done.set()
        finish(thread, timeout=HANG)
    assert hold.seen["after"] == DEFAULT
    if moment != "uninstall" and (moment != "install" or body is in_mode):
        # the mode's flags come from the thread's own mode stack; a with-block
        # over install() with other options kept its thread's record
        assert hold.seen["inside"] == {**DEFAULT, **INSIDE[body]}
    assert own_state() == DEFAULT
    _every_thread_reads_its_own()


def test_a_compile_beside_a_mode_another_thread_was_in_is_compiled():
    """dynamo with inline_torch_dispatch_torch_compile=False skips frames while
    the calling thread is in a mode (its flag): another thread's mode, open over
    install(), must not make this thread's compile run eager (stock: 1 graph)."""
    from torch._dynamo.testing import CompileCounter
    thread, hold = _other_thread(in_mode)
    try:
        fxguard.install()
    finally:
        hold.done.set()
        finish(thread, timeout=HANG)
    counter = CompileCounter()
    with torch._dynamo.config.patch(inline_torch_dispatch_torch_compile=False):
        torch.compile(lambda x: x.sin() + 1, backend=counter)(torch.ones(3))
    assert counter.frame_count == 1


@pytest.mark.parametrize("body", BLOCKS, ids=lambda b: b.__name__)
def test_install_with_other_options_inside_this_threads_own_block(body):
    """install() with other options keeps every thread's record, the calling
    thread's too: inside its own with-block (entered under fxguard) it reads
    the block's values on, and its own state after the block."""
    fxguard.install()
    seen = {}

    def step():  # where the other tests hold their thread: this one runs the step
        fxguard.install(**OTHER)
        seen["inside"] = own_state()
    body(step)
    assert seen["inside"] == {**DEFAULT, **INSIDE[body]}
    assert fxguard.status()["options"]["compile_once"] is False
    _every_thread_reads_its_own()
