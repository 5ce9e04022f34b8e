"""``fpa reproduce``: train every method on every seed with identical budgets, evaluate, report.

Stages (each resumable, see fpa.eval.stages): config, data, train-<method>-s<seed> (the trainer
resumes from its own checkpoints), loss-/passkey-<method>-s<seed>, curve-<method>-s<seed>-<policy>
(accuracy against kept fraction under one KV-cache policy), example-<fpa method>; then
results.json, report.md, the PNGs and README-snippet.md are rewritten from the stage outputs.
``jobs`` > 1 runs independent stages in that many worker processes (fpa.eval.pool).
Under torchrun (WORLD_SIZE > 1) every rank trains, one stage at a time; rank 0 alone evaluates.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from fpa.data.atomic import atomic_write_text
from fpa.eval.presets import ABLATIONS, METHODS, ReproducePreset
from fpa.eval.stages import Stages, read_json


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _wait_for(stages: Stages, name: str, poll_s: float = 2.0) -> None:
    """Block until stage ``name`` is recorded in the state file (written by rank 0)."""
    while True:
        if stages.state_path.is_file() and name in read_json(stages.state_path)["done"]:
            return
        time.sleep(poll_s)


def runs_of(p: ReproducePreset, methods: tuple[str, ...] | None, seeds: tuple[int, ...]) -> list[dict]:
    """Every (method, seed) run: {"name", "attention", "mode", "overrides", "seed", "ablation"}.
    The METHODS on ``seeds``; the ABLATIONS on the preset's ablation seeds (those in ``seeds``)."""
    known = [m[0] for m in METHODS] + [a[0] for a in ABLATIONS]
    if methods is not None:
        bad = sorted(set(methods) - set(known))
        if bad or not methods:
            raise ValueError(f"methods must name some of {known}, got {list(methods)!r}")
    runs = []
    for name, attention, mode in METHODS:
        if methods is None or name in methods:
            runs += [dict(name=name, attention=attention, mode=mode, overrides={}, train_overrides={}, seed=s,
                          ablation=False, curves=True) for s in seeds]
    for name, attention, mode, over, train_over, curves in ABLATIONS:
        if methods is None or name in methods:
            runs += [dict(name=name, attention=attention, mode=mode, overrides=over, train_overrides=train_over,
                          seed=s, ablation=True, curves=curves)
                     for s in p.ablation_seeds if methods is not None or s in seeds]
    return sorted(runs, key=lambda r: (r["ablation"], r["seed"]))  # seed by seed: the first seed is the control


def same_preset(saved: dict, p: ReproducePreset) -> bool:
    """Whether a run folder's recorded preset is ``p``; a setting the record lacks (added to
    ReproducePreset after the run) counts as its default."""
    defaults = {f.name: f.default for f in dataclasses.fields(ReproducePreset)
                if f.default is not dataclasses.MISSING}
    now = p.to_dict()
    old = {**{k: defaults[k] for k in now if k not in saved and k in defaults}, **saved}
    return json.dumps(old, sort_keys=True) == json.dumps(now, sort_keys=True)


def run_id(run: dict) -> str:
    return f"{run['name']}-s{run['seed']}"


