"""Data: corpus sources, tokenizers (byte-level, local BPE) and memory-mapped token shards."""

from fpa.data.prepare import prepare_corpus
from fpa.data.shards import TokenShards, read_meta
from fpa.data.tokenizer import BPETokenizer, ByteTokenizer, load_tokenizer

__all__ = ["BPETokenizer", "ByteTokenizer", "TokenShards", "load_tokenizer", "prepare_corpus", "read_meta"]
