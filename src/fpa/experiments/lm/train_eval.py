"""Worker entry points of ``fpa reproduce``: one training run, or one evaluation of one trained
model. Module-level functions of picklable arguments returning JSON-able dicts (fpa.experiments.pool)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from fpa.experiments.lm.presets import ReproducePreset

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


def served_rule(model_dir: str | Path) -> dict | None:
    """The threshold rule a model was trained under, read from its run's training record
    (``model_dir/training.json``, written by fpa.train): {"attention", "threshold",
    "within_chunks": True}, or None for a model trained with full attention. Such a model is
    scored as trained, in every stage: its cache-free forwards apply the rule
    (``set_training_eviction``) and its caches are the rule within chunks."""
    path = Path(model_dir) / "training.json"
    if not path.is_file():
        return None
    cfg = json.loads(path.read_text())["config"]
    threshold = cfg.get("evict_threshold")
    if threshold is None:
        return None
    return {"attention": cfg["attention"], "threshold": float(threshold), "within_chunks": True}


def load_model(model_dir: str | Path, device: str):
    """(FPAForCausalLM in eval mode on ``device`` if available, its tokenizer) from a saved folder;
    a model trained under a threshold rule (``served_rule``) applies it in its cache-free forwards."""
    import torch

    from fpa.compat import hf_progress_bars
    from fpa.data import load_tokenizer
    from fpa.models import FPAForCausalLM
    from fpa.train.model_setup import set_training_eviction

    dev = "cuda" if device == "cuda" and torch.cuda.is_available() else "cpu"
    with hf_progress_bars(False):  # one bar per stage would drown the run's own progress
        model = FPAForCausalLM.from_pretrained(model_dir)
    model = model.to(dev).eval()  # type: ignore[arg-type]  # transformers' @wraps(Module.to) stub keeps self
    serve = served_rule(model_dir)
    if serve is not None:
        set_training_eviction(model, serve["threshold"])
    return model, load_tokenizer(model_dir)


def _rule(attention: str, threshold: float, within_chunks: bool = False):
    from fpa.cache import FoXEviction, FPAEviction

    return (FPAEviction if attention == "fpa" else FoXEviction)(threshold=float(threshold), within_chunks=within_chunks)


def _rule_cache(attention: str, threshold: float, within_chunks: bool = False):
    """A make_cache factory: a fresh FPACache under the threshold rule, and the rule."""
    from fpa.cache import FPACache

    def make(n: int | None = None):
        r = _rule(attention, threshold, within_chunks)
        return FPACache(r), r

    return make


def _required(value: _T | None, name: str, kind: str) -> _T:
    if value is None:
        raise ValueError(f"{name} is required for kind {kind!r}")
    return value


def _lengths(p: ReproducePreset) -> list[int]:
    return [p.train_len * m for m in p.passkey_multiples]


def _grid(model, tok, p: ReproducePreset, seed: int, make_cache=None, lengths: list[int] | None = None) -> dict:
    from fpa.eval.passkey import passkey_grid

    g = passkey_grid(
        model,
        tok,
        lengths or _lengths(p),
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


EVAL_KINDS = ("loss", "passkey", "control", "validation", "sweep", "evict", "growth")


def model_ready(model_dir: str | Path) -> bool:
    """Whether a trained model is saved in ``model_dir`` (training.json is written last)."""
    return (Path(model_dir) / "training.json").is_file()


def eval_stage(
    kind: str, p_dict: dict, model_dir: str, data_dir: str, attention: str | None = None, threshold: float | None = None
) -> dict:
    """One evaluation of one trained model, as served: a model trained under a threshold rule
    (``served_rule``) is scored under that rule in every kind ("served" in the output says which).

    - "loss": held-out loss on the reporting half of the held-out split.
    - "passkey": the passkey grid (full cache, or the training rule) on the reporting prompts.
    - "control": the same at the training length only (the gate after training).
    - "validation": held-out loss on the tuning half and the grid on validation prompts.
    - "sweep": the own rule (``attention``'s) at every threshold of the preset, on validation prompts.
    - "evict": the own rule at ``threshold`` (a rule-trained model: its training rule) on the reporting
      prompts, then a window keeping, per length, the rule's average number of keys.
    - "growth": kept keys against context length on held-out text, own rule at ``threshold`` (a
      rule-trained model: its training rule).
    """
    if kind not in EVAL_KINDS:
        raise ValueError(f"kind must be one of {EVAL_KINDS}, got {kind!r}")
    if not model_ready(model_dir):
        raise FileNotFoundError(
            f"stage {kind!r} needs the trained model in {model_dir}, which is not there (trained on another "
            "machine?); delete its run's train stage from state.json to train it again"
        )
    p = ReproducePreset.from_dict(p_dict)
    model, tok = load_model(Path(model_dir), p.device)
    serve = served_rule(model_dir)
    served = None if serve is None else _rule_cache(serve["attention"], serve["threshold"], True)
    out = _evaluate(kind, p, model, tok, data_dir, served, attention, threshold, serve)
    return {**out, "served": serve}


def _evaluate(kind, p: ReproducePreset, model, tok, data_dir, served, attention, threshold, serve) -> dict:
    if kind == "loss":
        from fpa.eval.loss import heldout_loss

        return heldout_loss(model, data_dir, p.train_len, p.loss_multiple, p.loss_windows, False, part=TEST_PART)
    if kind == "passkey":
        return _grid(model, tok, p, p.prompt_seed, served)
    if kind == "control":
        return _grid(model, tok, p, p.prompt_seed, served, lengths=[p.train_len])
    if kind == "validation":
        from fpa.eval.loss import heldout_loss

        loss = heldout_loss(model, data_dir, p.train_len, p.loss_multiple, p.loss_windows, False, part=VAL_PART)
        loss.pop("curve")
        return {"loss": loss, "passkey": _grid(model, tok, p, p.validation_prompt_seed, served)}
    if kind == "sweep":
        own = _required(attention, "attention", kind)
        points = []
        for t in p.cache_thresholds:
            g = _grid(model, tok, p, p.validation_prompt_seed, _rule_cache(own, t))
            points.append(
                {
                    "threshold": t,
                    "accuracy_by_length": g["accuracy_by_length"],
                    "kept_by_length": [sum(row) / len(row) for row in g["kept_fraction"]],
                }
            )
        return {"points": points}
    own = _required(attention, "attention", kind)
    own_threshold = _required(threshold, "threshold", kind)
    if serve is not None and float(own_threshold) != serve["threshold"]:
        raise ValueError(
            f"a model trained under threshold {serve['threshold']} is served under it, got threshold={own_threshold}"
        )
    rule = served or _rule_cache(own, own_threshold)
    if kind == "evict":
        from fpa.cache import FPACache, SlidingWindow

        by_rule = _grid(model, tok, p, p.prompt_seed, rule)
        kept = [sum(row) / len(row) for row in by_rule["kept_fraction"]]
        budgets = {n: max(1, round(k * n)) for n, k in zip(_lengths(p), kept)}
        window = _grid(model, tok, p, p.prompt_seed, lambda n: (FPACache(w := SlidingWindow(budgets[n])), w))
        return {"threshold": own_threshold, "rule": by_rule, "window": window, "window_budgets": budgets}
    import torch

    from fpa.data import TokenShards
    from fpa.eval.growth import kept_keys_growth

    val = TokenShards(data_dir, "val")
    n = max(p.growth_lengths)
    start = int(0.5 * len(val))  # the reporting half
    if len(val) - start < n:
        raise ValueError(f"the reporting half of the val split has {len(val) - start} tokens, fewer than {n}")
    ids = torch.from_numpy(val[start : start + n].astype("int64"))[None]
    return kept_keys_growth(model, ids, rule, p.growth_lengths, p.chunk_size)
