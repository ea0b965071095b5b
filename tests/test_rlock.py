"""fxguard.RLock as a drop-in for threading.RLock: garbage collection, weak references,
argument checking, threading.Condition, interrupts while waiting, fork, thread exit.

Torch-free (the autouse fixtures of conftest.py import torch; nothing here uses it).
Every wait is bounded; no test takes more than a few seconds.
"""
import gc
import importlib.util
import threading
import weakref

import pytest

import fxguard
import fxguard._core as core


@pytest.fixture
def lock():
    return fxguard.RLock()


# -- garbage collection and weak references -------------------------------------------


def fresh_core_module():
    """fxguard._core imported again as a new module object (multi-phase init makes one
    per import), with its own RLock type and block_mask_lock."""
    spec = importlib.util.spec_from_file_location("fxguard._core", core.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module is not core and module.RLock is not core.RLock
    return module


def test_traverse_visits_the_type(lock):
    assert gc.is_tracked(lock)
    assert type(lock) in gc.get_referents(lock)


def test_second_module_object_is_collected_with_its_locks():
    module = fresh_core_module()
    alive = weakref.ref(module)
    outside = module.RLock()  # a lock from it, held from outside
    with outside:
        assert outside._is_owned()
    with module.block_mask_lock:
        pass
    del module
    gc.collect()
    assert alive() is not None  # the lock keeps its type, and the type its module
    with outside:
        pass
    del outside
    gc.collect()
    assert alive() is None  # module <-> type <-> block_mask_lock: a cycle gc can see now


def test_weak_references():
    lock = fxguard.RLock()  # no fixture: the test must own the only reference
    assert type(lock).__weakrefoffset__ != 0
    ref = weakref.ref(lock)
    registry = weakref.WeakSet([lock])
    assert ref() is lock and len(registry) == 1
    del lock
    assert ref() is None and len(registry) == 0