def _train_config(p: ReproducePreset, out: Path, data_dir: Path, run: dict, progress: bool):
    from fpa.train import TrainConfig

    return TrainConfig(
        out_dir=str(out), data_dir=str(data_dir), preset=p.model_preset, attention=run["attention"],
        fpa_mode=run["mode"], model_overrides={**p.model_overrides, **run["overrides"]}, seq_len=p.train_len,
        batch_size=p.batch_size, grad_accum=p.grad_accum, steps=p.steps, lr=p.lr, warmup_steps=p.warmup_steps,
        seed=run["seed"], ckpt_every=max(1, p.steps // 4), eval_every=p.eval_every or p.steps,
        log_every=max(1, p.steps // 20), device=p.device, mix_task=p.mix_task, mix_rate=p.mix_rate,
        progress=progress, tokenizer=p.tokenizer, **run.get("train_overrides", {}))


def train_stage(cfg_dict: dict) -> dict:
    """Worker entry point: train one run from its TrainConfig as a dict; the training summary
    plus the answer-loss learning curve read from its metrics."""
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


def load_model(model_dir: Path, device: str):
    """(FPAForCausalLM in eval mode on ``device`` if available, its tokenizer) from a saved folder."""
    import torch

    from fpa.data import load_tokenizer
    from fpa.models import FPAForCausalLM

    dev = "cuda" if device == "cuda" and torch.cuda.is_available() else "cpu"
    model = FPAForCausalLM.from_pretrained(model_dir).to(dev).eval()
    return model, load_tokenizer(model_dir)


def eval_stage(kind: str, p_dict: dict, model_dir: str, data_dir: str, policy: str | None = None,
               evict_tau: float | None = None) -> dict:
    """Worker entry point: one evaluation of one trained model. ``kind``: "loss", "passkey" (full
    cache, every length) or "curve" (``policy``: "full", a threshold rule "fpa"/"fox" swept over
    the preset's thresholds, or a budget policy swept over its kept fractions). A model trained
    with the rule in the loop (``evict_tau``) is measured as it was trained: its held-out loss
    under the rule, its passkey grid served by FPAEviction(evict_tau, within_chunks=True)."""
    from fpa.eval.curves import _factory, policy_curve
    from fpa.eval.loss import heldout_loss
    from fpa.eval.passkey import passkey_grid

    p = ReproducePreset(**{k: tuple(v) if isinstance(v, list) else v for k, v in p_dict.items()})
    model, tok = load_model(Path(model_dir), p.device)
    L = p.train_len
    if kind == "loss":
        if evict_tau is not None:
            from fpa.train.model_setup import set_training_eviction

            set_training_eviction(model, evict_tau)
        return heldout_loss(model, data_dir, L, p.loss_multiple, p.loss_windows, progress=False)
    if kind == "passkey":
        served = None if evict_tau is None else _factory("fpa-within", evict_tau, p.hybrid_threshold)
        return passkey_grid(model, tok, [L * m for m in p.passkey_multiples], p.depths, p.trials, seed=p.seed,
                            make_cache=served, chunk_size=p.chunk_size, batch_size=p.trials, progress=False)
    if kind == "curve":
        fractions = p.hybrid_fractions if "+" in policy else p.fractions
        return {"points": policy_curve(model, tok, policy, p.train_len, p.cache_multiples, p.cache_depths,
                                       p.cache_trials, p.cache_thresholds, fractions, p.chunk_size, p.seed,
                                       hybrid_threshold=p.hybrid_threshold)}
    if kind == "kvpress":
        from fpa.eval.kvpress_grid import kvpress_passkey_grid

        return kvpress_passkey_grid(model, tok, [L * m for m in p.kvpress_multiples], p.cache_depths, p.cache_trials,
                                    [round(1 - f, 6) for f in p.kvpress_fractions], p.kvpress_presses, seed=p.seed)
    raise ValueError(f"kind must be loss, passkey, curve or kvpress, got {kind!r}")


def kvpress_available() -> str | None:
    """None if kvpress runs here, else the reason (its stages are then left for another run)."""
    try:
        from fpa.eval.kvpress_grid import _kvpress

        _kvpress()
    except Exception as e:  # noqa: BLE001 - any failure to import means "not here"
        return f"{type(e).__name__}: {e}"
    return None


def curve_policies(p: ReproducePreset, run: dict) -> list[str]:
    """The cache policies evaluated on a run: the full cache and the model's own threshold rule
    (FPA, FoX) on every non-ablation run; the budget policies and the hybrids (own rule, then a
    budget) on the preset's ``budget_methods``; none when the preset has no ``cache_multiples``.
    A run trained with the rule in the loop (``evict_tau``) is also served the way it was trained:
    the own rule inside each prefill chunk too ("<rule>-within")."""
    from fpa.eval.kv import BUDGET_POLICIES, THRESHOLD_POLICIES, WITHIN_SUFFIX, hybrids_for

    if not p.cache_multiples:
        return []

    own = [THRESHOLD_POLICIES[run["attention"]]] if run["attention"] in THRESHOLD_POLICIES else []
    if own and run.get("train_overrides", {}).get("evict_tau") is not None:
        own += [own[0] + WITHIN_SUFFIX]
    if run["ablation"]:
        return ["full"] + own if run["curves"] and own else []
    chosen = run["name"] in p.budget_methods
    budget = list(BUDGET_POLICIES) if chosen else []
    hybrid = hybrids_for(run["attention"]) if chosen and p.hybrid_fractions else []
    return (["full"] + own + budget + hybrid) if (own or budget) else []


def reproduce(p: ReproducePreset, out_dir: str | Path, progress: bool = True,
              methods: tuple[str, ...] | None = None, log: Callable[[str], None] = print,
              seeds: tuple[int, ...] | None = None, jobs: int = 1, stop_after: str | None = None) -> dict:
    """Run (or resume) every stage of preset ``p`` in ``out_dir``; returns the results dict
    ({} when ``stop_after="train"`` stops it after the training stages)."""
    from fpa.data import prepare_corpus
    from fpa.eval.pool import run_tasks

    if stop_after not in (None, "train"):
        raise ValueError(f"stop_after must be None or 'train', got {stop_after!r}")

    out = Path(out_dir)
    seeds = tuple(p.seeds if seeds is None else seeds)
    if not seeds or any(not isinstance(s, int) or s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct non-negative ints, got {seeds!r}")
    runs = runs_of(p, methods, seeds)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed and jobs > 1:
        raise ValueError("jobs > 1 is for one machine; under torchrun the ranks already share the training")
    stages = Stages(out, log=log, write=_is_main())
    if _is_main():  # the corpus and the trained models stay out of git; the report and results go in
        atomic_write_text(out / ".gitignore", "data/\nmodels/\n")
    cfg = stages.run("config", p.to_dict)
    if not same_preset(cfg, p):
        raise ValueError(f"out_dir {out} holds a run of another configuration (preset {cfg.get('name')!r}); "
                         f"use another --out or delete it")
    data_dir = out / "data"
    if _is_main():
        stages.run("data", lambda: {"data_dir": str(prepare_corpus(p.data_source, data_dir, tokenizer=p.tokenizer,
                                                                   max_bytes=p.corpus_max_bytes, seed=p.seed))})
    else:  # torchrun: rank 0 prepares the corpus, the others wait for it
        _wait_for(stages, "data")
    quiet = progress and jobs == 1
    train_tasks = [(f"train-{run_id(r)}", train_stage,
                    (_train_config(p, out / "models" / run_id(r), data_dir, r, quiet).to_dict(),)) for r in runs]
    p_dict = p.to_dict()
    kvpress_missing = kvpress_available() if any(r["name"] in p.kvpress_methods for r in runs) else "no method"

    def eval_tasks_of(r: dict, model_dir: str) -> list:
        rid, args = run_id(r), (p_dict, model_dir, str(data_dir))
        tau = r.get("train_overrides", {}).get("evict_tau")  # served as trained (eval_stage)
        tasks = [(f"loss-{rid}", eval_stage, ("loss", *args, None, tau)),
                 (f"passkey-{rid}", eval_stage, ("passkey", *args, None, tau))]
        tasks += [(f"curve-{rid}-{pol}", eval_stage, ("curve", *args, pol)) for pol in curve_policies(p, r)]
        if kvpress_missing is None and r["name"] in p.kvpress_methods and not r["ablation"]:
            tasks.append((f"kvpress-{rid}", eval_stage, ("kvpress", *args)))
        return tasks

    if _is_main() and stop_after is None and jobs > 1:
        # evaluate the models trained earlier while the others train: no worker waits for a phase to end
        ready = [r for r in runs if stages.done(f"train-{run_id(r)}")]
        early = [t for r in ready for t in eval_tasks_of(r, stages.run(f"train-{run_id(r)}", dict)["model_dir"])]
        run_tasks(stages, [t for t in train_tasks if not stages.done(t[0])] + early, jobs, progress, desc="train+eval")
    trained = run_tasks(stages, train_tasks, jobs, progress, desc="train")
    if not _is_main() or stop_after == "train":
        return {}
    from fpa.eval.aggregate import aggregate
    from fpa.eval.example import passkey_example
    from fpa.eval.report import write_report

    eval_tasks = [t for r in runs for t in eval_tasks_of(r, trained[f"train-{run_id(r)}"]["model_dir"])]
    if kvpress_missing is not None:
        log(f"kvpress stages skipped ({kvpress_missing}); rerun under an environment with the kvpress extra to add them")
    evaluated = run_tasks(stages, eval_tasks, jobs, progress, desc="evaluate")
    for r in runs:  # kvpress results of an earlier run under another environment
        name = f"kvpress-{run_id(r)}"
        if name not in evaluated and stages.done(name):
            evaluated[name] = stages.run(name, lambda: None)
    examples = {}
    for r in runs:
        if r["attention"] == "fpa" and not r["ablation"] and r["seed"] == seeds[0]:
            model, tok = load_model(Path(trained[f"train-{run_id(r)}"]["model_dir"]), p.device)
            examples[r["name"]] = stages.run(f"example-{r['name']}", lambda model=model, tok=tok: passkey_example(
                model, tok, p.train_len * p.example_multiple, 0.5, seed=p.seed))
    results = aggregate(p, runs, trained, evaluated, run_id, curve_policies)
    results["examples"] = examples
    results["seconds"] = stages.seconds()
    write_report(results, out)
    return results
