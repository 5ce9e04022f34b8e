"""The paged store (fpa.cache.store.storage): order and values through eviction and compaction, the
memory bound, block reuse over long runs."""

import torch

from fpa.cache.store.storage import PAD_BIG, PagedStore


def _fields(B, Hkv, groups, T, D=3, start=0):
    pos = torch.arange(start, start + T, dtype=torch.int32).expand(B, Hkv, T)
    return dict(
        k=torch.randn(B, Hkv, T, D),
        v=torch.randn(B, Hkv, T, D),
        pos=pos,
        level=torch.randn(B, Hkv * groups, T),
        pm=torch.randn(B, Hkv * groups, T),
    )


def _store(B=2, Hkv=2, groups=2, C=5, D=3, **kw):
    st = PagedStore(groups, **kw)
    st.append(**_fields(B, Hkv, groups, C, D))
    return st


def _dense(st):
    return {n: st[n].clone() for n in ("k", "v", "pos", "valid", "level", "pm")}


def _keep_dense(st, keep):
    """A (B, Hkv, C) keep mask (store[...] order) in pool layout."""
    return st.from_dense(keep)


def _host_copies_agree(st):
    """The host copies of fill and nblk (what appends size themselves by) equal the device ones."""
    assert st.fill_host == st.fill.tolist() and st.nblk_host == st.nblk.tolist()


def test_evict_then_compact_keeps_order_values_and_frees_blocks():
    torch.manual_seed(0)
    st = _store(C=40, block_size=4, slack=0.0)  # compact every row with >= 4 holes
    before = _dense(st)
    keep = torch.rand(2, 2, 40) > 0.5
    keep[0, 0, :36] = True  # row (0, 0) keeps 36 + some: < 4 holes, not compacted
    keep[1, 1] = False
    keep[1, 1, 7] = True
    blocks = st.num_blocks - st.free.numel()
    st.evict(_keep_dense(st, keep))
    assert torch.equal(st.counts(), keep.sum(-1))
    for b in range(2):
        for g in range(2):
            idx = keep[b, g].nonzero().flatten()
            live = st["valid"][b, g]
            assert torch.equal(st["k"][b, g][live], before["k"][b, g, idx])
            assert torch.equal(st["pos"][b, g][live], before["pos"][b, g, idx])
            for h in (2 * g, 2 * g + 1):
                assert torch.equal(st["level"][b, h][live], before["level"][b, h, idx])
                assert torch.equal(st["pm"][b, h][live], before["pm"][b, h, idx])
                assert (st["level"][b, h][~live] == PAD_BIG).all() and (st["pm"][b, h][~live] == -PAD_BIG).all()
            if (b, g) != (0, 0):  # compacted: kept slots first, fill = count
                n = len(idx)
                assert live[:n].all() and int(st.fill[2 * b + g]) == n
    assert int(st.fill[0]) == 40  # below the hole threshold: holes stay in place
    assert st.num_blocks - st.free.numel() < blocks  # emptied blocks went back to the free list
    assert int(st.nblk[3]) == 1  # one key left: one block
    _host_copies_agree(st)


def test_append_after_compaction_puts_new_keys_last_and_reuses_blocks():
    st = _store(C=8, block_size=4, slack=0.0)
    keep = torch.zeros(2, 2, 8, dtype=torch.bool)
    keep[..., 6:] = True
    st.evict(_keep_dense(st, keep))
    assert (st.fill == 2).all() and (st.nblk == 1).all()
    n_before = st.num_blocks
    for p in (9, 10):
        st.append(**_fields(2, 2, 2, 1, start=p))
    assert st["pos"][0, 0].tolist() == [6, 7, 9, 10] and st.num_blocks == n_before
    _host_copies_agree(st)


