"""The capacity experiment: train one-layer one-head models per (task, method, d, m) and measure them.

For one grid cell the models of all seeds train together (``PackedModels``), on the same data for
every method and d (the data depend on task, m and the seed list only). After training each model
is evaluated on held-out sequences of the training length and of 4x that length:

- target_mass: the mean attention mass of the query on its target key set (``probe.attention_probs``);
- accuracy: the fraction of queries whose prediction is within the task's tolerance;
- success: target_mass >= 0.99 and accuracy >= 0.99 at both lengths (the minimum over the two is
  what a record's ``target_mass`` and ``accuracy`` hold; the per-length values are kept too).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm import tqdm

from fpa.checks import non_negative_int, positive_int
from fpa.models.packed import PackedModels, check_method
from fpa.tasks.nested import TASKS, TaskBatch, get_task
from fpa.tasks.probe import attention_probs, layer_output
from fpa.train.model_setup import parameter_groups

MASS_TARGET, ACC_TARGET = 0.99, 0.99
EVAL_LENGTH_FACTORS = (1, 4)


@dataclass(frozen=True)
class SynthRecipe:
    """Training budget and hyperparameters, the same for every method.

    The defaults are the ``dense`` recipe: the loss covers every position whose per-prefix answer
    is defined (``Task.prefix_answers``; final query only for tasks without one), Adam with
    ``warmup`` linear warm-up steps then cosine decay to 0, each model's gradient norm clipped at ``clip``.
    ``RECIPES["legacy"]`` is the original protocol: final-query loss, constant lr 1e-2, 400 x 32;
    ``RECIPES["curriculum"]`` (the default of ``fpa synth``) is dense with 2400 steps and a length
    curriculum.
    ``long_every`` > 0 is a length curriculum: every ``long_every``-th step trains on a batch at
    ``long_factor`` x the training length (its own sequences; the evaluation lengths stay 1x and 4x).
    """

    steps: int = 1600
    batch: int = 16
    lr: float = 3e-2
    embed_dim: int = 16
    eval_n: int = 256
    log_every: int = 10
    dense: bool = True
    schedule: str = "cosine"  # "cosine" (after warm-up) or "constant"
    warmup: int = 40
    clip: float = 1.0  # max gradient norm per packed model; 0 = no clipping
    long_every: int = 0  # 0: every batch at the training length
    long_factor: int = 2

    def __post_init__(self) -> None:
        non_negative_int("long_every", self.long_every, "0: every batch at the training length")
        positive_int("long_factor", self.long_factor)


RECIPES: dict[str, dict] = {
    # the default of `fpa synth`: dense, 2400 steps, every 4th batch at 2x the length
    "curriculum": dict(
        steps=2400, batch=16, lr=3e-2, dense=True, schedule="cosine", warmup=40, clip=1.0, long_every=4, long_factor=2
    ),
    "dense": dict(steps=1600, batch=16, lr=3e-2, dense=True, schedule="cosine", warmup=40, clip=1.0),
    "legacy": dict(steps=400, batch=32, lr=1e-2, dense=False, schedule="constant", warmup=0, clip=0.0),
}


def lr_factor(cfg: SynthRecipe, step: int) -> float:
    """Multiplier of cfg.lr at ``step``: linear warm-up over cfg.warmup steps, then constant or cosine to 0."""
    if cfg.schedule not in ("cosine", "constant"):
        raise ValueError(f"schedule must be 'cosine' or 'constant', got {cfg.schedule!r}")
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class CellData:
    """Data of one (task, m, seeds) cell: arrays shaped (N, S, T) / (N, S)."""

    train: TaskBatch
    evals: dict[int, TaskBatch]  # length factor -> held-out batch
    train_long: TaskBatch | None = None  # the curriculum's batches at long_factor x the length


def _stack_seeds(task_name: str, m: int, seeds: tuple[int, ...], n: int, factor: int, split: int) -> TaskBatch:
    """n sequences per seed, (n, S, T); seed s's rows come from its own Generator."""
    task = get_task(task_name)
    tid = tuple(TASKS).index(task_name)
    parts = [task.sample(np.random.default_rng([tid, m, factor, split, s]), n, m, factor) for s in seeds]
    return TaskBatch(
        *(np.stack([getattr(p, f) for p in parts], 1) for f in ("tokens", "target", "answer", "tolerance"))
    )


