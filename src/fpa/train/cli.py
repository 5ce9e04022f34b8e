"""``fpa train`` (flags and/or a JSON/YAML config file) and ``fpa prepare-data``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import fields
from pathlib import Path

# flags of `fpa train`: every TrainConfig field except these gets --kebab-name (type from the default)
_SPECIAL = {
    "model_overrides",
    "data_source",
    "progress",
    "tensorboard",
    "out_dir",
    "verify_data",
    "evict_straight_through",
}
# the flag type of the fields whose default (None) does not give one
_NONE_DEFAULT_TYPES = {"vocab_size": int, "max_bytes": int, "evict_threshold": float, "evict_threshold_start": float}

HELP = {
    "data_dir": "prepared data folder (fpa prepare-data); default: prepare --data-source into OUT_DIR/data",
    "tokenizer": "tokenizer for on-the-fly preparation",
    "vocab_size": "BPE vocabulary size for on-the-fly preparation (byte: fixed 257)",
    "max_bytes": "cap on the corpus size in bytes for on-the-fly preparation",
    "preset": "model size preset (fpa.models.PRESETS)",
    "attention": "attention type of every layer",
    "fpa_mode": "FPA field mode: free (field and level heads) or walk (one learned walk)",
    "seq_len": "training sequence length in tokens",
    "batch_size": "GLOBAL sequences per optimizer step (split over processes and --grad-accum)",
    "grad_accum": "micro-batches per optimizer step",
    "steps": "optimizer steps",
    "lr": "peak learning rate (AdamW)",
    "warmup_steps": "linear warm-up steps",
    "min_lr_ratio": "final learning rate / peak (cosine decay), in [0, 1]",
    "weight_decay": "AdamW weight decay (matrices only)",
    "beta1": "AdamW beta1, in [0, 1]",
    "beta2": "AdamW beta2, in [0, 1]",
    "grad_clip": "gradient-norm clip (0: none)",
    "seed": "seed of the model initialisation and the data order",
    "ckpt_every": "steps between checkpoints",
    "keep_checkpoints": "checkpoints kept (older ones are deleted)",
    "log_every": "steps between metrics lines",
    "eval_every": "steps between held-out evaluations",
    "eval_batches": "batches per held-out evaluation",
    "device": "where to train",
    "precision": "compute precision (auto: bf16 on CUDA, fp32 on CPU)",
    "parallel": "multi-process strategy under torchrun",
    "mix_task": "task whose samples are mixed into training (fpa.tasks.TASK_MIXERS)",
    "mix_rate": "fraction of sequences replaced by --mix-task samples, in [0, 1]",
    "live_reg": "weight of the live-fraction regularizer (fpa.train.regularizers; 0: off; FPA models only)",
    "live_reg_threshold": "eviction threshold whose soft kept fraction the live-fraction regularizer penalises",
    "live_reg_from_step": "first step with the live-fraction term (before it, none)",
    "evict_threshold": "train with FPA's eviction rule in the loop: mask a key once beta * dip > EVICT_THRESHOLD, "
    "as FPAEviction(EVICT_THRESHOLD) evicts it when decoding (FPA models only; default: off)",
    "evict_from_step": "first step trained under --evict-threshold (before it, attention as usual)",
    "evict_threshold_start": "ramp into the rule: at --evict-from-step the threshold is this, then it falls "
    "geometrically to --evict-threshold over --evict-ramp-steps steps (default: no ramp)",
    "evict_ramp_steps": "steps of the ramp from --evict-threshold-start down to --evict-threshold",
}


def _choices(name: str) -> tuple | None:
    from fpa.train import config as c

    fixed = {"device": c.DEVICES, "parallel": c.PARALLEL, "precision": c.PRECISIONS, "tokenizer": c.TOKENIZERS}
    if name in fixed:
        return fixed[name]
    if name in ("preset", "attention"):
        from fpa.models.configuration_fpa import PRESETS, field_choices

        return tuple(PRESETS) if name == "preset" else field_choices(name)
    if name == "fpa_mode":
        from fpa.layers.options import FPA_MODES

        return FPA_MODES
    if name == "mix_task":
        from fpa.tasks import TASK_MIXERS

        return tuple(TASK_MIXERS)
    return None


def _json_dict(text: str) -> dict:
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"must be a JSON object, e.g. '{{\"hidden_size\": 64}}' ({e})") from None
    if not isinstance(d, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(d).__name__}")
    return d


class _Renamed(argparse.Action):
    """A former flag: a usage error pointing to its new name."""

    def __init__(self, option_strings, dest, new: str, **kw):
        super().__init__(option_strings, dest, nargs="?", **kw)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"unrecognized argument {option_string} (did you mean {self.new}?)")


def _train_flags(p: argparse.ArgumentParser) -> None:
    from fpa.train.config import RENAMED, TrainConfig

    p.add_argument("--config", help="JSON or YAML file of TrainConfig settings (flags override it)")
    p.add_argument("--out-dir", help="run folder: checkpoints, metrics.jsonl, model/ (resumes if it has checkpoints)")
    p.add_argument(
        "--data-source",
        nargs="+",
        help="corpus to prepare on the fly: stdlib | file | folder | glob | hf:NAME[:CONFIG]",
    )
    p.add_argument(
        "--model-overrides",
        type=_json_dict,
        help="JSON object of FPAConfig fields, e.g. '{\"hidden_size\": 64}', FPA options nested: "
        '\'{"fpa": {"level_offset": "head"}}\' (unknown keys are an error)',
    )
    p.add_argument(
        "--no-progress",
        dest="progress",
        action="store_const",
        const=False,
        help="no progress bars (transformers' included): a plain line every --log-every steps",
    )
    p.add_argument(
        "--no-verify-data",
        dest="verify_data",
        action="store_const",
        const=False,
        help="skip the sha256 check of the shards at start (sizes are still checked)",
    )
    p.add_argument("--tensorboard", action="store_const", const=True, help="also log to TensorBoard (if installed)")
    p.add_argument(
        "--evict-straight-through",
        action="store_const",
        const=True,
        help="with --evict-threshold: the forward pass under the rule, the gradients of attention without it, "
        "so that a key the rule hid can still be pulled back (default off)",
    )
    for old, new in RENAMED.items():
        p.add_argument(
            "--" + old.replace("_", "-"), action=_Renamed, new="--" + new.replace("_", "-"), help=argparse.SUPPRESS
        )
    for f in fields(TrainConfig):
        if f.name in _SPECIAL:
            continue
        default = f.default
        kind = _NONE_DEFAULT_TYPES.get(f.name) or {int: int, float: float}.get(type(default), str)
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            type=kind,
            default=None,
            choices=_choices(f.name),
            help=f"{HELP.get(f.name, f'TrainConfig.{f.name}')} (default {default!r})",
        )


def _run_train(args: argparse.Namespace) -> int:
    from fpa.cli import writable_dir
    from fpa.train import TrainConfig, train

    given = {k: v for k, v in vars(args).items() if k not in ("config", "func", "command") and v is not None}
    if "data_source" in given and len(given["data_source"]) == 1:
        given["data_source"] = given["data_source"][0]
    if args.config:
        cfg = TrainConfig.from_file(args.config, **given)
    else:
        if "out_dir" not in given:
            raise ValueError("out_dir must be given (--out-dir or in --config)")
        cfg = TrainConfig.from_dict(given)
    writable_dir(cfg.out_dir, "--out-dir" if "out_dir" in given else "out_dir")
    if cfg.data_dir is not None:
        from fpa.data import read_meta

        read_meta(cfg.data_dir)
    out = Path(cfg.out_dir)
    created = not out.exists()
    try:
        summary = train(cfg)
    except Exception:
        # a run that failed before its first checkpoint leaves nothing behind (a folder it made);
        # with a checkpoint the folder stays, so that rerunning the command resumes
        from fpa.train.checkpoint import list_checkpoints

        if created and os.environ.get("RANK", "0") == "0" and out.is_dir() and not list_checkpoints(out):
            shutil.rmtree(out, ignore_errors=True)
        raise
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one summary
        print(json.dumps(summary, indent=1))
    return 0


def _run_prepare(args: argparse.Namespace) -> int:
    from fpa.cli import writable_dir
    from fpa.data import prepare_corpus, read_meta

    writable_dir(args.out_dir, "--out-dir")
    source = args.source[0] if len(args.source) == 1 else args.source
    out = prepare_corpus(
        source,
        args.out_dir,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        val_fraction=args.val_fraction,
        seed=args.seed,
        max_bytes=args.max_bytes,
        overwrite=args.overwrite,
    )
    meta = read_meta(out)
    print(
        json.dumps(
            {
                "out_dir": str(out),
                "tokenizer": meta["tokenizer"],
                "vocab_size": meta["vocab_size"],
                "documents": meta["documents"],
                "tokens": meta["tokens"],
            },
            indent=1,
        )
    )
    return 0


def add_parser(subparsers) -> None:
    """Register the ``fpa train`` subcommand on the top-level parser's ``subparsers``."""
    p = subparsers.add_parser(
        "train",
        help="train a language model (one process, or torchrun for DDP/FSDP2)",
        description="Train an FPA/FoX/softmax language model; resumes from out_dir's latest checkpoint.",
    )
    _train_flags(p)
    p.set_defaults(func=_run_train)

    q = subparsers.add_parser(
        "prepare-data",
        help="tokenize a corpus into memory-mapped token shards",
        description="Tokenize a corpus into out_dir (train/val shards, tokenizer, meta.json).",
    )
    q.add_argument("source", nargs="+", help="stdlib | file | folder | glob | hf:NAME[:CONFIG] (several allowed)")
    q.add_argument("--out-dir", required=True, help="folder for the shards, tokenizer and meta.json")
    q.add_argument("--tokenizer", default="byte", choices=("byte", "bpe"), help="byte (257 ids) or a BPE trained here")
    q.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary size (default 8192)")
    q.add_argument("--val-fraction", type=float, default=0.05, help="share of documents held out, in [0, 1)")
    q.add_argument("--seed", type=int, default=0, help="seed of the train/val split")
    q.add_argument("--max-bytes", type=int, default=None, help="cap on the corpus size in bytes")
    q.add_argument("--overwrite", action="store_true", help="replace a different preparation in out_dir")
    q.set_defaults(func=_run_prepare)
