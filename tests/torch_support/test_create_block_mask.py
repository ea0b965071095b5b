"""torch's eager create_block_mask takes fxguard.block_mask_lock after install() (CPU)."""
import threading

import pytest
import torch
from guarded import finish
from torch.nn.attention.flex_attention import create_block_mask as alias_taken_before_install

import fxguard

SEQ = 256


def causal(b, h, q, kv):
    return q >= kv


def doc_causal(lengths):
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def mask(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)
    return mask


def dense(block_mask):
    return block_mask.to_dense()


def test_threads_get_identical_masks_and_every_call_is_counted():
    fxguard.install()
    lengths = [[64, 192], [128, 128], [32, 96, 128], [256]]
    expected = [dense(torch.nn.attention.flex_attention.create_block_mask(
        doc_causal(l), 1, 1, SEQ, SEQ, device="cpu")) for l in lengths]
    fxguard.block_mask_lock.reset_stats()
    threads, per_thread, results, errors = 6, 5, {}, []

    def work(i):
        try:
            for j in range(per_thread):
                k = (i + j) % len(lengths)
                bm = torch.nn.attention.flex_attention.create_block_mask(
                    doc_causal(lengths[k]), 1, 1, SEQ, SEQ, device="cpu")
                results[(i, j)] = (k, dense(bm))
        except Exception as e:
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    finish(*ts, timeout=120)
    assert errors == []
    assert len(results) == threads * per_thread
    assert all(torch.equal(d, expected[k]) for k, d in results.values())
    assert fxguard.block_mask_lock.stats()["acquisitions"] == threads * per_thread


def test_alias_taken_before_install_takes_the_lock():
    fxguard.install()
    fxguard.block_mask_lock.reset_stats()
    alias_taken_before_install(causal, 1, 1, SEQ, SEQ, device="cpu")
    assert fxguard.block_mask_lock.stats()["acquisitions"] == 1


def test_opt_out_leaves_create_block_mask_alone():
    code = alias_taken_before_install.__code__
    fxguard.install(block_mask_lock=False)
    assert alias_taken_before_install.__code__ is code
    fxguard.block_mask_lock.reset_stats()
    alias_taken_before_install(causal, 1, 1, SEQ, SEQ, device="cpu")
    assert fxguard.block_mask_lock.stats()["acquisitions"] == 0


@pytest.mark.slow
def test_fullgraph_compile_calling_create_block_mask_has_no_graph_break():
    fxguard.install()
    from torch.nn.attention.flex_attention import create_block_mask

    def build(x):
        bm = create_block_mask(causal, 1, 1, SEQ, SEQ, device="cpu")
        return x + bm.kv_num_blocks.sum()

    torch._dynamo.reset()
    explain = torch._dynamo.explain(build)(torch.zeros(1))
    assert explain.graph_break_count == 0
    fxguard.block_mask_lock.reset_stats()
    out = torch.compile(build, backend="eager", fullgraph=True)(torch.zeros(1))
    assert out.item() == build(torch.zeros(1)).item()


def test_fxguard_create_block_mask_has_torchs_signature_and_doc():
    import inspect
    stock = torch.nn.attention.flex_attention.create_block_mask
    assert inspect.signature(fxguard.create_block_mask) == inspect.signature(stock)
    assert stock.__doc__ in fxguard.create_block_mask.__doc__
    assert fxguard.create_block_mask.__name__ == "create_block_mask"
    assert "create_block_mask" in dir(fxguard)


@pytest.mark.slow
def test_positional_compile_is_not_held_under_the_lock():
    """_compile=True compiles on a new shape: never under block_mask_lock, also
    when passed by position (torch's own signature says where)."""
    import inspect
    names = list(inspect.signature(fxguard.create_block_mask).parameters)
    args = [causal, 1, 1, SEQ, SEQ, "cpu", 128, True][:names.index("_compile") + 1]
    fxguard.block_mask_lock.reset_stats()
    fxguard.create_block_mask(*args)
    assert fxguard.block_mask_lock.stats()["acquisitions"] == 0


@pytest.mark.parametrize("installed", [False, True])
def test_fxguard_create_block_mask_is_a_drop_in(installed):
    if installed:
        fxguard.install()
    stock = torch.nn.attention.flex_attention.create_block_mask
    fxguard.block_mask_lock.reset_stats()
    ours = fxguard.create_block_mask(causal, 1, 1, SEQ, SEQ, device="cpu")
    assert torch.equal(dense(ours), dense(stock(causal, 1, 1, SEQ, SEQ, device="cpu")))
    assert fxguard.block_mask_lock.stats()["acquisitions"] >= 1
    with pytest.raises(Exception) as theirs:
        stock(causal, 1, 1, SEQ, SEQ, device="cpu", BLOCK_SIZE=0)
    with pytest.raises(type(theirs.value), match=str(theirs.value)[:40]):
        fxguard.create_block_mask(causal, 1, 1, SEQ, SEQ, device="cpu", BLOCK_SIZE=0)
    assert not fxguard.block_mask_lock.locked()
