"""``fpa eval`` (one trained model) and ``fpa reproduce`` (the whole paper, one preset)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fpa.eval.presets import PRESETS


def _floats(s: str) -> tuple[float, ...]:
    return tuple(float(x) for x in s.split(",") if x)


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(",") if x)


def _training_info(model_dir: Path) -> dict:
    f = model_dir / "training.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def run_eval(args) -> int:
    from fpa.eval.curves import policy_curve
    from fpa.eval.kv import policies_for
    from fpa.eval.loss import heldout_loss
    from fpa.eval.passkey import passkey_grid
    from fpa.eval.reproduce import load_model
    from fpa.eval.stages import write_json

    bad = sorted(set(args.what) - {"loss", "passkey", "cache"})
    if bad:
        raise ValueError(f"--what must be a comma list of loss, passkey, cache; got {bad}")
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"--model must be a saved model folder (config.json), got {model_dir}")
    info = _training_info(model_dir)
    L = args.train_len or info.get("config", {}).get("seq_len")
    if not L:
        raise ValueError("--train-len is required (the model folder has no training.json)")
    model, tok = load_model(model_dir, args.device)
    attention = model.config.attention
    res = {"model": str(model_dir), "train_len": L}
    progress = not args.no_progress
    if "loss" in args.what:
        data = args.data or info.get("data_dir")
        if not data:
            raise ValueError("--data is required for the loss (the model folder has no training.json)")
        res["loss"] = heldout_loss(model, data, L, args.loss_multiple, args.loss_windows, progress)
        print(f"held-out loss {res['loss']['loss']:.4f} (ppl {res['loss']['ppl']:.3f}); by multiple {res['loss']['by_multiple']}")
    lengths = [L * m for m in args.multiples]
    if "passkey" in args.what:
        res["passkey"] = passkey_grid(model, tok, lengths, args.depths, args.trials, seed=args.seed,
                                      chunk_size=args.chunk_size, batch_size=args.trials, progress=progress)
        print("passkey accuracy by length:", dict(zip(lengths, res["passkey"]["accuracy_by_length"])))
    if "cache" in args.what:
        res["cache_curve"] = {}
        for policy in ["full"] + policies_for(attention):
            pts = policy_curve(model, tok, policy, L, args.multiples, args.depths, args.trials, args.thresholds,
                               args.fractions, args.chunk_size, args.seed)
            res["cache_curve"][policy] = pts
            for p in pts:
                print(f"{policy} {'' if p['setting'] is None else p['setting']}: kept {p['kept_fraction']:.3f}, "
                      f"accuracy by multiple {p['accuracy_by_multiple']}")
    write_json(args.out, res)
    print(f"wrote {args.out}")
    return 0


def run_reproduce(args) -> int:
    from fpa.eval.presets import get_preset
    from fpa.eval.reproduce import reproduce

    preset = get_preset(args.preset)
    if args.data_source:
        import dataclasses

        preset = dataclasses.replace(preset, data_source=args.data_source, corpus_max_bytes=args.max_bytes)
    methods = tuple(args.methods.split(",")) if args.methods else None
    res = reproduce(preset, args.out, progress=not args.no_progress, methods=methods, seeds=args.seeds,
                    jobs=args.jobs, stop_after=args.stop_after)
    if res:
        print(f"wrote {Path(args.out) / 'report.md'} and {Path(args.out) / 'results.json'}")
    return 0


def add_parser(subparsers) -> None:
    e = subparsers.add_parser("eval", help="evaluate a trained model: per-position loss, passkey grid, cache policies",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    e.add_argument("--model", required=True, help="saved model folder (fpa train's out_dir/model)")
    e.add_argument("--out", required=True, help="JSON file to write")
    e.add_argument("--data", help="prepared data folder (default: the one the model was trained on)")
    e.add_argument("--train-len", type=int, help="training length (default: from training.json)")
    e.add_argument("--what", type=lambda s: tuple(s.split(",")), default=("loss", "passkey", "cache"),
                   help="comma list of loss, passkey, cache")
    e.add_argument("--loss-multiple", type=int, default=8)
    e.add_argument("--loss-windows", type=int, default=8)
    e.add_argument("--multiples", type=_ints, default=(1, 2, 4, 8, 16))
    e.add_argument("--depths", type=_floats, default=(0.0, 0.25, 0.5, 0.75, 1.0))
    e.add_argument("--trials", type=int, default=10)
    e.add_argument("--fractions", type=_floats, default=(0.1, 0.15, 0.2, 0.25, 0.35, 0.5),
                   help="kept fractions for the budget policies (window, streamingllm, tova, h2o)")
    e.add_argument("--thresholds", type=_floats, default=(2.0, 4.0, 6.0, 8.0, 16.0, 32.0),
                   help="thresholds tau for the model's own eviction rule (FPA, FoX); each reports its kept fraction")
    e.add_argument("--chunk-size", type=int, default=256)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    e.add_argument("--no-progress", action="store_true")
    e.set_defaults(func=run_eval)
    r = subparsers.add_parser("reproduce", help="train the five methods, run every evaluation, write the report")
    r.add_argument("--preset", required=True, choices=tuple(PRESETS))
    r.add_argument("--out", required=True, help="run folder (resumes if it holds an interrupted run)")
    r.add_argument("--methods", help="comma list of methods (default: the five methods and, on the preset's "
                                     "ablation seeds, the ablations; see fpa.eval.presets)")
    r.add_argument("--seeds", type=_ints, default=None,
                   help="comma list of training seeds, e.g. 0,1,2 (default: the preset's)")
    r.add_argument("--jobs", type=int, default=1,
                   help="independent stages to run at once in worker processes (each with cores/jobs threads)")
    r.add_argument("--stop-after", choices=("train",), default=None,
                   help="stop after the training stages (evaluate later, e.g. on another machine)")
    r.add_argument("--data-source", help="corpus instead of the preset's (a path, a list file or hf:NAME; "
                                         "see fpa prepare-data); recorded in the run's config")
    r.add_argument("--max-bytes", type=int, help="with --data-source: cap on the corpus size in bytes")
    r.add_argument("--no-progress", action="store_true")
    r.set_defaults(func=run_reproduce)
