"""machinery.import_watch, torch-free: a package of its own in tmp_path."""
import importlib
import sys
import threading

import pytest

from fxguard.machinery import import_watch

PACKAGE = "fxw_pkg"


@pytest.fixture
def package(tmp_path, monkeypatch):
    """fxw_pkg: outer imports wanted, wanted imports inner; each notes that it ran."""
    root = tmp_path / PACKAGE
    root.mkdir()
    (root / "__init__.py").write_text("RAN = []\n")
    (root / "outer.py").write_text("from fxw_pkg import RAN\nRAN.append('outer')\n"
                                   "import fxw_pkg.wanted\nRAN.append('outer done')\n")
    (root / "wanted.py").write_text("from fxw_pkg import RAN\nRAN.append('wanted')\n"
                                    "import fxw_pkg.inner\n")
    (root / "inner.py").write_text("from fxw_pkg import RAN\nRAN.append('inner')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    pkg = importlib.import_module(PACKAGE)
    yield pkg
    for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def test_no_imports_refuses_a_module_before_it_runs_in_this_thread_only(package):
    other = {}

    def import_elsewhere():
        other["module"] = importlib.import_module(f"{PACKAGE}.inner")

    with import_watch.no_imports(PACKAGE):
        with pytest.raises(import_watch.ModuleWaiting) as waiting:
            importlib.import_module(f"{PACKAGE}.wanted")
        assert waiting.value.module == f"{PACKAGE}.wanted" and package.RAN == []
        with pytest.raises(ModuleNotFoundError):  # no such module: as without the guard
            importlib.import_module(f"{PACKAGE}.nothing")
        thread = threading.Thread(target=import_elsewhere)
        thread.start()
        thread.join()
        assert other["module"].__name__ == f"{PACKAGE}.inner"
        assert importlib.import_module(f"{PACKAGE}.inner") is other["module"]  # imported: served
    assert importlib.import_module(f"{PACKAGE}.wanted")  # after the block: imports as usual
    assert not any(isinstance(f, import_watch._NoImports) for f in sys.meta_path)  # and it left
    assert package.RAN == ["inner", "wanted"]


def test_module_waiting_passes_a_planners_except_exception():
    try:
        try:
            raise import_watch.ModuleWaiting("x")
        except Exception:  # noqa: BLE001  (what a planner might write)
            pytest.fail("ModuleWaiting was caught as an Exception")
    except import_watch.ModuleWaiting:
        pass


def test_watcher_calls_back_inside_the_outermost_import_once_it_ran_whole(package):
    calls = []

    def ready():
        outer = sys.modules[f"{PACKAGE}.outer"]
        calls.append((list(package.RAN), outer.__spec__._initializing))
        watcher.wanted = set()

    watcher = import_watch.Watcher(PACKAGE, ready)
    watcher.wanted = {f"{PACKAGE}.wanted"}
    watcher.start()
    try:
        importlib.import_module(f"{PACKAGE}.outer")
    finally:
        watcher.stop()
    # After every module ran (outer's last line too), before outer's import returned.
    assert calls == [(["outer", "wanted", "inner", "outer done"], True)]
    loaders = [sys.modules[f"{PACKAGE}.{n}"].__spec__.loader for n in ("outer", "wanted", "inner")]
    assert all("exec_module" not in vars(loader) for loader in loaders)  # as they were
    assert watcher not in sys.meta_path


def test_watcher_ignores_modules_nobody_waits_for(package):
    calls = []
    watcher = import_watch.Watcher(PACKAGE, lambda: calls.append(1))
    watcher.wanted = {f"{PACKAGE}.elsewhere"}
    watcher.start()
    try:
        importlib.import_module(f"{PACKAGE}.outer")
    finally:
        watcher.stop()
    assert calls == [] and not watcher.settled()


def test_settled_reports_an_arrival_once(package):
    watcher = import_watch.Watcher(PACKAGE, lambda: None)
    watcher.wanted = {f"{PACKAGE}.inner"}
    watcher.start()
    try:
        importlib.import_module(f"{PACKAGE}.inner")
    finally:
        watcher.stop()
    assert watcher.settled() and not watcher.settled()


def test_a_failed_import_calls_nothing_back(package, tmp_path):
    (tmp_path / PACKAGE / "broken.py").write_text("raise ValueError('broken')\n")
    importlib.invalidate_caches()
    calls = []
    watcher = import_watch.Watcher(PACKAGE, lambda: calls.append(1))
    watcher.wanted = {f"{PACKAGE}.broken"}
    watcher.start()
    try:
        with pytest.raises(ValueError, match="broken"):
            importlib.import_module(f"{PACKAGE}.broken")
    finally:
        watcher.stop()
    assert calls == [] and not watcher.settled()


def test_watcher_reports_a_reload_of_a_patched_module_after_it_ran(package):
    """importlib.reload runs a module's source again over what was changed in
    it: the watcher calls back after the module ran, for modules in patched."""
    inner = importlib.import_module(f"{PACKAGE}.inner")
    seen = []
    watcher = import_watch.Watcher(PACKAGE, lambda: None,
                                   lambda name: seen.append((name, list(package.RAN))))
    watcher.patched = {f"{PACKAGE}.inner"}
    watcher.start()
    try:
        importlib.reload(inner)
        importlib.import_module(f"{PACKAGE}.wanted")  # a first import: not a reload
    finally:
        watcher.stop()
    assert seen == [(f"{PACKAGE}.inner", ["inner", "inner"])]
