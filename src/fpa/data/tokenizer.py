"""Tokenizers: byte-level (the default, no training, no download) and BPE trained locally.

Every tokenizer has ``encode(str) -> list[int]``, ``decode(list[int]) -> str``, ``vocab_size``,
``eos_id`` (the document separator written between documents in the shards) and ``save(dir)``.
``load_tokenizer(dir)`` reads back whatever ``save`` wrote (``fpa_tokenizer.json``, plus
``tokenizer.json`` for BPE), so a prepared data folder and a trained model folder both load.
``save_hf_tokenizer(tok, dir)`` also writes the standard ``tokenizer.json`` +
``tokenizer_config.json`` that ``transformers.AutoTokenizer.from_pretrained(dir)`` loads, with the
same ids as ``tok.encode`` (pad = eos, left padding, for batched generation).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from fpa.checks import positive_int
from fpa.data.atomic import atomic_write_text

TOKENIZER_META = "fpa_tokenizer.json"
BPE_FILE = "tokenizer.json"
EOS_TOKEN = "<|endoftext|>"
TOKENIZER_KINDS = ("byte", "bpe")


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, and ``eos_id`` = 256 (vocab_size 257).

    ``decode(encode(x)) == x`` for every Python str, lone surrogates included (they are encoded
    with ``surrogatepass``). Decoding ids that are not valid UTF-8 (e.g. sampled from a model)
    replaces the bad bytes with U+FFFD; the eos id decodes to nothing.
    """

    kind = "byte"
    vocab_size = 257
    eos_id = 256
    bos_id = None

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids (lone surrogates encoded with ``surrogatepass``).

        Raises:
            ValueError: If ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return list(text.encode("utf-8", "surrogatepass"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``[encode(t) for t in texts]``."""
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: the eos id is dropped, invalid UTF-8 becomes U+FFFD."""
        data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        try:
            return data.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return data.decode("utf-8", "replace")

    def save(self, directory: str | Path) -> None:
        """Write ``fpa_tokenizer.json`` into ``directory`` for ``load_tokenizer``."""
        atomic_write_text(Path(directory) / TOKENIZER_META, json.dumps({"kind": self.kind}) + "\n")


class BPETokenizer:
    """Byte-level BPE from the ``tokenizers`` library; ``eos_id`` is the id of ``<|endoftext|>``.

    Round-trips any str that is valid Unicode (no lone surrogates: the Rust library rejects them).
    """

    kind = "bpe"
    bos_id = None

    def __init__(self, tok) -> None:
        self._tok = tok
        self.vocab_size = int(tok.get_vocab_size())
        eos = tok.token_to_id(EOS_TOKEN)
        if eos is None:
            raise ValueError(f"BPE tokenizer has no {EOS_TOKEN!r} token")
        self.eos_id = int(eos)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        """Train on an iterator of documents. vocab_size must exceed the 256 byte symbols + eos."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if positive_int("vocab_size", vocab_size, "above 257 for BPE") <= 257:
            raise ValueError(f"vocab_size must be a positive int (above 257 for BPE), got {vocab_size!r}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS_TOKEN],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        """The BPE ids of ``text``, without special tokens.

        Raises:
            ValueError: If ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Like [encode(t) for t in texts], run in parallel by the Rust library."""
        for t in texts:
            if not isinstance(t, str):
                raise ValueError(f"texts must be strs, got {type(t).__name__}")
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``, with the eos id dropped."""
        return self._tok.decode([int(i) for i in ids if int(i) != self.eos_id], skip_special_tokens=False)

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` and ``fpa_tokenizer.json`` into ``directory`` for ``load_tokenizer``."""
        directory = Path(directory)
        atomic_write_text(directory / BPE_FILE, self._tok.to_str())
        atomic_write_text(directory / TOKENIZER_META, json.dumps({"kind": self.kind, "file": BPE_FILE}) + "\n")


def _bytes_to_unicode() -> dict[int, str]:
    """Byte -> printable character, the byte-level alphabet of ``tokenizers``' ByteLevel step:
    printable Latin-1 bytes map to themselves, the others to chr(256 + n) in byte order."""
    keep = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    out, n = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


def rust_tokenizer(tok: ByteTokenizer | BPETokenizer):
    """A ``tokenizers.Tokenizer`` giving the same ids as ``tok.encode`` (for valid Unicode text):
    for the byte tokenizer a byte-level model without merges whose ids are the byte values."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if isinstance(tok, BPETokenizer):
        return tok._tok
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    rt = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    rt.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    rt.decoder = decoders.ByteLevel()
    rt.add_special_tokens([AddedToken(EOS_TOKEN, special=True)])
    if rt.token_to_id(EOS_TOKEN) != tok.eos_id:
        raise RuntimeError("byte tokenizer export: eos id mismatch")
    return rt


def save_hf_tokenizer(tok: ByteTokenizer | BPETokenizer, directory: str | Path) -> None:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` (transformers' fast tokenizer) into
    ``directory``: ``AutoTokenizer.from_pretrained(directory)`` then encodes as ``tok`` does,
    with eos = pad = ``<|endoftext|>`` and padding on the left (for batched generation)."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=rust_tokenizer(tok),
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        padding_side="left",
        model_max_length=int(1e9),
    )
    hf.save_pretrained(str(directory))


def load_tokenizer(data_dir: str | Path) -> ByteTokenizer | BPETokenizer:
    """The tokenizer saved in ``data_dir`` (a prepared data folder or a trained model folder)."""
    directory = Path(data_dir)
    meta_path = directory / TOKENIZER_META
    if not meta_path.is_file():
        raise ValueError(
            f"data_dir must contain {TOKENIZER_META} (a folder written by prepare_corpus "
            f"or train); not found in {directory}"
        )
    try:
        meta = json.loads(meta_path.read_text())
        kind = meta["kind"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{meta_path} is corrupt: {e}") from None
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        from tokenizers import Tokenizer

        path = directory / meta.get("file", BPE_FILE)
        try:
            return BPETokenizer(Tokenizer.from_file(str(path)))
        except Exception as e:  # the Rust library raises its own Exception type
            raise ValueError(f"BPE tokenizer file {path} is missing or corrupt: {e}") from None
    raise ValueError(f"{meta_path}: tokenizer kind must be one of {TOKENIZER_KINDS}, got {kind!r}")
