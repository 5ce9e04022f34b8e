"""prepare_corpus: documents -> tokenizer -> train/val token shards + meta.json."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from fpa.checks import check_number, non_negative_int, positive_int
from fpa.data.atomic import atomic_write_text
from fpa.data.shards import META, ShardWriter, dtype_for_vocab
from fpa.data.sources import Document, iter_documents
from fpa.data.tokenizer import TOKENIZER_KINDS, BPETokenizer, ByteTokenizer

DEFAULT_BPE_VOCAB = 8192
ENCODE_BATCH = 256  # documents encoded per call (BPE encodes a batch on all cores)
BPE_SAMPLE_BYTES = 1 << 30  # BPE is trained on (at most) the first GiB of the train documents


def capped(docs: Iterator[Document], max_bytes: int | None) -> Iterator[Document]:
    """Stop once ``max_bytes`` UTF-8 bytes of text were yielded (the last document is cut)."""
    if max_bytes is None:
        yield from docs
        return
    left = max_bytes
    for doc in docs:
        if left <= 0:
            return
        data = doc.text.encode("utf-8", "surrogatepass")
        if len(data) > left:
            doc = Document(doc.name, data[:left].decode("utf-8", "ignore"))
        left -= len(data)
        yield doc


def batched(items: Iterable, n: int) -> Iterator[list]:
    """Consecutive lists of ``n`` items (the last may be shorter)."""
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def is_val(index: int, val_fraction: float, phase: float) -> bool:
    """Document ``index`` is held out when the running count of index * val_fraction ticks over:
    exactly round(n * val_fraction) of n documents, spread evenly, offset by ``phase`` in [0, 1)."""
    if val_fraction <= 0:
        return False
    return math.floor((index + 1) * val_fraction + phase) > math.floor(index * val_fraction + phase)


def _check_args(tokenizer: str, vocab_size, val_fraction, max_bytes, seed) -> None:
    if tokenizer not in TOKENIZER_KINDS:
        raise ValueError(f"tokenizer must be one of {TOKENIZER_KINDS}, got {tokenizer!r}")
    if tokenizer == "byte" and vocab_size not in (None, ByteTokenizer.vocab_size):
        raise ValueError(f"vocab_size must be None for the byte tokenizer (it is fixed at 257), got {vocab_size!r}")
    check_number("val_fraction", val_fraction, low=0, high=1, high_open=True)
    if max_bytes is not None:
        positive_int("max_bytes", max_bytes, "or None")
    non_negative_int("seed", seed)


def prepare_corpus(
    source,
    out_dir: str | Path,
    tokenizer: str = "byte",
    vocab_size: int | None = None,
    val_fraction: float = 0.05,
    seed: int = 0,
    max_bytes: int | None = None,
    overwrite: bool = False,
    bpe_sample_bytes: int = BPE_SAMPLE_BYTES,
) -> Path:
    """Tokenize ``source`` (see fpa.data.sources) into ``out_dir``; returns ``out_dir``.

    Documents are split train/val by document (file, jsonl line, dataset row or 64 KB chunk of a
    big file): exactly a ``val_fraction`` share of them, evenly spread with a seed-chosen phase.
    Each document's tokens are followed by ``eos_id``. BPE (``vocab_size`` default 8192) is trained
    on the first ``bpe_sample_bytes`` of the train documents, then the whole corpus is encoded.
    If ``out_dir`` already holds a preparation with the same arguments it is reused; different
    arguments raise unless ``overwrite``.
    """
    _check_args(tokenizer, vocab_size, val_fraction, max_bytes, seed)
    out = Path(out_dir)
    args = {
        "source": [str(s) for s in source] if isinstance(source, (list, tuple)) else str(source),
        "tokenizer": tokenizer,
        "vocab_size": vocab_size,
        "val_fraction": val_fraction,
        "seed": seed,
        "max_bytes": max_bytes,
    }
    if (out / META).is_file() and not overwrite:
        try:
            old = json.loads((out / META).read_text()).get("args")
        except (ValueError, AttributeError) as e:  # not JSON, or not an object
            raise ValueError(
                f"out_dir {out} holds a corrupt {META} ({e}); pass overwrite=True (--overwrite) to prepare it again"
            ) from None
        if old == args:
            return out
        raise ValueError(
            f"out_dir {out} already holds a corpus prepared with {old}; pass overwrite=True "
            f"or another out_dir to prepare {args}"
        )
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    (out / META).unlink(missing_ok=True)
    writers: dict[str, ShardWriter] = {}
    try:
        tok, n_docs, splits = _write_shards(
            source, out, tokenizer, vocab_size, val_fraction, seed, max_bytes, bpe_sample_bytes, writers
        )
        tok.save(out)
    except BaseException:
        # a failed preparation leaves nothing behind: no shards, and no folder if it made it
        for w in writers.values():
            w.abort()
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    meta = {
        "format": 1,
        "args": args,
        "tokenizer": tok.kind,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "dtype": dtype_for_vocab(tok.vocab_size).name,
        "documents": n_docs,
        "tokens": {s: sum(x["tokens"] for x in v) for s, v in splits.items()},
        "splits": splits,
    }
    atomic_write_text(out / META, json.dumps(meta, indent=1) + "\n")
    return out


def _write_shards(
    source,
    out: Path,
    tokenizer: str,
    vocab_size,
    val_fraction: float,
    seed: int,
    max_bytes,
    bpe_sample_bytes: int,
    writers: dict,
) -> tuple:
    """Tokenize into out's shards; fills ``writers`` (so the caller can abort them) and returns
    (tokenizer, documents per split, shard descriptions per split)."""
    phase = int.from_bytes(hashlib.blake2b(str(seed).encode(), digest_size=8).digest(), "little") / 2**64
    docs = lambda: capped(iter_documents(source), max_bytes)  # noqa: E731
    tok: ByteTokenizer | BPETokenizer
    if tokenizer == "byte":
        tok = ByteTokenizer()
    else:
        train_docs = (d for i, d in enumerate(docs()) if not is_val(i, val_fraction, phase))
        tok = BPETokenizer.train(
            (d.text for d in capped(train_docs, bpe_sample_bytes)), vocab_size or DEFAULT_BPE_VOCAB
        )
    dtype = dtype_for_vocab(tok.vocab_size)
    writers.update({s: ShardWriter(out, s, dtype) for s in ("train", "val")})
    n_docs = {"train": 0, "val": 0}
    for batch in batched(enumerate(docs()), ENCODE_BATCH):
        for (i, _), ids in zip(batch, tok.encode_batch([doc.text for _, doc in batch])):
            split = "val" if is_val(i, val_fraction, phase) else "train"
            writers[split].write(np.array(ids + [tok.eos_id], dtype=np.int64))
            n_docs[split] += 1
    splits = {s: w.close() for s, w in writers.items()}
    if n_docs["train"] == 0 or (val_fraction > 0 and n_docs["val"] == 0):
        raise ValueError(
            f"source {source!r} gave {n_docs['train']} train and {n_docs['val']} val documents; "
            f"need at least one of each (more text, or a larger val_fraction)"
        )
    return tok, n_docs, splits
