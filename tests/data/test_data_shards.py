import json

import numpy as np
import pytest

from fpa.data import TokenShards, prepare_corpus, read_meta
from fpa.data.shards import ShardWriter, dtype_for_vocab


def _write(tmp_path, arrays, shard_tokens, vocab=257):
    dtype = dtype_for_vocab(vocab)
    w = ShardWriter(tmp_path, "train", dtype, shard_tokens=shard_tokens)
    for a in arrays:
        w.write(a)
    splits = {"train": w.close(), "val": []}
    (tmp_path / "meta.json").write_text(json.dumps({"splits": splits, "dtype": dtype.name, "vocab_size": vocab}))
    return np.concatenate(arrays)


@pytest.mark.parametrize("vocab", [257, 70000])
def test_shards_roundtrip_across_shard_boundaries(tmp_path, vocab):
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, vocab, size=n) for n in (5, 17, 1, 30)]
    full = _write(tmp_path, arrays, shard_tokens=7, vocab=vocab)
    s = TokenShards(tmp_path, "train")
    assert len(s) == full.size == 53
    assert len(read_meta(tmp_path)["splits"]["train"]) == 8  # ceil(53 / 7)
    assert (tmp_path / "train-00000.bin").stat().st_size == 7 * (2 if vocab <= 65535 else 4)
    for a, b in [(0, 53), (3, 12), (6, 8), (49, 53), (10, 10), (0, 1)]:
        got = s[a:b]
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, full[a:b])


def test_truncated_and_corrupt_and_missing_shards(tmp_path):
    _write(tmp_path, [np.arange(20)], shard_tokens=8)
    shard = tmp_path / "train-00001.bin"
    data = shard.read_bytes()
    shard.write_bytes(data[:-2])
    with pytest.raises(ValueError, match="train-00001.bin is truncated"):
        TokenShards(tmp_path, "train")
    shard.write_bytes(data[:-2] + b"\x01\x01")
    with pytest.raises(ValueError, match="train-00001.bin is corrupt"):
        TokenShards(tmp_path, "train")
    shard.unlink()
    with pytest.raises(ValueError, match="missing"):
        TokenShards(tmp_path, "train")


def test_bad_arguments_and_unprepared_folder(tmp_path):
    with pytest.raises(ValueError, match="prepared by prepare_corpus"):
        TokenShards(tmp_path, "train")
    (tmp_path / "meta.json").write_text("{")
    with pytest.raises(ValueError, match="corrupt"):
        TokenShards(tmp_path, "train")
    with pytest.raises(ValueError, match="split must be one of"):
        TokenShards(tmp_path, "test")


def test_prepared_corpus_decodes_back_to_the_documents(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    texts = [f"document {i}: " + "ünïcode ✓ " * i for i in range(40)]
    for i, t in enumerate(texts):
        (docs / f"{i:02d}.txt").write_text(t)
    out = prepare_corpus(docs, tmp_path / "prep", val_fraction=0.1)
    meta = read_meta(out)
    assert meta["documents"] == {"train": 36, "val": 4}
    from fpa.data import load_tokenizer

    tok = load_tokenizer(out)
    got = []
    for split in ("train", "val"):
        s = TokenShards(out, split)
        ids = s[0 : len(s)].tolist()
        assert ids[-1] == tok.eos_id
        got += tok.decode([i if i != tok.eos_id else ord("\x1e") for i in ids]).split("\x1e")[:-1]
    assert sorted(got) == sorted(texts)  # every document exactly once, in one split or the other
