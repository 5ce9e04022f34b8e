"""Passkey retrieval under kvpress presses (NVIDIA's KV-cache compression library) as baselines.

The softmax-RoPE model is exported to transformers' own ``LlamaForCausalLM``
(fpa.models.export_llama, same weights, same logits), so kvpress's presses apply unchanged:
each prompt but its last token is prefilled inside ``with press(model):`` (the press compresses
every layer's cache to ``1 - compression_ratio`` of the keys), then the last token and the answer
are decoded greedily with their true positions (as kvpress's own pipeline does).

kvpress is an optional extra (``pip install -e '.[kvpress]'``); it pins transformers < 5.3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from fpa.checks import check_number, positive_int
from fpa.compat import CACHE_ARG
from fpa.eval.passkey import cell_prompts
from fpa.tasks.passkey import is_correct, max_answer_tokens

PRESSES = ("knorm", "snapkv", "streaming_llm", "expected_attention", "tova")


class KvpressUnavailable(RuntimeError):
    """kvpress cannot run here (not installed, or incompatible with the installed transformers)."""


def _kvpress():
    try:
        import kvpress
    except Exception as e:  # ImportError, or kvpress failing on this transformers version
        import transformers

        raise KvpressUnavailable(
            f"kvpress cannot be imported ({type(e).__name__}: {e}); install the extra with "
            f"pip install -e '.[kvpress]' (kvpress pins transformers<5.3; installed transformers "
            f"{transformers.__version__})"
        ) from e
    if CACHE_ARG != "past_key_values":
        import transformers

        raise KvpressUnavailable(
            f"kvpress cannot run on transformers {transformers.__version__}: "
            "its forward hooks read the attention call's kwargs['past_key_values'], which transformers >= 5.3 "
            "renamed 'cache' (measured: KeyError: 'past_key_values' in kvpress/presses/base_press.py with "
            "transformers 5.24); use an environment with pip install -e '.[kvpress]' (transformers<5.3)"
        )
    return kvpress


def make_press(name: str, compression_ratio: float):
    """A kvpress press from its short name (one of PRESSES) at ``compression_ratio`` (fraction of
    keys removed, in [0, 1))."""
    check_number("compression_ratio", compression_ratio, low=0, high=1, high_open=True)
    kv = _kvpress()
    classes = {
        "knorm": "KnormPress",
        "snapkv": "SnapKVPress",
        "streaming_llm": "StreamingLLMPress",
        "expected_attention": "ExpectedAttentionPress",
        "tova": "TOVAPress",
    }
    if name not in classes:
        raise ValueError(f"press must be one of {PRESSES}, got {name!r}")
    return getattr(kv, classes[name])(compression_ratio=float(compression_ratio))


@torch.no_grad()
def _decode(llama, ids: torch.Tensor, press, n_new: int) -> tuple[list[int], float]:
    """Greedy answer of one prompt ids (1, T) -> (new ids, kept fraction of the compressed cache)."""
    from transformers import DynamicCache

    T = ids.shape[1]
    cache = DynamicCache()
    if press is None:
        llama(ids[:, :-1], **{CACHE_ARG: cache}, use_cache=True)
    else:
        with press(llama):
            llama(ids[:, :-1], **{CACHE_ARG: cache}, use_cache=True)
    kept = cache.get_seq_length() / (T - 1)
    tok, new = ids[:, -1:], []
    for i in range(n_new):
        pos = torch.tensor([[T - 1 + i]], device=ids.device)
        out = llama(tok, **{CACHE_ARG: cache}, position_ids=pos, cache_position=pos[0], use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        new.append(int(tok))
    return new, kept


def kvpress_passkey_grid(
    model_dir_or_model,
    tokenizer,
    lengths: Sequence[int],
    depths: Sequence[float],
    trials: int,
    compression_ratios: Sequence[float],
    presses: Sequence[str] = ("knorm", "snapkv", "streaming_llm"),
    seed: int = 0,
) -> dict:
    """Exact-match passkey accuracy for every (press, compression ratio), on the same prompts as
    fpa.eval.passkey.passkey_grid (same seed -> same prompts and keys).

    ``model_dir_or_model``: a softmax_rope FPAForCausalLM or its folder. Returns
    {"lengths", "depths", "trials", "compression_ratios", "presses", "grids": [one dict per
    (press, ratio), shaped like passkey_grid's output ("correct", "accuracy", "accuracy_by_length",
    "kept_fraction" (achieved: cache keys / prompt keys), "kept_fraction_mean", "examples") plus
    "press" and "compression_ratio"]}. Raises KvpressUnavailable (with the reason) if kvpress
    cannot run here.
    """
    from fpa.models.export_llama import to_llama

    positive_int("trials", trials)
    if not lengths or not depths or not compression_ratios or not presses:
        raise ValueError("lengths, depths, compression_ratios and presses must be non-empty")
    built = {(p, r): make_press(p, r) for p in presses for r in compression_ratios}  # checks kvpress first
    src = model_dir_or_model
    llama = to_llama(str(src) if isinstance(src, Path) else src)
    n_new = max_answer_tokens(tokenizer)
    grids = []
    for (name, ratio), press in built.items():
        correct = np.zeros((len(lengths), len(depths)), dtype=np.int64)
        kept = np.ones((len(lengths), len(depths)))
        examples = []
        for i, length in enumerate(lengths):
            for j, depth in enumerate(depths):
                ks = []
                for k, p in enumerate(cell_prompts(tokenizer, int(length), float(depth), j, trials, seed)):
                    ids = torch.as_tensor(np.asarray(p.ids), dtype=torch.long, device=llama.device)[None]
                    new, frac = _decode(llama, ids, press, n_new)
                    text = tokenizer.decode(new)
                    correct[i, j] += is_correct(text, p.key)
                    ks.append(frac)
                    if j == 0 and k == 0:
                        examples.append({"length": int(length), "key": p.key, "generated": text})
                kept[i, j] = float(np.mean(ks))
        acc = correct / trials
        grids.append(
            {
                "press": name,
                "compression_ratio": float(ratio),
                "lengths": [int(x) for x in lengths],
                "depths": [float(d) for d in depths],
                "trials": trials,
                "correct": correct.tolist(),
                "accuracy": acc.tolist(),
                "accuracy_by_length": acc.mean(1).tolist(),
                "kept_fraction": kept.tolist(),
                "kept_fraction_mean": float(kept.mean()) if kept.size else math.nan,
                "examples": examples,
            }
        )
    return {
        "lengths": [int(x) for x in lengths],
        "depths": [float(d) for d in depths],
        "trials": trials,
        "compression_ratios": [float(r) for r in compression_ratios],
        "presses": list(presses),
        "grids": grids,
    }
