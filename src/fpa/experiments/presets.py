"""Presets of ``fpa reproduce``: what is trained (methods, configurations, seeds) and every budget.

A preset is one of three kinds:

- a **tuning** preset (``tuning`` non-empty): every configuration in ``tuning`` is trained on
  ``tuning_seeds`` and scored on validation data (the first half of the held-out split) and
  validation prompts (``validation_prompt_seed``); per base method, the best configuration is
  selected, then its eviction threshold tau. The output is ``tuning.json`` and a selection report.
- a **reported** preset (``core`` non-empty): the selected configurations of the core methods,
  frozen in the preset with their taus, on ``seeds`` (paired: a seed fixes the initialisation and
  the data order, the same for every method), plus ``context`` methods on ``context_seeds``.
  Held-out loss on the second half of the held-out split; passkey prompts from ``prompt_seed``.
- an **ablation** preset: variants as ``context`` methods, reported without a paired analysis.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypedDict

# base method -> (attention, fpa_mode): every configuration is one of these with overrides
BASES = {
    "fpa-free": ("fpa", "free"),
    "fpa-walk": ("fpa", "walk"),
    "fox": ("fox", "free"),
    "softmax-rope": ("softmax_rope", "free"),
    "softmax-alibi": ("softmax_alibi", "free"),
}


@dataclass(frozen=True)
class MethodSpec:
    """One named configuration of a base method: FPAConfig overrides (``model``) and TrainConfig
    overrides (``train``) on top of the preset's recipe."""

    name: str
    base: str
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.base not in BASES:
            raise ValueError(f"MethodSpec base must be one of {tuple(BASES)}, got {self.base!r}")

    @property
    def attention(self) -> str:
        """The ``FPAConfig.attention`` value of the base method."""
        return BASES[self.base][0]

    @property
    def fpa_mode(self) -> str:
        """The ``FPAConfig.fpa_mode`` value of the base method."""
        return BASES[self.base][1]

    def to_dict(self) -> dict[str, Any]:
        """The spec as a JSON-serialisable dict (the inverse of ``from_dict``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MethodSpec:
        """Rebuild a spec from ``to_dict`` output.

        Args:
            d: A dict with ``name`` and ``base`` and optional ``model`` and ``train`` overrides.

        Returns:
            The spec.
        """
        return cls(name=d["name"], base=d["base"], model=dict(d.get("model", {})), train=dict(d.get("train", {})))


def _spec(
    base: str, label: str = "", model: dict[str, Any] | None = None, train: dict[str, Any] | None = None
) -> MethodSpec:
    return MethodSpec(f"{base}[{label}]" if label else base, base, dict(model or {}), dict(train or {}))


# The tuning grid: four configurations per core method (the same budget for FPA walk and FoX).
# FPA walk: the level offset (none / per head from 0 / per head from 1) at the full field learning
# rate, and the field heads at 0.1x the learning rate with the offset from 1. FoX: the forget-gate
# bias init (0 / 2 / 5) and FoX "Pro" (output gate + QK-norm; the FoX paper's Pro block also has
# an output norm and a data-dependent token shift of keys and values, which this library does not
# build) at bias 5.
TUNING_GRID = (
    _spec("fpa-walk", "offset=none", {"fpa_level_offset": "none"}),
    _spec("fpa-walk", "offset=head0", {"fpa_level_offset": "head", "fpa_level_offset_init": 0.0}),
    _spec("fpa-walk", "offset=head1", {"fpa_level_offset": "head", "fpa_level_offset_init": 1.0}),
    _spec(
        "fpa-walk",
        "offset=head1,field_lr=0.1",
        {"fpa_level_offset": "head", "fpa_level_offset_init": 1.0, "fpa_field_lr_multiplier": 0.1},
    ),
    _spec("fox", "bias=0", {"fox_fgate_bias_init": 0.0}),
    _spec("fox", "bias=2", {"fox_fgate_bias_init": 2.0}),
    _spec("fox", "bias=5", {"fox_fgate_bias_init": 5.0}),
    _spec("fox", "bias=5,pro", {"fox_fgate_bias_init": 5.0, "qk_norm": True, "output_gate": True}),
)

# What the tuning stage selected (results/tune-cpu/tuning.json, `fpa reproduce --preset cpu-tune`):
# the configuration and the eviction threshold of each core method. tests/experiments check that
# these equal the committed tuning output.
SELECTED_CPU = {
    "fpa-walk": ("offset=none", 4.0),
    "fox": ("bias=2", 8.0),
}


def selected_specs(selected: dict[str, tuple[str, float]]) -> tuple[tuple[MethodSpec, ...], dict[str, float]]:
    """(core MethodSpecs named after their base method, {base: tau}) from a selection."""
    by_name = {s.name: s for s in TUNING_GRID}
    specs: list[MethodSpec] = []
    taus: dict[str, float] = {}
    for base, (label, tau) in selected.items():
        s = by_name[f"{base}[{label}]"]
        specs.append(MethodSpec(base, base, dict(s.model), dict(s.train)))
        taus[base] = float(tau)
    return tuple(specs), taus


# FoX as the library configures it by default (bias 5) is context, beside the tuned FoX.
CONTEXT = (
    _spec("fpa-free"),
    _spec("softmax-rope"),
    _spec("softmax-alibi"),
    _spec("fox", "bias=5", {"fox_fgate_bias_init": 5.0}),
)

# Variants studied beside the headline (`--preset cpu-ablations`), each with its seed count in
# its own report: eviction in the training loop and a per-token level offset.
ABLATIONS = (
    _spec("fpa-walk", "evict2", {}, {"evict_tau": 2.0}),
    _spec("fpa-walk", "evict2-late", {}, {"evict_tau": 2.0, "evict_from_step": 500}),
    _spec("fpa-walk", "offset=token", {"fpa_level_offset": "token"}),
    _spec("fpa-walk", "offset=none,evict2", {"fpa_level_offset": "none"}, {"evict_tau": 2.0}),
)


@dataclass(frozen=True)
class ReproducePreset:
    """Everything ``fpa reproduce`` does, for one preset (see the module docstring for the kinds).

    Training: ``steps`` optimizer steps of ``batch_size`` sequences of ``train_len`` tokens, a
    ``mix_rate`` share of them task samples at the training length from ``mix_task``
    (fpa.tasks.TASK_MIXERS). Loss: ``loss_windows`` held-out windows of ``loss_multiple`` x
    train_len tokens. Passkey: lengths ``passkey_multiples`` x train_len, ``depths`` x ``trials``
    prompts per length. Eviction: the own rule at each core method's frozen tau (``taus``) on the
    same prompts, and a window of the same per-length average size; kept keys against context
    length on held-out text of ``growth_lengths`` tokens. Tuning: the own rule swept over
    ``cache_thresholds`` on validation prompts.
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
    chunk_size: int
    core: tuple[MethodSpec, ...] = ()
    seeds: tuple[int, ...] = ()
    taus: dict[str, float] = field(default_factory=dict)
    context: tuple[MethodSpec, ...] = ()
    context_seeds: tuple[int, ...] = ()
    tuning: tuple[MethodSpec, ...] = ()
    tuning_seeds: tuple[int, ...] = ()
    tuning_source: str | None = None  # the tuning run this preset's selection came from
    cache_thresholds: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0, 32.0)
    tau_tolerance: float = 0.02  # tau: smallest whose validation accuracy is within this of the full cache's
    growth_lengths: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768)
    prompt_seed: int = 0
    validation_prompt_seed: int = 1000
    eval_every: int | None = None
    eval_batch_size: int = 2  # passkey prompts decoded at once (all of one length share a size)
    model_preset: str = "tiny"
    data_source: str = "stdlib"
    tokenizer: str = "byte"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    grad_accum: int = 1
    seed: int = 0  # the corpus split
    device: str = "cpu"
    mix_task: str = "passkey"

    def __post_init__(self) -> None:
        for name in ("core", "context", "tuning"):
            specs = getattr(self, name)
            if any(isinstance(s, dict) for s in specs):
                object.__setattr__(
                    self, name, tuple(MethodSpec.from_dict(s) if isinstance(s, dict) else s for s in specs)
                )
        if self.core and not self.seeds:
            raise ValueError(f"preset {self.name!r}: core methods need seeds")
        if self.tuning and not self.tuning_seeds:
            raise ValueError(f"preset {self.name!r}: a tuning grid needs tuning_seeds")
        if set(self.seeds) & set(self.tuning_seeds):
            raise ValueError(
                f"preset {self.name!r}: reported seeds {self.seeds} overlap the tuning seeds {self.tuning_seeds}"
            )
        missing = [s.name for s in self.core if s.base in ("fpa-walk", "fox") and s.name not in self.taus]
        if missing:
            raise ValueError(f"preset {self.name!r}: no frozen eviction tau for {missing}")

    @property
    def is_tuning(self) -> bool:
        """Whether this is a tuning preset (a non-empty ``tuning`` grid)."""
        return bool(self.tuning)

    def to_dict(self) -> dict[str, Any]:
        """The preset as a JSON-serialisable dict (the inverse of ``from_dict``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReproducePreset:
        """Rebuild a preset from ``to_dict`` output, possibly after a JSON round trip.

        Args:
            d: The preset's fields; JSON lists become tuples, method dicts become ``MethodSpec``.

        Returns:
            The preset.
        """
        kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**kwargs)


class _Recipe(TypedDict):
    """The training and evaluation budget shared by the CPU presets."""

    train_len: int
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    mix_rate: float
    mix_task: str
    corpus_max_bytes: int | None
    loss_multiple: int
    loss_windows: int
    passkey_multiples: tuple[int, ...]
    depths: tuple[float, ...]
    trials: int
    chunk_size: int
    eval_every: int | None
    model_overrides: dict[str, Any]


_CPU_CORE, _CPU_TAUS = selected_specs(SELECTED_CPU)

# The CPU recipe (2 cores): 2-layer models of width 64, 1000 AdamW steps of 32 x 128 byte tokens,
# three sequences in four replaced by a task sample (a passkey prompt, or copy lines "S is S.", a
# third of them). Evaluation: 1x-16x the training length, 20 needle depths x 2 prompts per length.
_CPU = _Recipe(
    train_len=128,
    steps=1000,
    batch_size=32,
    lr=3e-3,
    warmup_steps=50,
    mix_rate=0.75,
    mix_task="passkey+copy",
    corpus_max_bytes=20_000_000,
    loss_multiple=8,
    loss_windows=32,
    passkey_multiples=(1, 2, 4, 8, 16),
    depths=tuple(round(i / 19, 4) for i in range(20)),
    trials=2,
    chunk_size=128,
    eval_every=100,
    model_overrides=dict(num_hidden_layers=2, hidden_size=64, intermediate_size=176),
)

PRESETS = {
    # CI: every stage, every file, seconds. Too small to learn anything; checks the plumbing.
    "smoke": ReproducePreset(
        name="smoke",
        train_len=128,
        steps=4,
        batch_size=4,
        lr=2e-3,
        warmup_steps=1,
        mix_rate=0.5,
        corpus_max_bytes=400_000,
        loss_multiple=4,
        loss_windows=2,
        passkey_multiples=(1, 2),
        depths=(0.0, 1.0),
        trials=2,
        chunk_size=64,
        core=_CPU_CORE,
        taus=_CPU_TAUS,
        seeds=(5, 6),
        context=CONTEXT[:1],
        context_seeds=(5,),
        cache_thresholds=(4.0, 16.0),
        growth_lengths=(128, 256, 512),
        model_overrides=dict(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64
        ),
    ),
    "cpu-tune": ReproducePreset(name="cpu-tune", tuning=TUNING_GRID, tuning_seeds=(0, 1, 2), **_CPU),
    "cpu": ReproducePreset(
        name="cpu",
        core=_CPU_CORE,
        taus=_CPU_TAUS,
        seeds=tuple(range(10, 20)),
        tuning_seeds=(0, 1, 2),
        tuning_source="results/tune-cpu",
        eval_batch_size=40,
        **_CPU,
    ),
    # The context methods, on 3 of the reported seeds, in their own folder (results/reproduce-cpu-context):
    # not tuned, not paired.
    "cpu-context": ReproducePreset(
        name="cpu-context", context=CONTEXT, context_seeds=(10, 11, 12), eval_batch_size=40, **_CPU
    ),
    "cpu-ablations": ReproducePreset(
        name="cpu-ablations", context=ABLATIONS, context_seeds=(10, 11, 12), eval_batch_size=40, **_CPU
    ),
    # The GPU recipe (one node, torchrun; docs/reproduce.md): the 110M model, 2048-token training,
    # with the CPU selection (not tuned at this scale).
    "110m": ReproducePreset(
        name="110m",
        train_len=2048,
        steps=20_000,
        batch_size=256,
        lr=1e-3,
        warmup_steps=1000,
        mix_rate=0.02,
        corpus_max_bytes=None,
        loss_multiple=8,
        loss_windows=64,
        passkey_multiples=(1, 2, 4, 8, 16),
        depths=tuple(round(i / 19, 4) for i in range(20)),
        trials=2,
        chunk_size=2048,
        grad_accum=8,
        device="cuda",
        model_preset="110m",
        tokenizer="bpe",
        core=_CPU_CORE,
        taus=_CPU_TAUS,
        seeds=(10, 11, 12),
        growth_lengths=(16384, 32768, 65536, 131072),
        eval_every=1000,
    ),
}
PRESETS["smoke-tune"] = replace(
    PRESETS["smoke"],
    name="smoke-tune",
    core=(),
    taus={},
    seeds=(),
    context=(),
    context_seeds=(),
    tuning=TUNING_GRID[::2],
    tuning_seeds=(0,),
)


def get_preset(name: str) -> ReproducePreset:
    """The preset registered as ``name`` in ``PRESETS``.

    Raises:
        ValueError: If ``name`` is not a preset.
    """
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {name!r}")
    return PRESETS[name]
