"""Where an agent-session model does its ``open_arg`` lookup, and whether its rule hides it.

For a training checkpoint (``.../checkpoints/step-N.pt`` of ``fpa train`` or ``fpa agent``) or a
saved model folder, on training-shaped agent sessions (fpa.tasks.agent_sessions):

1. the answer loss per question kind (nats per byte; chance ~2.9 for ``open_arg``) with attention
   as usual and under the training eviction rule at ``--threshold``;
2. per layer and head, at the query that predicts an ``open_arg`` answer's first byte: the weight
   on the key of the argument's first byte (the open call's line), that key's FPA penalty
   beta * dip, and its content logit above the median key's.

    python scripts/agent_lookup.py runs/x/models/fpa-walk-rule-s21/checkpoints/step-00001500.pt

A lookup head puts most of its weight on the argument at a small penalty; when the penalty there
passes the threshold, the rule hides the key and the answer is lost (docs/design.md, "The switch
undoes the lookup").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from fpa.cache.store.weights import fpa_bias
from fpa.data import ByteTokenizer
from fpa.layers.first_passage import FirstPassageAttention
from fpa.models import FPAForCausalLM
from fpa.tasks.agent_sessions import KINDS, QUESTIONS, training_sample_with_answer
from fpa.train import TrainConfig
from fpa.train.model_setup import build_model, set_training_eviction

SEQ_LEN = 384  # the cpu agent preset's training length


def load(path: str) -> FPAForCausalLM:
    """The model of a training checkpoint (.pt) or of a saved model folder, in eval mode."""
    if path.endswith(".pt"):
        ck = torch.load(path, map_location="cpu", weights_only=False)
        model = build_model(TrainConfig.from_dict(ck["config"]), ByteTokenizer().vocab_size)
        model.load_state_dict(ck["model"])
    else:
        model = FPAForCausalLM.from_pretrained(Path(path))
    return model.eval()


def kind_of(text: str) -> str:
    """The question kind of a training sample's text."""
    q = text[text.rindex("q: ") :]
    return next(k for k in KINDS if q.startswith(QUESTIONS[k].split("{")[0].split("\n")[0]))


def samples(n: int, seed: int) -> list[tuple[np.ndarray, int, str]]:
    """n training-shaped samples: (ids (SEQ_LEN + 1,), answer bytes, kind)."""
    tok, out = ByteTokenizer(), []
    for i in range(n):
        ids, n_ans = training_sample_with_answer(np.random.default_rng([seed, i]), SEQ_LEN, tok)
        out.append((ids, n_ans, kind_of(bytes(ids.tolist()).decode())))
    return out


def loss_by_kind(model: FPAForCausalLM, data: list[tuple[np.ndarray, int, str]]) -> dict[str, float]:
    """Mean next-byte loss over the answer bytes, per kind."""
    x = torch.from_numpy(np.stack([d[0] for d in data]))
    with torch.no_grad():
        tl = model(input_ids=x, labels=x, return_per_token_loss=True).per_token_loss.float()
    per: dict[str, list[torch.Tensor]] = {}
    for r, (ids, n_ans, kind) in enumerate(data):
        a = len(ids) - 1 - n_ans
        per.setdefault(kind, []).append(tl[r, a - 1 : a - 1 + n_ans])
    return {k: round(float(torch.cat(per[k]).mean()), 2) for k in KINDS if k in per}


def lookup_heads(model: FPAForCausalLM, data: list[tuple[np.ndarray, int, str]]) -> None:
    """Print, per FPA layer and head, the weight, penalty and content logit at the argument."""
    rows = []
    for ids, n_ans, kind in data:
        if kind != "open_arg":
            continue
        text = bytes(ids.tolist()).decode()
        answer = text[len(ids) - 1 - n_ans : len(ids) - 1]
        tool = text[text.rindex("q: ") :].split("open ")[1].split("\n")[0]
        line = f"call {tool}({answer})"
        rows.append((ids, text.index(line) + len(f"call {tool}("), len(ids) - 2 - n_ans))
    if not rows:
        print("no open_arg sample")
        return
    x = torch.from_numpy(np.stack([r[0] for r in rows]))
    inputs: dict[int, torch.Tensor] = {}
    hooks = [
        block.attn.register_forward_pre_hook(lambda m, a, i=i: inputs.__setitem__(i, a[0]))
        for i, block in enumerate(model.model.layers)
    ]
    with torch.no_grad():
        model(input_ids=x)
        for hook in hooks:
            hook.remove()
        distance = np.median([q - a for _, a, q in rows])
        print(f"{len(rows)} open_arg samples, median distance to the argument {distance:.0f}")
        for i, block in enumerate(model.model.layers):
            attn = block.attn
            if not isinstance(attn, FirstPassageAttention):
                continue
            q, k, _ = attn.project(inputs[i])
            field, level = attn.field_level(inputs[i])
            bias = fpa_bias(field, level, field[..., :0], attn.beta)
            logits = torch.matmul(q.float(), k.float().repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2))
            logits = logits * attn.scale
            weights = torch.softmax(logits + bias, -1)
            for h in range(attn.num_heads):
                w = np.array([float(weights[b, h, qi, ai]) for b, (_, ai, qi) in enumerate(rows)])
                pen = np.array([float(-bias[b, h, qi, ai]) for b, (_, ai, qi) in enumerate(rows)])
                lift = np.array(
                    [
                        float(logits[b, h, qi, ai] - logits[b, h, qi, : qi + 1].median())
                        for b, (_, ai, qi) in enumerate(rows)
                    ]
                )
                print(
                    f"  layer {i} head {h} (beta {float(attn.beta[h]):.2f}): weight on the argument median "
                    f"{np.median(w):.3f}, penalty there median {np.median(pen):.1f} "
                    f"[{pen.min():.1f}, {pen.max():.1f}], content logit above the median key {np.median(lift):.1f}"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="training checkpoints (.pt) or saved model folders")
    ap.add_argument("--threshold", type=float, default=4.0, help="the eviction rule's threshold (default 4)")
    ap.add_argument("--samples", type=int, default=100, help="training-shaped samples (default 100)")
    ap.add_argument("--seed", type=int, default=7, help="seed of the samples (default 7)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = samples(args.samples, args.seed)
    for path in args.models:
        model = load(path)
        print(path)
        print("  answer loss, attention as usual:", loss_by_kind(model, data))
        set_training_eviction(model, args.threshold)
        print(f"  answer loss, under the rule at {args.threshold:g}:", loss_by_kind(model, data))
        set_training_eviction(model, None)
        lookup_heads(model, data)


if __name__ == "__main__":
    main()
