"""Config follows the thread: a thread starts with a copy of its starter's torch config.

torch 2.12+ keeps config overrides in ContextVars and a threading.Thread starts
with an empty context (Python < 3.14), so stock threads read torch's defaults.
Every test restores the main thread's config: overrides are set inside
``config.patch(...)``, whose exit sets the prior values back.
"""
import contextvars
import decimal
import importlib
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch._dynamo.config as dyn
from guarded import both_ways, finish, stock_loses_config

import fxguard
from fxguard.demos import config_limit
from fxguard.machinery import originals
from fxguard.torch_support import config, facts

pytestmark = pytest.mark.skipif(not facts.config_is_per_thread(),
                                reason="torch <= 2.11 keeps config process-wide: nothing to follow")
DEFAULT_LIMIT = getattr(dyn._config.get("recompile_limit"), "default", None)  # <= 2.5: none
FAKE = "torch.testing._internal.fake_config_module"  # a real torch config module, for re-imports


def in_thread(fn, *args):
    """fn(*args) in a new threading.Thread; its result, or what it raised."""
    out, errors = [], []

    def body():
        try:
            out.append(fn(*args))
        except BaseException as e:  # re-raised here
            errors.append(e)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "thread did not finish"
    if errors:
        raise errors[0]
    return out[0]


def limit():
    return dyn.recompile_limit


# -- the scenario ------------------------------------------------------------

@both_ways(races=stock_loses_config)
def test_thread_compiles_as_many_graphs_as_its_starters_recompile_limit_allows(guard):
    before = dyn.recompile_limit
    result = config_limit.recompile_limit_in_thread(limit=20, shapes=20)
    assert dyn.recompile_limit == before  # the scenario restored the main thread's config
    assert result["graphs"] == 20, result["detail"]  # stock: 8, then uncompiled
    assert result["limit_seen"] == 20


# -- a copy taken at start() ---------------------------------------------------------

@both_ways(races=stock_loses_config)
def test_copy_at_start_later_changes_stay_in_their_thread(guard):
    started, parent_changed, child_changed = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def child():
        seen["at start"] = limit()
        started.set()
        assert parent_changed.wait(10)
        seen["after parent changed"] = limit()
        dyn.recompile_limit = 12
        seen["grandchild"] = in_thread(limit)  # inherits from its own parent
        child_changed.set()

    with dyn.patch(recompile_limit=11):
        t = threading.Thread(target=child, daemon=True)
        t.start()
        try:
            assert started.wait(10)
            dyn.recompile_limit = 13
        finally:
            parent_changed.set()
        assert child_changed.wait(10)
        seen["parent"] = limit()
        seen["sibling"] = in_thread(limit)
        finish(t, timeout=10)
    assert seen == {"at start": 11, "after parent changed": 11, "grandchild": 12,
                    "parent": 13, "sibling": 13}
    assert limit() == DEFAULT_LIMIT


@both_ways(races=stock_loses_config)
def test_thread_subclasses_inherit(guard):
    class OwnRun(threading.Thread):
        def run(self):
            self.seen = limit()

    class OwnStart(OwnRun):
        def start(self):
            self.started_here = True
            super().start()

    with dyn.patch(recompile_limit=11):
        threads = [OwnRun(daemon=True), OwnStart(daemon=True)]
        for t in threads:
            t.start()
            finish(t, timeout=10)
    assert [t.seen for t in threads] == [11, 11]


def test_threads_started_before_install_keep_what_they_had():
    go, done = threading.Event(), threading.Event()
    seen = {}

    def early(own):
        if own:
            dyn.recompile_limit = 17
        assert go.wait(10)
        seen[own] = limit()
        if own:
            seen["its child"] = in_thread(limit)
        done.set()

    early_threads = [threading.Thread(target=early, args=(own,), daemon=True) for own in (True, False)]
    with dyn.patch(recompile_limit=11):
        for t in early_threads:
            t.start()
        try:
            fxguard.install()
        finally:
            go.set()
        finish(*early_threads, timeout=10)
    assert seen == {True: 17, "its child": 17, False: DEFAULT_LIMIT}


