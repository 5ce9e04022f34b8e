"""Memory-mapped token shards: ``{split}-{k:05d}.bin`` raw arrays described by ``meta.json``.

``meta.json`` (written last, atomically, by ``prepare_corpus``) lists for each split its shards
with their token count and sha256, plus the dtype (uint16 when the vocabulary fits, else uint32).
``TokenShards`` checks sizes on open (truncation) and, with ``verify=True`` (the default),
the sha256 of every shard (corruption), so a damaged shard fails with a ValueError naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

META = "meta.json"
SPLITS = ("train", "val")
SHARD_TOKENS = 1 << 26


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The shard dtype of a vocabulary: uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def sha256_file(path: Path) -> str:
    """The hex sha256 digest of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class ShardWriter:
    """Appends token arrays to ``{split}-{k:05d}.bin`` files of at most ``shard_tokens`` tokens.

    Shards are written under a temporary name and renamed by ``close()``, which returns their
    descriptions for meta.json: ``[{"file", "tokens", "sha256"}, ...]``.
    """

    def __init__(self, out_dir: Path, split: str, dtype: np.dtype, shard_tokens: int = SHARD_TOKENS):
        self.out_dir, self.split, self.dtype, self.shard_tokens = Path(out_dir), split, np.dtype(dtype), shard_tokens
        self.done: list[dict] = []
        self._f: BinaryIO | None = None
        self._name = ""
        self._n = 0

    def _open(self) -> BinaryIO:
        name = f"{self.split}-{len(self.done):05d}.bin"
        f = open(self.out_dir / (name + ".tmp"), "wb")
        self._f, self._name, self._n = f, name, 0
        return f

    def _finish(self) -> None:
        f = self._f
        if f is None:
            raise RuntimeError("ShardWriter has no open shard to finish")
        f.flush()
        os.fsync(f.fileno())
        f.close()
        tmp = self.out_dir / (self._name + ".tmp")
        os.replace(tmp, self.out_dir / self._name)
        self.done.append({"file": self._name, "tokens": self._n, "sha256": sha256_file(self.out_dir / self._name)})
        self._f = None

    def write(self, tokens: np.ndarray) -> None:
        """tokens: (n,) integer array; values must fit in the dtype."""
        tokens = np.asarray(tokens).astype(self.dtype, copy=False)
        while tokens.size:
            f = self._open() if self._f is None else self._f
            take = min(tokens.size, self.shard_tokens - self._n)
            f.write(tokens[:take].tobytes())
            self._n += take
            tokens = tokens[take:]
            if self._n == self.shard_tokens:
                self._finish()

    def close(self) -> list[dict]:
        """Finish the open shard, if any, and return the descriptions of every shard written."""
        if self._f is not None:
            self._finish()
        return self.done

    def abort(self) -> None:
        """Delete every shard this writer wrote (finished or not): a failed preparation leaves none."""
        if self._f is not None:
            self._f.close()
            (self.out_dir / (self._name + ".tmp")).unlink(missing_ok=True)
            self._f = None
        for shard in self.done:
            (self.out_dir / shard["file"]).unlink(missing_ok=True)
        self.done = []


def read_meta(data_dir: str | Path) -> dict:
    """The parsed ``meta.json`` of a prepared data folder.

    Raises:
        ValueError: If the folder has no ``meta.json`` or it is unreadable or lacks its fields.
    """
    path = Path(data_dir) / META
    if not path.is_file():
        raise ValueError(
            f"data_dir must be a folder prepared by prepare_corpus (no {META} in {data_dir}; "
            "an interrupted preparation leaves none)"
        )
    try:
        meta = json.loads(path.read_text())
        meta["splits"], meta["dtype"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is corrupt: {e}") from None
    return meta


class TokenShards:
    """The token stream of one split: ``len()`` in tokens, ``shards[a:b]`` -> (b - a,) int64 array.

    Slices may cross shard boundaries; steps other than 1 are not supported. ``verify`` checks
    every shard's sha256 against meta.json on open (one read of the data).
    """

    def __init__(self, data_dir: str | Path, split: str, verify: bool = True):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.data_dir = Path(data_dir)
        meta = read_meta(self.data_dir)
        self.meta, self.split = meta, split
        self.vocab_size = int(meta["vocab_size"])
        dtype = np.dtype(meta["dtype"])
        self._maps: list[np.memmap] = []
        for shard in meta["splits"][split]:
            path = self.data_dir / shard["file"]
            if not path.is_file():
                raise ValueError(f"shard {path} is missing")
            expected = shard["tokens"] * dtype.itemsize
            if path.stat().st_size != expected:
                raise ValueError(
                    f"shard {path} is truncated or corrupt: {path.stat().st_size} bytes, meta.json expects {expected}"
                )
            if verify and sha256_file(path) != shard["sha256"]:
                raise ValueError(f"shard {path} is corrupt: its sha256 does not match meta.json")
            if shard["tokens"]:
                self._maps.append(np.memmap(path, dtype=dtype, mode="r"))
        self._starts = np.cumsum([0] + [m.size for m in self._maps])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index) -> np.ndarray:
        if not isinstance(index, slice):
            raise ValueError(f"index must be a slice a:b, got {type(index).__name__}")
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError(f"slice step must be 1, got {step}")
        out = np.empty(max(stop - start, 0), dtype=np.int64)
        pos = start
        while pos < stop:
            k = int(np.searchsorted(self._starts, pos, side="right")) - 1
            local = pos - self._starts[k]
            take = min(stop - pos, self._maps[k].size - local)
            out[pos - start : pos - start + take] = self._maps[k][local : local + take]
            pos += take
        return out
