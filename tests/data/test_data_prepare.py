import json

import pytest

from fpa.data import TokenShards, load_tokenizer, prepare_corpus, read_meta
from fpa.data.prepare import is_val
from fpa.data.sources import iter_documents, stdlib_files


def test_stdlib_corpus_split_by_file(tmp_path):
    out = prepare_corpus("stdlib", tmp_path, max_bytes=400_000, val_fraction=0.25)
    meta = read_meta(out)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 257
    assert meta["documents"]["val"] > 0 and meta["documents"]["train"] > meta["documents"]["val"]
    assert 390_000 < sum(meta["tokens"].values()) <= 400_000 + sum(meta["documents"].values())
    # by file: the val stream's first document is one whole stdlib file
    tok, val = load_tokenizer(out), TokenShards(out, "val")
    ids = val[0 : len(val)].tolist()
    first = tok.decode(ids[: ids.index(tok.eos_id)])
    assert any(p.read_bytes() == first.encode() for p in stdlib_files()[:1000])
    assert len(stdlib_files()) > 500  # the embedded corpus is really there


def test_reuse_same_args_and_refuse_different(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("hello world\n" * 20000)  # 240 KB, cut into 64 KB documents
    out = prepare_corpus(src, tmp_path / "p", val_fraction=0.25)
    stamp = (out / "meta.json").stat().st_mtime_ns
    assert prepare_corpus(src, tmp_path / "p", val_fraction=0.25) == out
    assert (out / "meta.json").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="overwrite=True"):
        prepare_corpus(src, tmp_path / "p", val_fraction=0.5)
    prepare_corpus(src, tmp_path / "p", val_fraction=0.5, overwrite=True)


def test_sources_jsonl_glob_list(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": f"row {i}"}) for i in range(3)) + "\n")
    (tmp_path / "b.txt").write_text("plain")
    docs = list(iter_documents([str(tmp_path / "*.jsonl"), tmp_path / "b.txt"]))
    assert [d.text for d in docs] == ["row 0", "row 1", "row 2", "plain"]
    (tmp_path / "bad.jsonl").write_text('{"body": 1}\n')
    with pytest.raises(ValueError, match="'text' field"):
        list(iter_documents(tmp_path / "bad.jsonl"))


def test_val_assignment_is_exact_fraction():
    for f in (0.05, 0.1, 0.3):
        assert sum(is_val(i, f, 0.37) for i in range(1000)) == round(1000 * f)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tokenizer="wordpiece"), "tokenizer must be one of"),
        (dict(vocab_size=500), "vocab_size must be None for the byte"),
        (dict(val_fraction=1.5), "val_fraction"),
        (dict(max_bytes=0), "max_bytes"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        prepare_corpus("stdlib", tmp_path, **kwargs)


def test_bad_sources(tmp_path):
    with pytest.raises(ValueError, match="matches nothing"):
        prepare_corpus(str(tmp_path / "nope*.txt"), tmp_path / "o")
    (tmp_path / "one.txt").write_text("tiny")
    with pytest.raises(ValueError, match="need at least one of each"):
        prepare_corpus(tmp_path / "one.txt", tmp_path / "o", val_fraction=0.05, seed=1)


def test_bpe_preparation(tmp_path):
    out = prepare_corpus("stdlib", tmp_path, tokenizer="bpe", vocab_size=400, max_bytes=150_000, val_fraction=0.2)
    tok = load_tokenizer(out)
    assert tok.kind == "bpe" and read_meta(out)["vocab_size"] == tok.vocab_size <= 400
    s = TokenShards(out, "train")
    assert int(s[0 : len(s)].max()) < tok.vocab_size
    assert len(s) < 150_000 * 0.8  # BPE compresses


def test_hf_source_on_a_local_dataset(tmp_path):
    pytest.importorskip("datasets", reason="the 'datasets' package (extra fpa[hf]) is not installed")
    d = tmp_path / "ds"
    d.mkdir()
    (d / "train.jsonl").write_text("\n".join(json.dumps({"text": f"doc {i} " * 5}) for i in range(40)) + "\n")
    out = prepare_corpus(f"hf:{d}", tmp_path / "p", val_fraction=0.1)
    assert read_meta(out)["documents"] == {"train": 36, "val": 4}
