"""Config follows the thread (option config_follows_thread, torch >= 2.12,
where torch's config is per thread, config.py): a new thread starts with its
starter's config (``THREADS``), and a backward node on an autograd worker runs
with the config of the thread whose backward it is (``WORKERS``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .. import _core
from ..machinery.changes import Outcome
from ..machinery.wrapped import Swap, Wrapped
from .options import Option
from .shared_bodies import DYNAMO

if TYPE_CHECKING:  # for annotations only: no import at run time
    from .facts import TorchFacts


def _config_lost_by_threads(facts: TorchFacts) -> tuple[Outcome, str] | None:
    if not facts.config_per_thread:
        return Outcome.NOT_NEEDED, "config process-wide"
    if facts.python_inherits_context:
        return Outcome.NOT_NEEDED, "Python inherits context"
    return None


def _config(name: str) -> Callable[[], Any]:
    def get() -> Any:
        from . import config
        return getattr(config, name)
    return get


# On an autograd worker (a device's thread, or the pool that takes over deep
# reentrant backward) a backward node runs for the thread whose graph task it
# is; with config per thread (torch >= 2.12) the node runs with that thread's
# overrides, read from the Context its record notes.  Under dynamo (never
# expected here) the original is inlined as it was.
WORKER_CONFIG = """\
    if {ns}.is_dynamo_compiling():
        return {ns}.inner({call})
    context = {ns}.carried_context()
    if context is None:
        return {ns}.inner({call})
    return {ns}.run_with_config_of(context, {ns}.inner, {call})
"""

# A thread's record is published (with its Context noted) when it starts a
# backward, so that graph task carries it into autograd workers: also for
# threads started before install(), and at no cost to Thread.start().
PUBLISH_BEFORE_BACKWARD = """\
    if not {ns}.is_dynamo_compiling():
        {ns}.publish_record()
    return {ns}.inner({call})
"""

# Config follows the thread (config.py): Thread.start() hands the new thread
# its starter's context; the new thread takes the torch config entries from it
# first thing in _bootstrap, before start() returns; install_config_module
# registers every config module converted after install().
THREAD_START = """\
    self.__dict__[{ns}.ATTR] = {ns}.copy_context()
    return {ns}.inner({call})
"""
THREAD_BOOTSTRAP = """\
    {ns}.enter_thread(self)
    return {ns}.inner({call})
"""
REGISTER_CONFIG_MODULE = """\
    result = {ns}.inner({call})
    {ns}.register(module)
    return result
"""

WORKERS: tuple[Wrapped, ...] = (
    Wrapped("config in autograd workers",
            (Swap("torch.autograd.function.BackwardCFunction.apply", WORKER_CONFIG,
                  (DYNAMO, ("carried_context", lambda: _core._carried_context),
                   ("run_with_config_of", _config("run_with_config_of")))),),
            _config_lost_by_threads, option=Option.CONFIG_FOLLOWS_THREAD),
    Wrapped("record before backward",
            (Swap("torch.autograd.graph._engine_run_backward", PUBLISH_BEFORE_BACKWARD,
                  (DYNAMO, ("publish_record", lambda: _core._publish_record))),),
            _config_lost_by_threads, option=Option.CONFIG_FOLLOWS_THREAD, carries_context=True),
)

THREADS: tuple[Wrapped, ...] = (
    Wrapped("config follows thread",
            (Swap("threading.Thread.start", THREAD_START,
                  (("ATTR", _config("THREAD_ATTR")), ("copy_context", _config("copy_context"))),
                  params=("self",)),
             Swap("threading.Thread._bootstrap", THREAD_BOOTSTRAP,
                  (("enter_thread", _config("enter_thread")),), params=("self",)),
             Swap("torch.utils._config_module.install_config_module", REGISTER_CONFIG_MODULE,
                  (("register", _config("register")),), params=("module",))),
            _config_lost_by_threads, option=Option.CONFIG_FOLLOWS_THREAD,
            # config modules converted before the hook is in: found by one scan
            up_front=lambda: _config("rescan_later")()()),
)
