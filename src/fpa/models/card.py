"""Model card (README.md) of a saved model folder: configuration, training data, steps,
held-out loss and, when known, passkey retrieval figures."""

from __future__ import annotations

import json
from pathlib import Path

from fpa.data.atomic import atomic_write_text

CARD_FILE = "README.md"
_CONFIG_FIELDS = (
    "attention",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "qk_norm",
    "output_gate",
    "key_shift",
    "key_shift_bias_init",
    "tie_word_embeddings",
)


def _fmt(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def model_card(
    config, training: dict | None = None, passkey: dict | None = None, n_parameters: int | None = None
) -> str:
    """The card's Markdown. ``training``: e.g. fpa.train's summary (steps, train_tokens,
    data_dir, val_loss, final_train_loss) plus ``tokenizer``; ``passkey``: {label: accuracy in
    [0, 1]} (e.g. {"1x": 0.9, "8x": 0.4}) or None when not evaluated."""
    fpa = config.attention == "fpa"
    name = config.attention + (f" ({config.fpa.mode})" if fpa else "")
    lines = [
        "---",
        "library_name: fpa",
        "tags: [fpa, first-passage-attention, causal-lm]",
        "---",
        "",
        f"# FPA language model: {name} attention",
        "",
        "A decoder-only language model from the `fpa` library (First Passage Attention and its",
        "baselines). Load it with `import fpa.models` then `transformers.AutoModelForCausalLM`:",
        "",
        "```python",
        "import fpa.models  # registers the FPA model type with the Auto classes",
        "from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline",
        "",
        'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")',
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        'print(pipeline("text-generation", model=model, tokenizer=tokenizer)("def ", max_new_tokens=20))',
        "```",
        "",
        "## Configuration",
        "",
        "| field | value |",
        "|---|---|",
    ]
    lines += [f"| {k} | {_fmt(getattr(config, k, None))} |" for k in _CONFIG_FIELDS]
    if fpa:
        lines += [f"| fpa.{k} | {_fmt(v)} |" for k, v in config.fpa.to_dict().items()]
    if n_parameters is not None:
        lines.append(f"| parameters | {n_parameters:,} |")
    lines += ["", "## Training", ""]
    if training:
        rows = [
            ("training data", training.get("data_dir")),
            ("tokenizer", training.get("tokenizer")),
            ("steps", training.get("steps")),
            ("training tokens", training.get("train_tokens")),
            ("final training loss", training.get("final_train_loss")),
            ("held-out loss", training.get("val_loss")),
        ]
        lines += ["| | |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in rows if v is not None]
    else:
        lines.append("Not recorded.")
    lines += ["", "## Passkey retrieval", ""]
    if passkey:
        lines += ["| length | accuracy |", "|---|---|"]
        lines += [f"| {k} | {100 * float(v):.0f}% |" for k, v in passkey.items()]
    else:
        lines.append("Not evaluated yet (`fpa eval --model FOLDER` measures it).")
    return "\n".join(lines) + "\n"


def write_model_card(
    folder: str | Path,
    config=None,
    training: dict | None = None,
    passkey: dict | None = None,
    n_parameters: int | None = None,
) -> Path:
    """Write ``folder/README.md`` (the config is read from ``folder/config.json`` if not given)."""
    folder = Path(folder)
    if config is None:
        from fpa.models import FPAConfig

        config = FPAConfig.from_pretrained(folder)
    if n_parameters is None:
        from fpa.models import count_parameters

        n_parameters = count_parameters(config)
    if training is None and (folder / "training.json").is_file():
        training = json.loads((folder / "training.json").read_text()).get("summary")
    path = folder / CARD_FILE
    atomic_write_text(path, model_card(config, training, passkey, n_parameters))
    return path
