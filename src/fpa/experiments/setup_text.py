"""The report's setup paragraph: what was trained, on what data mix, and how it was evaluated,
from a run's results.json (``results["preset"]`` is the ReproducePreset as a dict)."""

from __future__ import annotations


def how_text(results: dict) -> str:
    p = results["preset"]
    over = f" with {p['model_overrides']}" if p["model_overrides"] else ""
    return (f"Each method is the `{p['model_preset']}` model preset{over}, trained with identical budgets and "
            f"optimizer: {p['steps']} AdamW steps x {p['batch_size']} sequences x {p['train_len']} tokens ({p['tokenizer']} "
            f"tokens; data `{p['data_source']}`; lr {p['lr']}, {p['warmup_steps']} warm-up steps, cosine), on seeds "
            f"{results['seeds']} (a seed fixes the initialisation and the data order, the same for every method). FPA "
            f"layers use the library's default parametrisation (each model's config.json records it: "
            f"`fpa_walk_increment`, `fpa_beta_activation`, `fpa_walk_bias_init`, `fpa_field_lr_multiplier`); the "
            f"`-legacy` ablations use the one before 2026-12-03 (linear increments, softplus beta, field heads at 0.1x "
            f"the learning rate). Passkey is learned only from {mix_text(p)}. Full-cache grid: {p['trials']} "
            f"prompts per (length, depth) cell at depths {p['depths']}; greedy decoding, exact match of the digits. "
            + (cache_text(p) if p["cache_multiples"] else "No cache curves in this preset."))


def mix_text(p: dict) -> str:
    """What was mixed into training, from the preset's mix_task and mix_rate."""
    if p.get("mix_task", "passkey") == "passkey+copy":
        from fpa.tasks.copy import COPY_SHARE

        return (f"samples mixed into training at rate {p['mix_rate']} at the training length only, a share "
                f"{1 - COPY_SHARE:.2f} of them passkey prompts and {COPY_SHARE:.2f} copy lines \"S is S.\" with random "
                f"strings S (passkey prompts in {p['mix_rate'] * (1 - COPY_SHARE):.2f} of all sequences)")
    return f"passkey samples mixed into training at rate {p['mix_rate']} at the training length only"


def cache_text(p: dict) -> str:
    return (f"Cache "
            f"curves: the first {p['cache_trials']} prompts of each cell at {p['cache_multiples']}x and depths "
            f"{p['cache_depths']}, prefilled in chunks of {p['chunk_size']} tokens with the policy applied after every "
            f"chunk and decode step. The models' own rules are swept over fixed thresholds tau in {p['cache_thresholds']} "
            f"and report the kept fraction they achieve (keys held / keys seen, over layers, rows and heads); there is no "
            f"calibration to a target fraction. The budget policies keep round(f x prompt length) keys per head for f in "
            f"{p['fractions']}, on {', '.join(p['budget_methods'])}. The certified rule needs qk-norm, which this preset's "
            f"models do not have.")
