import pytest

from fpa.data import BPETokenizer, ByteTokenizer, load_tokenizer

SAMPLES = ["", "hello world\n", "naïve café — ✓ 日本語 🎉", "tabs\tand\r\nCRLF", "\x00\x7f", "a\ud800b"]


@pytest.mark.parametrize("text", SAMPLES)
def test_byte_roundtrip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text


def test_byte_ids_are_utf8_bytes_and_eos_is_dropped():
    tok = ByteTokenizer()
    assert tok.encode("é") == [0xC3, 0xA9]
    assert tok.decode([104, tok.eos_id, 105]) == "hi"
    assert tok.decode([0xFF, 104]) == "\ufffdh"  # invalid UTF-8 from a model sample: replaced, no crash
    with pytest.raises(ValueError, match="text must be a str"):
        tok.encode(b"bytes")


def test_bpe_train_roundtrip_save_load(tmp_path):
    corpus = ["def add(a, b):\n    return a + b\n"] * 50 + ["class Foo:\n    pass\n"] * 50
    tok = BPETokenizer.train(iter(corpus), vocab_size=300)
    assert tok.vocab_size <= 300
    for text in SAMPLES[:-1] + corpus[:1]:  # lone surrogates are not valid Unicode for the Rust library
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(corpus[0])) < len(corpus[0].encode())  # it learned merges
    tok.save(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again.kind == "bpe" and again.eos_id == tok.eos_id
    assert again.encode(corpus[1]) == tok.encode(corpus[1])


def test_bpe_bad_vocab_and_missing_or_corrupt_files(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        BPETokenizer.train(iter(["x"]), vocab_size=100)
    with pytest.raises(ValueError, match="fpa_tokenizer.json"):
        load_tokenizer(tmp_path)
    BPETokenizer.train(iter(["abc abc abd"] * 10), vocab_size=270).save(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{ not json")
    with pytest.raises(ValueError, match="missing or corrupt"):
        load_tokenizer(tmp_path)