def test_only_torch_config_contextvars_are_copied():
    fxguard.install()
    mine = contextvars.ContextVar("user_var", default="default")

    def child():
        names = [var.name for var in contextvars.copy_context()]
        foreign = [v for v in contextvars.copy_context() if v not in config._vars]
        return names, foreign, mine.get(), decimal.getcontext().prec, limit()

    mine.set("main")
    saved = decimal.getcontext().prec
    decimal.getcontext().prec = 5
    try:
        with dyn.patch(recompile_limit=11):  # also a ConfigPatch ContextVar in main's context
            main_vars = list(contextvars.copy_context())
            names, foreign, user, prec, seen = in_thread(child)
    finally:
        decimal.getcontext().prec = saved
    assert any(v not in config._vars for v in main_vars)  # main has other vars to leave out
    assert seen == 11 and "recompile_limit" in names
    assert foreign == [], [v.name for v in foreign]  # no caches, no ConfigPatch stack, no user vars
    assert user == "default" and prec == 28


def test_containers_are_copied_per_thread():
    fxguard.install()
    fake = importlib.import_module(FAKE)
    with fake.patch(e_list=[1, 2], e_dict={"a": [1]}):
        def mutate():
            fake.e_list.append(3)
            fake.e_dict["a"].append(2)
            return fake.e_list, fake.e_dict
        assert in_thread(mutate) == ([1, 2, 3], {"a": [1, 2]})
        assert (fake.e_list, fake.e_dict) == ([1, 2], {"a": [1]})


def test_config_module_imported_after_install_is_registered_by_torch_itself():
    fxguard.install()
    in_thread(limit)  # the one scan after install() is done: only the hook can register now
    assert not config._scan_needed
    old = sys.modules.pop(FAKE, None)
    try:
        fresh = importlib.import_module(FAKE)  # install_config_module converts it again
        assert fresh is not old
        assert fresh._config["e_int"].user_override in config._vars
        with fresh.patch(e_int=42):
            assert in_thread(lambda: fresh.e_int) == 42
    finally:
        if old is not None:
            sys.modules[FAKE] = old


# -- thread pools ---------------------------------------------------------------------

@both_ways(races=stock_loses_config)
def test_pool_worker_inherits_from_the_thread_whose_submit_started_it(guard):
    with ThreadPoolExecutor(max_workers=1) as pool:
        with dyn.patch(recompile_limit=11):
            first = pool.submit(limit).result(10)  # this submit() starts the worker
        later = pool.submit(limit).result(10)      # same worker, started under 11
    assert (first, later) == (11, 11)


@pytest.mark.parametrize("installed", [False, True])
def test_snapshot_as_executor_initializer(installed):
    if installed:
        fxguard.install()
    with dyn.patch(recompile_limit=11):
        snap = fxguard.config_snapshot()
    assert snap.overrides()["torch._dynamo.config.recompile_limit"] == 11
    with ThreadPoolExecutor(max_workers=2, initializer=snap.apply) as pool:
        seen = [f.result(10) for f in [pool.submit(limit) for _ in range(4)]]
    assert seen == [11] * 4 and limit() == DEFAULT_LIMIT


def test_snapshot_run_applies_for_one_task_and_restores_the_worker():
    with dyn.patch(recompile_limit=11):
        base = fxguard.config_snapshot()
    with dyn.patch(recompile_limit=14, capture_scalar_outputs=True):
        task = fxguard.config_snapshot()
    empty = in_thread(fxguard.config_snapshot)  # a thread with no overrides
    assert len(empty) == 0
    with ThreadPoolExecutor(max_workers=1, initializer=base.apply) as pool:
        got = [pool.submit(task.run, limit).result(10),
               pool.submit(task.run, lambda: dyn.capture_scalar_outputs).result(10),
               pool.submit(limit).result(10),
               pool.submit(lambda: dyn.capture_scalar_outputs).result(10),
               pool.submit(empty.run, limit).result(10),  # apply() clears what a snapshot lacks
               pool.submit(limit).result(10)]
    assert got == [14, True, 11, False, DEFAULT_LIMIT, 11]