def make_cell_data(task: str, m: int, seeds: tuple[int, ...], cfg: SynthRecipe) -> CellData:
    """The batches of one (task, m) cell for every seed: training, evaluation per length factor, and
    long training batches if ``cfg.long_every``."""
    train = _stack_seeds(task, m, seeds, cfg.steps * cfg.batch, 1, 0)
    evals = {f: _stack_seeds(task, m, seeds, cfg.eval_n, f, 1) for f in EVAL_LENGTH_FACTORS}
    long = None
    if cfg.long_every:
        long = _stack_seeds(task, m, seeds, max(1, cfg.steps // cfg.long_every) * cfg.batch, cfg.long_factor, 2)
    return CellData(train, evals, long)


def _tensors(b: TaskBatch, sl: slice) -> tuple[torch.Tensor, ...]:
    return (
        torch.from_numpy(b.tokens[sl]),
        torch.from_numpy(b.target[sl]),
        torch.from_numpy(b.answer[sl]),
        torch.from_numpy(b.tolerance[sl]),
    )


@torch.no_grad()
def evaluate(model: PackedModels, data: TaskBatch, chunk: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Per model (S,): mean target attention mass of the last query, and accuracy."""
    mass, hits = [], []
    for i in range(0, data.tokens.shape[0], chunk):
        tok, tgt, ans, tol = _tensors(data, slice(i, i + chunk))
        probs, v = attention_probs(model.attn, model.hidden(tok), last_only=True)  # (b, S, 1, T)
        mass.append((probs[:, :, -1, :] * tgt.float()).sum(-1))
        pred = model.readout_last(layer_output(model.attn, probs, v))  # == the layer's forward (tested)
        hits.append(((pred - ans).abs() < tol).float())
    return torch.cat(mass).mean(0).numpy(), torch.cat(hits).mean(0).numpy()


def train_cell(
    task: str,
    method: str,
    dim: int,
    m: int,
    seeds: tuple[int, ...],
    cfg: SynthRecipe,
    data: CellData | None = None,
    layer_kwargs: dict | None = None,
) -> list[dict]:
    """Train and evaluate one model per seed; one record per seed (see module docstring).
    ``layer_kwargs`` override the method's attention-layer arguments (parametrisation variants)."""
    check_method(method)
    data = make_cell_data(task, m, seeds, cfg) if data is None else data
    gen_seed = int(np.random.default_rng([dim, m, *seeds, sum(map(ord, method))]).integers(2**31))
    torch.manual_seed(gen_seed)
    task_obj = get_task(task)
    model = PackedModels(method, len(seeds), task_obj.vocab_size, dim, cfg.embed_dim, layer_kwargs)
    # each parameter group at its lr multiple (FirstPassageAttention.field_lr_multiplier), as `fpa train` does
    opt = torch.optim.Adam(
        [{"params": g["params"], "lr": cfg.lr * g["lr_multiplier"]} for g in parameter_groups(model, weight_decay=0.0)],
        lr=cfg.lr,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(cfg, step))
    sources = [(data.train, task_obj.prefix_answers(data.train.tokens) if cfg.dense else None)]
    if cfg.long_every:
        long_batches = data.train_long
        if long_batches is None:
            raise ValueError(
                "cfg.long_every is set but data has no train_long batches; build it with make_cell_data(..., cfg)"
            )
        sources.append((long_batches, task_obj.prefix_answers(long_batches.tokens) if cfg.dense else None))
    curve: list[list[float]] = [[] for _ in seeds]
    for step in range(cfg.steps):
        long = bool(cfg.long_every) and step % cfg.long_every == cfg.long_every - 1
        (src, dense), i = sources[long], (step // cfg.long_every if long else step)
        sl = slice(i * cfg.batch, (i + 1) * cfg.batch)
        tok, _, ans, tol = _tensors(src, sl)
        if dense is None:
            err = ((model(tok) - ans) / tol) ** 2  # (B, S): squared error in units of the tolerance
        else:  # mean squared error (in tolerance units) over the positions with a defined answer
            a, t, valid = (torch.from_numpy(x[sl]) for x in dense)
            sq = ((model.readout_all(model.attn(model.hidden(tok))) - a) / t) ** 2  # (B, S, T)
            err = (sq * valid).sum(-1) / valid.sum(-1)  # the final query is always valid
        opt.zero_grad(set_to_none=True)
        err.mean(0).sum().backward()  # sum over models: each model gets its own mean-loss gradient
        if cfg.clip > 0:
            model.clip_grad_norm_(cfg.clip)  # per packed model: the seeds stay independent
        opt.step()
        sched.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            for s, v in enumerate(err.detach().mean(0).tolist()):
                curve[s].append(v)
    results = {f: evaluate(model, b) for f, b in data.evals.items()}
    records = []
    for s, seed in enumerate(seeds):
        per = {f: (float(results[f][0][s]), float(results[f][1][s])) for f in results}
        mass = min(v[0] for v in per.values())
        acc = min(v[1] for v in per.values())
        records.append(
            dict(
                task=task,
                method=method,
                dim=dim,
                m=m,
                seed=seed,
                target_mass=mass,
                accuracy=acc,
                success=bool(mass >= MASS_TARGET and acc >= ACC_TARGET),
                per_length={f"{f}x": {"target_mass": v[0], "accuracy": v[1]} for f, v in per.items()},
                train_length=int(data.train.tokens.shape[-1]),
                curve=curve[s],
                curve_every=cfg.log_every,
                config=asdict(cfg),
            )
        )
    return records


def run_grid(
    tasks: list[str],
    methods: list[str],
    dims: list[int],
    ms: list[int],
    seeds: list[int],
    cfg: SynthRecipe,
    progress: bool = True,
    fpa_kwargs: dict | None = None,
) -> list[dict]:
    """Every (task, m, method, d) cell, seeds packed per cell; one record per run. ``fpa_kwargs``
    override the FPA methods' layer arguments (the other methods take none)."""
    for t in tasks:
        get_task(t)
    for meth in methods:
        check_method(meth)
    for name, vals in (("dims", dims), ("ms", ms)):
        if not vals or any(int(v) < 1 for v in vals):
            raise ValueError(f"{name} must be a non-empty list of integers >= 1, got {vals}")
    if not seeds:
        raise ValueError("seeds must be a non-empty list of integers")
    records: list[dict] = []
    bar = tqdm(total=len(tasks) * len(ms) * len(methods) * len(dims), disable=not progress, desc="synth")
    for task in tasks:
        for m in ms:
            data = make_cell_data(task, m, tuple(seeds), cfg)
            for method in methods:
                for dim in dims:
                    bar.set_postfix_str(f"{task} m={m} {method} d={dim}")
                    kw = fpa_kwargs if method.startswith("fpa") else None
                    records += train_cell(task, method, dim, m, tuple(seeds), cfg, data, layer_kwargs=kw)
                    bar.update()
    bar.close()
    return records
