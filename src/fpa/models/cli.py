"""``fpa model-info``: parameter count and layout of a preset."""

from __future__ import annotations

import argparse


def _model_info(args: argparse.Namespace) -> int:
    from fpa.models import FPAConfig, count_parameters

    fpa = {"mode": args.fpa_mode} if args.attention == "fpa" else None
    cfg = FPAConfig.from_preset(args.preset, attention=args.attention, fpa=fpa)
    n = count_parameters(cfg)
    print(f"preset={args.preset} attention={cfg.attention}" + (f" fpa={cfg.fpa.to_dict()}" if fpa else ""))
    print(
        f"layers={cfg.num_hidden_layers} hidden={cfg.hidden_size} heads={cfg.num_attention_heads} "
        f"kv_heads={cfg.num_key_value_heads} intermediate={cfg.intermediate_size} vocab={cfg.vocab_size} "
        f"tied={cfg.tie_word_embeddings}"
    )
    print(f"parameters={n} ({n / 1e6:.2f}M)")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``model-info`` subcommand to the ``fpa`` command's subparsers."""
    from fpa.layers.options import FPA_MODES, FPAOptions
    from fpa.models.configuration_fpa import PRESETS, field_choices

    mi = sub.add_parser("model-info", help="parameter count and layout of a preset")
    mi.add_argument("--preset", default="110m", choices=tuple(PRESETS), help="model size preset")
    mi.add_argument("--attention", default="fpa", choices=field_choices("attention"), help="attention type")
    mi.add_argument(
        "--fpa-mode",
        default=FPAOptions().mode,
        choices=FPA_MODES,
        help="FPA field mode (walk: one learned walk; free: field and level heads)",
    )
    mi.set_defaults(func=_model_info)
