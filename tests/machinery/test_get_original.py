"""get_original(): the one record of originals (patches.py) answers, and says
AttributeError where there was nothing, never a private sentinel."""
import types

import pytest

import fxguard
from fxguard.machinery import originals
from fxguard.machinery.changes import Change


@pytest.fixture
def owner():
    obj = types.SimpleNamespace(present="before")
    yield obj
    originals.revert_all()


def test_the_first_recorded_value_is_the_original(owner):
    originals.apply(Change("t", owner, "present", "first"))
    originals.apply(Change("t", owner, "present", "second"))
    assert fxguard.get_original(owner, "present") == "before"
    originals.revert_all()
    assert owner.present == "before"


def test_an_attribute_fxguard_added_had_no_original(owner):
    originals.apply(Change("t", owner, "added", 1))
    with pytest.raises(AttributeError, match="no attribute 'added' before fxguard"):
        fxguard.get_original(owner, "added")
    originals.revert_all()
    assert not hasattr(owner, "added")


def test_untouched_attributes_are_their_current_value_or_missing(owner):
    assert fxguard.get_original(owner, "present") == "before"
    with pytest.raises(AttributeError):
        fxguard.get_original(owner, "absent")
    with pytest.raises(TypeError):
        fxguard.get_original(owner, 1)


def test_after_install():
    from torch.fx import _symbolic_trace
    from torch.nn.attention import flex_attention as flex

    code = flex.create_block_mask.__code__
    status = fxguard.install()
    assert flex.create_block_mask.__code__ is not code
    assert fxguard.get_original(flex.create_block_mask, "__code__") is code
    from fxguard.machinery.codegen import namespace_name
    helper = namespace_name(flex.create_block_mask)
    with pytest.raises(AttributeError):
        fxguard.get_original(flex, helper)  # the namespace fxguard added
    if status["mode"] == "patched":
        assert fxguard.get_original(_symbolic_trace, "_is_fx_tracing_flag") is False
    assert "original" not in vars(vars(flex)[helper])  # one record: originals'
    mask = fxguard.create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 4, 4,
                                     device="cpu", BLOCK_SIZE=4)
    assert mask is not None and not fxguard.block_mask_lock.locked()
    fxguard.uninstall()
    assert flex.create_block_mask.__code__ is code
