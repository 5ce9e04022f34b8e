"""``fpa eval``: evaluate one trained model (held-out loss, passkey grid, cache policies)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import cast


def _floats(s: str) -> tuple[float, ...]:
    return tuple(float(x) for x in s.split(",") if x)


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(",") if x)


def _positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {s}")
    return v


def _list(kind, lo: float, hi: float, lo_open: bool = False):
    """argparse type: a non-empty comma list of numbers in [lo, hi] ((lo, hi] with lo_open)."""

    def parse(s: str) -> tuple:
        try:
            vals = tuple(kind(x) for x in s.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a comma list of {kind.__name__}s, got {s!r}") from None
        if not vals or any(v < lo or v > hi or (lo_open and v == lo) for v in vals):
            rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise argparse.ArgumentTypeError(f"must be a non-empty comma list of {kind.__name__}s in {rng}, got {s!r}")
        return vals

    return parse


WHAT = ("loss", "passkey", "cache")


def _what(s: str) -> tuple[str, ...]:
    vals = tuple(x for x in s.split(",") if x)
    bad = sorted(set(vals) - set(WHAT))
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"must be a comma list of {', '.join(WHAT)}; got {s!r}")
    return vals


def _training_info(model_dir: Path) -> dict:
    f = model_dir / "training.json"
    if not f.is_file():
        return {}
    try:
        info = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{f} is corrupt (not JSON: {e})") from None
    if not isinstance(info, dict):
        raise ValueError(f"{f} is corrupt (not a JSON object)")
    return info


def check_model_folder(model_dir: Path):
    """The tokenizer of a saved model folder, after checking (cheaply, without loading weights)
    that it has a valid config.json, weights and a tokenizer; else a ValueError saying what is wrong."""
    from fpa.data import load_tokenizer
    from fpa.models import FPAConfig

    cfg_file = model_dir / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"--model must be a saved model folder (with config.json), got {model_dir}")
    try:
        json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"--model: {cfg_file} is corrupt (not JSON: {e})") from None
    if not any(model_dir.glob("*.safetensors")) and not any(model_dir.glob("*.bin")):
        raise ValueError(f"--model: {model_dir} holds no weights (model.safetensors)")
    try:
        FPAConfig.from_pretrained(model_dir)
    except (ValueError, OSError) as e:
        raise ValueError(f"--model: {cfg_file}: {e}") from None
    try:
        return load_tokenizer(model_dir)
    except ValueError as e:
        raise ValueError(f"--model: {model_dir} has no usable tokenizer ({e})") from None


def load_checked(model_dir: Path, device: str):
    """The model of a checked folder in eval mode on ``device``, or a ValueError: truncated or
    corrupt weights, or weights that do not match config.json (missing, unexpected or
    mis-shaped tensors are an error here, not a silently random-initialised model)."""
    import torch

    from fpa.compat import hf_progress_bars
    from fpa.models import FPAForCausalLM

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    try:
        with hf_progress_bars(False):
            loaded = FPAForCausalLM.from_pretrained(model_dir, output_loading_info=True)
    except RuntimeError as e:  # transformers raises it for mis-shaped tensors
        raise ValueError(f"--model: the weights in {model_dir} do not match config.json: {e}") from None
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"--model: cannot load the weights in {model_dir}: {e}") from None
    except Exception as e:  # safetensors' SafetensorError (truncated or corrupt file) derives from Exception
        if type(e).__name__ != "SafetensorError":
            raise
        raise ValueError(f"--model: the weights in {model_dir} are truncated or corrupt: {e}") from None
    # with output_loading_info=True, from_pretrained returns (model, loading info), unlike its annotation
    model, info = cast("tuple[FPAForCausalLM, dict[str, list[str]]]", loaded)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ValueError(
            f"--model: the weights in {model_dir} do not match config.json: "
            + "; ".join(f"{k} {sorted(map(str, v))[:5]}" for k, v in bad.items())
        )
    return model.to(device).eval()  # type: ignore[arg-type]  # transformers' @wraps(Module.to) stub keeps self


def run_eval(args) -> int:
    """Every check (flags, --out writable, model folder, data folder) runs before any work."""
    from fpa.cli import writable_file

    out = writable_file(args.out, "--out")
    model_dir = Path(args.model)
    tok = check_model_folder(model_dir)
    info = _training_info(model_dir)
    L = args.train_len or info.get("config", {}).get("seq_len")
    if not L:
        raise ValueError("--train-len is required (the model folder has no training.json)")
    data = None
    if "loss" in args.what:
        from fpa.data import read_meta

        data = args.data or info.get("data_dir")
        if not data:
            raise ValueError("--data is required for the loss (the model folder has no training.json)")
        read_meta(data)
    if "passkey" in args.what or "cache" in args.what:
        from fpa.tasks.passkey import min_prompt_length

        need = min_prompt_length(tok)
        if L * min(args.multiples) < need:
            raise ValueError(
                f"passkey prompts need >= {need} tokens, but --train-len {L} x --multiples "
                f"{min(args.multiples)} = {L * min(args.multiples)}; raise them or drop passkey/cache from --what"
            )
    model = load_checked(model_dir, args.device)

    from fpa.data.atomic import atomic_write_text
    from fpa.eval.curves import policy_curve
    from fpa.eval.kv import policies_for
    from fpa.eval.loss import heldout_loss
    from fpa.eval.passkey import passkey_grid

    attention = model.config.attention
    res = {"model": str(model_dir), "train_len": L}
    progress = not args.no_progress
    if "loss" in args.what:
        res["loss"] = heldout_loss(model, data, L, args.loss_multiple, args.loss_windows, progress)
        print(
            f"held-out loss {res['loss']['loss']:.4f} (ppl {res['loss']['ppl']:.3f}); "
            f"by multiple {res['loss']['by_multiple']}"
        )
    lengths = [L * m for m in args.multiples]
    if "passkey" in args.what:
        res["passkey"] = passkey_grid(
            model,
            tok,
            lengths,
            args.depths,
            args.trials,
            seed=args.seed,
            chunk_size=args.chunk_size,
            batch_size=args.trials,
            progress=progress,
        )
        print("passkey accuracy by length:", dict(zip(lengths, res["passkey"]["accuracy_by_length"])))
    if "cache" in args.what:
        res["cache_curve"] = {}
        for policy in ["full"] + policies_for(attention):
            pts = policy_curve(
                model,
                tok,
                policy,
                L,
                args.multiples,
                args.depths,
                args.trials,
                args.thresholds,
                args.fractions,
                args.chunk_size,
                args.seed,
            )
            res["cache_curve"][policy] = pts
            for p in pts:
                print(
                    f"{policy} {'' if p['setting'] is None else p['setting']}: kept {p['kept_fraction']:.3f}, "
                    f"accuracy by multiple {p['accuracy_by_multiple']}"
                )
    atomic_write_text(out, json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


def add_parser(subparsers) -> None:
    """Register the ``fpa eval`` subcommand on the top-level parser's ``subparsers``."""
    e = subparsers.add_parser(
        "eval",
        help="evaluate a trained model: per-position loss, passkey grid, cache policies",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    e.add_argument("--model", required=True, help="saved model folder (fpa train's out_dir/model)")
    e.add_argument("--out", required=True, help="JSON file to write (checked writable before the evaluation)")
    e.add_argument("--data", help="prepared data folder (default: the one the model was trained on)")
    e.add_argument("--train-len", type=_positive_int, help="training length (default: from training.json)")
    e.add_argument("--what", type=_what, default=WHAT, help="comma list of loss, passkey, cache")
    e.add_argument(
        "--loss-multiple",
        type=_positive_int,
        default=8,
        help="the loss is measured on windows of this many times the training length",
    )
    e.add_argument("--loss-windows", type=_positive_int, default=8, help="held-out windows for the loss")
    e.add_argument(
        "--multiples",
        type=_list(int, 1, 1 << 20),
        default=(1, 2, 4, 8, 16),
        help="passkey prompt lengths, as comma-separated multiples (>= 1) of the training length",
    )
    e.add_argument(
        "--depths",
        type=_list(float, 0.0, 1.0),
        default=(0.0, 0.25, 0.5, 0.75, 1.0),
        help="passkey depths in [0, 1] (0: at the start of the prompt, 1: at the end)",
    )
    e.add_argument("--trials", type=_positive_int, default=10, help="prompts per (length, depth) cell")
    e.add_argument(
        "--fractions",
        type=_list(float, 0.0, 1.0, lo_open=True),
        default=(0.1, 0.15, 0.2, 0.25, 0.35, 0.5),
        help="kept fractions in (0, 1] for the budget policies (window, streamingllm, tova, h2o)",
    )
    e.add_argument(
        "--thresholds",
        type=_list(float, 0.0, float("inf"), lo_open=True),
        default=(2.0, 4.0, 6.0, 8.0, 16.0, 32.0),
        help="thresholds tau > 0 for the model's own eviction rule (FPA, FoX); each reports its kept fraction",
    )
    e.add_argument("--chunk-size", type=_positive_int, default=256, help="prefill chunk (tokens per forward)")
    e.add_argument("--seed", type=int, default=0, help="seed of the passkey prompts")
    e.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the model runs")
    e.add_argument("--no-progress", action="store_true", help="no progress bars")
    e.set_defaults(func=run_eval)
