import torch

from fpa.cache.storage import PAD_BIG, HeadStore


def _store(B=2, Hkv=2, groups=2, C=5, D=3, **kw):
    st = HeadStore(groups, **kw)
    pos = torch.arange(C, dtype=torch.int32).expand(B, Hkv, C)
    st.append(k=torch.randn(B, Hkv, C, D), v=torch.randn(B, Hkv, C, D), pos=pos,
              level=torch.randn(B, Hkv * groups, C), pm=torch.randn(B, Hkv * groups, C))
    return st


def _fields(st):
    return {n: st[n].clone() for n in ("k", "v", "pos", "valid", "level", "pm")}


def test_evict_then_compact_keeps_order_values_and_frees_memory():
    torch.manual_seed(0)
    st = _store(min_slack=0, slack=0.0)  # compact on any common padding
    before = _fields(st)
    keep = torch.rand(2, 2, 5) > 0.5
    keep[0, 0, :4] = True
    keep[1, 1] = False
    keep[..., -1] = False  # the last slot is free in every head
    st.evict(keep)
    n = keep.sum(-1)
    assert torch.equal(st.counts(), n)
    assert st.capacity == int(n.max()) == 4
    for b in range(2):
        for g in range(2):
            idx = keep[b, g].nonzero().flatten()
            m = len(idx)
            assert torch.equal(st["k"][b, g, :m], before["k"][b, g, idx])
            assert torch.equal(st["pos"][b, g, :m], before["pos"][b, g, idx])
            assert not st["valid"][b, g, m:].any() and (st["pos"][b, g, m:] == -1).all()
            for h in (2 * g, 2 * g + 1):
                assert torch.equal(st["level"][b, h, :m], before["level"][b, h, idx])
                assert torch.equal(st["pm"][b, h, :m], before["pm"][b, h, idx])
                assert (st["level"][b, h, m:] == PAD_BIG).all() and (st["pm"][b, h, m:] == -PAD_BIG).all()
    full = _store()
    per_slot = full.bytes_held() / 5
    full.compact()
    assert full.bytes_held() == 5 * per_slot
    keep = torch.zeros(2, 2, 5, dtype=torch.bool)
    keep[..., 4] = True
    HeadStore.evict(full, keep)
    full.compact()
    assert full.capacity == 1 and full.bytes_held() == per_slot


def test_lazy_compaction_pads_in_place_until_the_slack():
    st = _store(C=40, min_slack=8, slack=0.5)
    keep = torch.ones(2, 2, 40, dtype=torch.bool)
    keep[..., :10] = False  # 10 < max(8, 0.5 * 40): padded in place, not compacted
    st.evict(keep)
    assert st.capacity == 40 and (st.counts() == 30).all()
    assert (st["level"][..., :10] == PAD_BIG).all() and (st["pm"][..., :10] == -PAD_BIG).all()
    keep[..., :25] = False  # now 25 >= 20: compacted
    st.evict(keep)
    assert st.capacity == 15 and torch.equal(st["pos"][0, 0], torch.arange(25, 40, dtype=torch.int32))


def test_append_grows_with_reserve_and_after_compaction_puts_new_keys_last():
    st = _store(C=4, min_slack=0, slack=0.0, growth=1.0)
    st.evict(torch.tensor([[[1, 0, 1, 0], [0, 0, 0, 1]]] * 2, dtype=torch.bool))
    assert st.capacity == 2
    for p in (9, 10):
        st.append(k=torch.zeros(2, 2, 1, 3), v=torch.zeros(2, 2, 1, 3), pos=torch.full((2, 2, 1), p, dtype=torch.int32),
                  level=torch.zeros(2, 4, 1), pm=torch.zeros(2, 4, 1))
    assert st["pos"][0, 0].tolist() == [0, 2, 9, 10] and st["pos"][0, 1].tolist() == [3, -1, 9, 10]
    assert st["valid"][0, 1].tolist() == [True, False, True, True]
    assert st._buf["k"].shape[2] == 5  # 2 + 1 + growth * 2 reserved on the first append, reused by the second
