"""Worker entry points of ``fpa reproduce``: one training run, or one evaluation of one trained
model. Module-level functions of picklable arguments returning JSON-able dicts (fpa.experiments.pool)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from fpa.experiments.presets import ReproducePreset

VAL_PART, TEST_PART = "first", "second"  # halves of the held-out split: tuning, reporting

_T = TypeVar("_T")


def train_stage(cfg_dict: dict) -> dict:
    """Train one run from its TrainConfig as a dict: the training summary plus the answer-loss
    learning curve read from its metrics."""
    from fpa.train import TrainConfig, train

    summary = train(TrainConfig(**cfg_dict))
    curve = []
    metrics = Path(summary["metrics"])
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            rec = json.loads(line)
            if "task_loss" in rec:
                curve.append({"step": rec["step"], "task_loss": rec["task_loss"], "val_loss": rec.get("val_loss")})
    return {**summary, "task_loss_curve": curve}


def load_model(model_dir: str | Path, device: str):
    """(FPAForCausalLM in eval mode on ``device`` if available, its tokenizer) from a saved folder."""
    import torch
    from transformers.utils import logging as hf_logging

    from fpa.data import load_tokenizer
    from fpa.models import FPAForCausalLM

    hf_logging.disable_progress_bar()  # one bar per stage would drown the run's own progress
    dev = "cuda" if device == "cuda" and torch.cuda.is_available() else "cpu"
    model = FPAForCausalLM.from_pretrained(model_dir)
    model = model.to(dev).eval()  # type: ignore[arg-type]  # transformers' @wraps(Module.to) stub keeps self
    return model, load_tokenizer(model_dir)


def _rule(attention: str, tau: float):
    from fpa.cache import FoXEviction, FPAEviction

    return (FPAEviction if attention == "fpa" else FoXEviction)(threshold=float(tau))


def _required(value: _T | None, name: str, kind: str) -> _T:
    if value is None:
        raise ValueError(f"{name} is required for kind {kind!r}")
    return value


def _lengths(p: ReproducePreset) -> list[int]:
    return [p.train_len * m for m in p.passkey_multiples]


def _grid(model, tok, p: ReproducePreset, seed: int, make_cache=None) -> dict:
    from fpa.eval.passkey import passkey_grid

    g = passkey_grid(
        model,
        tok,
        _lengths(p),
        p.depths,
        p.trials,
        seed=seed,
        make_cache=make_cache,
        chunk_size=p.chunk_size,
        batch_size=p.eval_batch_size,
        progress=False,
    )
    g.pop("examples", None)
    return g


def eval_stage(
    kind: str, p_dict: dict, model_dir: str, data_dir: str, attention: str | None = None, tau: float | None = None
) -> dict:
    """One evaluation of one trained model.

    - "loss": held-out loss on the reporting half of the held-out split.
    - "passkey": the full-cache passkey grid on the reporting prompts.
    - "validation": held-out loss on the tuning half and the full-cache grid on validation prompts.
    - "sweep": the own rule (``attention``'s) at every tau of the preset, on validation prompts.
    - "evict": the own rule at ``tau`` on the reporting prompts, then a window keeping, per length,
      the rule's average number of keys.
    - "growth": kept keys against context length on held-out text, own rule at ``tau``.
    """
    from fpa.cache import FPACache

    p = ReproducePreset.from_dict(p_dict)
    model, tok = load_model(Path(model_dir), p.device)
    if kind == "loss":
        from fpa.eval.loss import heldout_loss

        return heldout_loss(model, data_dir, p.train_len, p.loss_multiple, p.loss_windows, False, part=TEST_PART)
    if kind == "passkey":
        return _grid(model, tok, p, p.prompt_seed)
    if kind == "validation":
        from fpa.eval.loss import heldout_loss

        loss = heldout_loss(model, data_dir, p.train_len, p.loss_multiple, p.loss_windows, False, part=VAL_PART)
        loss.pop("curve")
        return {"loss": loss, "passkey": _grid(model, tok, p, p.validation_prompt_seed)}
    if kind == "sweep":
        own = _required(attention, "attention", kind)
        points = []
        for t in p.cache_thresholds:
            g = _grid(model, tok, p, p.validation_prompt_seed, lambda n, t=t: (FPACache(r := _rule(own, t)), r))
            points.append(
                {
                    "tau": t,
                    "accuracy_by_length": g["accuracy_by_length"],
                    "kept_by_length": [sum(row) / len(row) for row in g["kept_fraction"]],
                }
            )
        return {"points": points}
    if kind == "evict":
        from fpa.cache import SlidingWindow

        own, own_tau = _required(attention, "attention", kind), _required(tau, "tau", kind)
        rule = _grid(model, tok, p, p.prompt_seed, lambda n: (FPACache(r := _rule(own, own_tau)), r))
        kept = [sum(row) / len(row) for row in rule["kept_fraction"]]
        budgets = {n: max(1, round(k * n)) for n, k in zip(_lengths(p), kept)}
        window = _grid(model, tok, p, p.prompt_seed, lambda n: (FPACache(w := SlidingWindow(budgets[n])), w))
        return {"tau": tau, "rule": rule, "window": window, "window_budgets": budgets}
    if kind == "growth":
        import torch

        from fpa.data import TokenShards
        from fpa.eval.growth import kept_keys_growth

        own, own_tau = _required(attention, "attention", kind), _required(tau, "tau", kind)
        val = TokenShards(data_dir, "val")
        n = max(p.growth_lengths)
        start = int(0.5 * len(val))  # the reporting half
        if len(val) - start < n:
            raise ValueError(f"the reporting half of the val split has {len(val) - start} tokens, fewer than {n}")
        ids = torch.from_numpy(val[start : start + n].astype("int64"))[None]
        return kept_keys_growth(
            model, ids, lambda: (FPACache(r := _rule(own, own_tau)), r), p.growth_lengths, p.chunk_size
        )
    raise ValueError(f"kind must be loss, passkey, validation, sweep, evict or growth, got {kind!r}")
