"""install() compiles backward graphs with the forward (removes the shared-GPU deadlock)."""
import threading

import torch._functorch.config as fconfig
from guarded import needs

import fxguard

NAME = "force_non_lazy_backward_lowering"
pytestmark = needs(f"torch._functorch.config.{NAME}")  # torch >= 2.10


def seen_from_new_thread():
    seen = []
    t = threading.Thread(target=lambda: seen.append(getattr(fconfig, NAME)))
    t.start()
    t.join()
    return seen[0]


def test_install_sets_it_for_every_thread_and_uninstall_restores_exactly():
    entry = fconfig._config[NAME]
    before = (entry.default, getattr(fconfig, NAME), seen_from_new_thread())
    fxguard.install()
    assert getattr(fconfig, NAME) is True and seen_from_new_thread() is True
    fxguard.uninstall()
    assert (entry.default, getattr(fconfig, NAME), seen_from_new_thread()) == before


def test_opt_out_leaves_it_alone():
    before = getattr(fconfig, NAME)
    s = fxguard.install(eager_backward=False)
    assert getattr(fconfig, NAME) == before
    assert {r["what"]: r["patched"] for r in s["patch_points"]}["eager backward"] is False


def test_an_explicit_user_setting_still_wins():
    with fconfig.patch(NAME, False):  # (monkeypatch would delattr, which hides a torch config)
        fxguard.install()
        assert getattr(fconfig, NAME) is False
