"""``fpa train`` (flags and/or a JSON/YAML config file) and ``fpa prepare-data``."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import fields

# flags of `fpa train`: every TrainConfig field except these gets --kebab-name (type from the default)
_SPECIAL = {"model_overrides", "data_source", "progress", "tensorboard", "out_dir", "verify_data"}


def _train_flags(p: argparse.ArgumentParser) -> None:
    from fpa.train.config import TrainConfig

    p.add_argument("--config", help="JSON or YAML file of TrainConfig settings (flags override it)")
    p.add_argument("--out-dir", help="run folder: checkpoints, metrics.jsonl, model/ (resumes if it has checkpoints)")
    p.add_argument("--data-source", nargs="+", help="corpus to prepare on the fly: stdlib | file | folder | glob | hf:NAME[:CONFIG]")
    p.add_argument("--model-overrides", type=json.loads, help='JSON dict of FPAConfig fields, e.g. \'{"hidden_size": 64}\'')
    p.add_argument("--no-progress", dest="progress", action="store_const", const=False, help="no progress bar")
    p.add_argument("--no-verify-data", dest="verify_data", action="store_const", const=False,
                   help="skip the sha256 check of the shards at start (sizes are still checked)")
    p.add_argument("--tensorboard", action="store_const", const=True, help="also log to TensorBoard (if installed)")
    for f in fields(TrainConfig):
        if f.name in _SPECIAL:
            continue
        default = f.default
        kind = {int: int, float: float}.get(type(default), str)
        if f.name in ("vocab_size", "max_bytes"):
            kind = int
        p.add_argument("--" + f.name.replace("_", "-"), type=kind, default=None,
                       help=f"(default {default!r})")


def _run_train(args: argparse.Namespace) -> int:
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
    summary = train(cfg)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one summary
        print(json.dumps(summary, indent=1))
    return 0


def _run_prepare(args: argparse.Namespace) -> int:
    from fpa.data import prepare_corpus, read_meta

    source = args.source[0] if len(args.source) == 1 else args.source
    out = prepare_corpus(source, args.out_dir, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                         val_fraction=args.val_fraction, seed=args.seed, max_bytes=args.max_bytes,
                         overwrite=args.overwrite)
    meta = read_meta(out)
    print(json.dumps({"out_dir": str(out), "tokenizer": meta["tokenizer"], "vocab_size": meta["vocab_size"],
                      "documents": meta["documents"], "tokens": meta["tokens"]}, indent=1))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a language model (one process, or torchrun for DDP/FSDP2)",
                              description="Train an FPA/FoX/softmax language model; resumes from out_dir's latest checkpoint.")
    _train_flags(p)
    p.set_defaults(func=_run_train)

    q = subparsers.add_parser("prepare-data", help="tokenize a corpus into memory-mapped token shards",
                              description="Tokenize a corpus into out_dir (train/val shards, tokenizer, meta.json).")
    q.add_argument("source", nargs="+", help="stdlib | file | folder | glob | hf:NAME[:CONFIG] (several allowed)")
    q.add_argument("--out-dir", required=True)
    q.add_argument("--tokenizer", default="byte", choices=("byte", "bpe"))
    q.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary size (default 8192)")
    q.add_argument("--val-fraction", type=float, default=0.05)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--max-bytes", type=int, default=None, help="cap on the corpus size in bytes")
    q.add_argument("--overwrite", action="store_true", help="replace a different preparation in out_dir")
    q.set_defaults(func=_run_prepare)
