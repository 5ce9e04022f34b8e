"""Presets of ``fpa reproduce``: budgets for training and every evaluation, per machine size."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# (name, attention, fpa_mode): the five methods, trained with identical budgets.
METHODS = (
    ("fpa-free", "fpa", "free"),
    ("fpa-walk", "fpa", "walk"),
    ("fox", "fox", "free"),
    ("softmax-rope", "softmax_rope", "free"),
    ("softmax-alibi", "softmax_alibi", "free"),
)


@dataclass(frozen=True)
class ReproducePreset:
    """Everything ``fpa reproduce`` does, for one preset.

    Training: ``steps`` optimizer steps of ``batch_size`` sequences of ``train_len`` tokens, a
    ``mix_rate`` share of them passkey samples at the training length (fpa.tasks.passkey).
    Loss: ``loss_windows`` held-out windows of ``loss_multiple`` x train_len tokens.
    Passkey (full cache): ``passkey_multiples`` x ``depths`` x ``trials``. Cache policies:
    ``cache_multiples`` x ``cache_depths`` x ``cache_trials`` at each kept fraction in
    ``fractions``, prefilled in chunks of ``chunk_size``; thresholds calibrated on
    ``calib_prompts`` held-out prompts per length.
    """

    name: str
    train_len: int
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    mix_rate: float
    corpus_max_bytes: int | None
    loss_multiple: int
    loss_windows: int
    passkey_multiples: tuple[int, ...]
    depths: tuple[float, ...]
    trials: int
    cache_multiples: tuple[int, ...]
    cache_depths: tuple[float, ...]
    cache_trials: int
    fractions: tuple[float, ...]
    chunk_size: int
    calib_prompts: int
    example_multiple: int = 1
    model_preset: str = "tiny"
    data_source: str = "stdlib"
    tokenizer: str = "byte"
    model_overrides: dict = field(default_factory=dict)
    grad_accum: int = 1
    seed: int = 0
    device: str = "cpu"

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS = {
    # CI: every stage, every file, seconds. Too small to learn anything; checks the plumbing.
    "smoke": ReproducePreset(
        name="smoke", train_len=128, steps=4, batch_size=4, lr=2e-3, warmup_steps=1, mix_rate=0.5,
        corpus_max_bytes=400_000, loss_multiple=4, loss_windows=2, passkey_multiples=(1, 2),
        depths=(0.0, 1.0), trials=2, cache_multiples=(2,), cache_depths=(0.5,), cache_trials=2,
        fractions=(0.5,), chunk_size=64, calib_prompts=1,
        model_overrides=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=2, intermediate_size=64)),
    # 2 CPU cores, <= 60 minutes (docs/reproduce.md has the measured time budget). The expensive part
    # of evaluation is the 16x cell (4096-token prompts), hence 3 depths; the cache-policy grids
    # (23 policies x 2 fractions) run at 8x only, at the middle depth.
    "cpu": ReproducePreset(
        name="cpu", train_len=256, steps=400, batch_size=8, lr=3e-3, warmup_steps=40, mix_rate=0.5,
        corpus_max_bytes=20_000_000, loss_multiple=8, loss_windows=8, passkey_multiples=(1, 2, 4, 8, 16),
        depths=(0.0, 0.5, 1.0), trials=10, cache_multiples=(8,), cache_depths=(0.5,),
        cache_trials=10, fractions=(0.25, 0.5), chunk_size=256, calib_prompts=2),
    # The cpu preset with 4x the training steps: does the passkey (copying) appear with more steps?
    # About 12 min of training per FPA model on 2 free cores; run it on a subset (--methods).
    "cpu-long": ReproducePreset(
        name="cpu-long", train_len=256, steps=1600, batch_size=8, lr=3e-3, warmup_steps=160, mix_rate=0.5,
        corpus_max_bytes=20_000_000, loss_multiple=8, loss_windows=8, passkey_multiples=(1, 2, 4, 8, 16),
        depths=(0.0, 0.5, 1.0), trials=10, cache_multiples=(8,), cache_depths=(0.5,),
        cache_trials=10, fractions=(0.25, 0.5), chunk_size=256, calib_prompts=2),
    # The GPU recipe (one node, torchrun; see docs/reproduce.md): the 110M model, 2048-token training.
    "110m": ReproducePreset(
        name="110m", train_len=2048, steps=20_000, batch_size=256, lr=1e-3, warmup_steps=1000, mix_rate=0.02,
        corpus_max_bytes=None, loss_multiple=8, loss_windows=64, passkey_multiples=(1, 2, 4, 8, 16),
        depths=tuple(i / 10 for i in range(11)), trials=20, cache_multiples=(1, 2, 4, 8, 16),
        cache_depths=tuple(i / 10 for i in range(11)), cache_trials=20, fractions=(0.125, 0.25, 0.5),
        chunk_size=2048, calib_prompts=4, grad_accum=8, device="cuda", model_preset="110m", tokenizer="bpe"),
}


def get_preset(name: str) -> ReproducePreset:
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {name!r}")
    return PRESETS[name]