def test_evicted_slots_are_reclaimed_once_a_block_of_tokens_was_appended():
    """evict marks holes at once; the compaction that frees blocks waits until P tokens were
    appended since the last one (so that decode steps read nothing from the device), or reclaim()."""
    st = _store(C=8, block_size=4, slack=0.0)
    st.evict(st.from_dense(st["pos"] >= 0))  # 8 tokens appended: reclaims (nothing to compact)
    assert st.tokens_since_reclaim == 0
    for t in (8, 9):
        st.append(**_fields(2, 2, 2, 1, start=t))
        st.evict(st.from_dense(st["pos"] >= t - 1))  # keep the last 2: 6 holes, not reclaimed yet
        assert (st.counts() == 2).all() and st.fill_host == [t + 1] * 4 and st.tokens_since_reclaim == t - 7
    held = st.bytes_held()
    st.reclaim()
    assert st.fill_host == [2] * 4 and st.nblk_host == [1] * 4 and st["pos"][0, 0].tolist() == [8, 9]
    assert st.bytes_held() <= held and st.num_blocks - st.free.numel() == 4
    for t in (10, 11, 12, 13):
        st.append(**_fields(2, 2, 2, 1, start=t))
        st.evict(st.from_dense(st["pos"] >= t - 1))
    assert st.tokens_since_reclaim == 0 and st.fill_host == [2] * 4  # the 4th append reclaimed
    _host_copies_agree(st)


def test_memory_bound_with_very_uneven_rows():
    """One row keeps everything, the others one key: held <= 1.15 x live + the fixed allowance,
    where the padded layout would hold R x the busiest row."""
    torch.manual_seed(1)
    B, Hkv, G, D = 2, 4, 2, 16
    st = PagedStore(G, block_size=16)
    for t in range(0, 2000, 50):
        st.append(**_fields(B, Hkv, G, 50, D, start=t))
        keep = torch.zeros(B, Hkv, int(st.fill.max()), dtype=torch.bool)
        keep[0, 0] = True
        keep[:, :, :] |= st["pos"] >= t + 49  # every row keeps its newest key
        st.evict(_keep_dense(st, keep & st["valid"]))
        live, held = st.bytes_live(), st.bytes_held()
        assert held <= 1.15 * live + st.overhead_bound(), (t, held, live, st.overhead_bound())
        _host_copies_agree(st)
    padded = B * Hkv * int(st.counts().max()) * st.slot_bytes()
    assert padded > 1.15 * st.bytes_live() + st.overhead_bound()  # the old layout fails this bound
    assert int(st.counts()[0, 0]) == 2000 and int(st.counts()[1, 1]) == 1


def test_no_creep_over_a_long_run():
    """A sliding window of 37 keys per row over 5000 appends of random sizes: the pool stops
    growing (freed blocks are reused) and stays within the bound."""
    torch.manual_seed(2)
    st = PagedStore(1, block_size=8)
    t, sizes = 0, []
    for _ in range(400):
        n = int(torch.randint(1, 25, ()))
        st.append(**_fields(3, 2, 1, n, 4, start=t))
        t += n
        st.evict(st.from_dense(st["pos"] >= t - 37))
        assert (st.counts() == min(t, 37)).all()
        assert st.bytes_held() <= 1.15 * st.bytes_live() + st.overhead_bound()
        sizes.append(st.num_blocks)
        _host_copies_agree(st)
    assert max(sizes[200:]) <= max(sizes[:200])  # no growth in the second half
    assert st.table.shape[1] <= 2 * int(st.nblk.max()) + 2


def test_truncate_and_select_rows():
    st = _store(C=20, block_size=4)
    before = _dense(st)
    st.truncate(9)
    assert (st.fill == 9).all() and (st.nblk == 3).all()
    assert torch.equal(st["k"], before["k"][:, :, :9])
    _host_copies_agree(st)
    st.select_rows(torch.tensor([1, 1, 0]))
    assert torch.equal(st["k"], before["k"][[1, 1, 0], :, :9])
    assert torch.equal(st["pm"], before["pm"][[1, 1, 0], :, :9])
    _host_copies_agree(st)


def test_bad_block_size():
    import pytest

    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="block_size"):
            PagedStore(1, block_size=bad)