def test_apply_refreshes_torchs_per_thread_config_caches():
    with dyn.patch(capture_scalar_outputs=True):
        snap = fxguard.config_snapshot()
        main_hash = dyn.get_hash()

    import inspect
    # torch 2.13 caches the read-only form (2.12 has no readonly_values)
    cached = {"readonly_values": True} if "readonly_values" in \
        inspect.signature(dyn._get_dict).parameters else {}

    def worker():
        before = dyn.get_hash()  # fills this thread's hash cache with the defaults' hash
        dyn._get_dict(**cached)
        snap.apply()
        return before, dyn.get_hash(), dyn._get_dict(**cached)["capture_scalar_outputs"]

    before, after, in_dict = in_thread(worker)
    assert before != main_hash and after == main_hash and in_dict is True


def test_each_worker_gets_its_own_copy_of_container_values():
    fake = importlib.import_module(FAKE)
    with fake.patch(e_list=[1]):
        snap = fxguard.config_snapshot()
    barrier = threading.Barrier(2)

    def task():
        snap.apply()
        barrier.wait(10)
        fake.e_list.append(threading.get_ident())
        barrier.wait(10)
        return len(fake.e_list)

    with ThreadPoolExecutor(max_workers=2) as pool:
        assert [f.result(10) for f in [pool.submit(task), pool.submit(task)]] == [2, 2]
    assert snap.overrides()[f"{FAKE}.e_list"] == [1]


# -- install, status, uninstall ---------------------------------------------------------

def threading_state():
    """Everything in threading and torch install() may touch, by identity."""
    import torch.utils._config_module as cm
    fns = (threading.Thread.start, threading.Thread._bootstrap, cm.install_config_module)
    return {"thread_dict": dict(vars(threading.Thread)), "threading": dict(vars(threading)),
            "config_module": dict(vars(cm)), "code": [(f, f.__code__) for f in fns]}


def same(a, b):
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def test_uninstall_restores_threading_exactly():
    before = threading_state()
    fxguard.install()
    during = threading_state()
    assert same(during["thread_dict"], before["thread_dict"])  # same function objects...
    assert all(c is not c0 for (_, c), (_, c0) in zip(during["code"], before["code"]))  # ...new code
    from fxguard.machinery.codegen import namespace_name
    assert namespace_name(threading.Thread.start) in during["threading"]
    fxguard.uninstall()
    after = threading_state()
    for key in ("thread_dict", "threading", "config_module"):
        assert same(after[key], before[key]), key
    assert all(f is f0 and c is c0 for (f, c), (f0, c0) in zip(after["code"], before["code"]))
    with dyn.patch(recompile_limit=11):
        assert in_thread(limit) == (DEFAULT_LIMIT if stock_loses_config() else 11)


def row(status):
    return next(r for r in status["patch_points"] if r["what"] == "config follows thread")


def test_status_outcomes(monkeypatch):
    plain = threading.Thread.start.__code__
    if stock_loses_config():  # torch 2.12+ on Python < 3.14 (or 3.14 without inheritance)
        r = row(fxguard.install())
        assert r["outcome"] == "patched" and r["patched"] and threading.Thread.start.__code__ is not plain
        fxguard.uninstall()

    assert row(fxguard.install(config_follows_thread=False))["outcome"] == "option off"
    assert threading.Thread.start.__code__ is plain
    fxguard.uninstall()

    monkeypatch.setattr(facts, "python_inherits_context", lambda: True)
    assert row(fxguard.install())["outcome"] == "not needed"  # Python inherits context
    assert threading.Thread.start.__code__ is plain
    fxguard.uninstall()
    monkeypatch.undo()

    monkeypatch.setattr(facts, "config_is_per_thread", lambda: False)
    r = row(fxguard.install())
    assert r["outcome"] == "not needed" and not r["patched"]  # config process-wide
    assert threading.Thread.start.__code__ is plain and not originals.is_object_patched(threading)


def test_doctor_reports_the_row():
    from fxguard import doctor
    status = fxguard.install()
    text = " ".join(doctor.report([], status, 0.0, verbose=True).split())
    assert "config follows thread" in text
    assert row(status)["reason"] in text  # shows the reason: doctor's text is what users read
