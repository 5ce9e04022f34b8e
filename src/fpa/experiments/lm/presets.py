"""Presets of ``fpa reproduce``: what is trained (methods, configurations, seeds) and every budget.

A preset is one of three kinds:

- a **tuning** preset (``tuning`` non-empty): every configuration in ``tuning`` is trained on
  ``tuning_seeds`` and scored on validation data (the first half of the held-out split) and
  validation prompts (``validation_prompt_seed``); per core arm, the best configuration is
  selected, then (FPA walk and FoX served with the full cache) its inference eviction threshold.
  The output is the selection (results.json's "tuning", also ``tuning.json``) and a report.
- a **reported** preset (``core`` non-empty): the selected configuration of each core arm, frozen
  in the preset with its threshold (``thresholds``), on ``seeds`` (paired: a seed fixes the
  initialisation and the data order, the same for every arm), plus ``context`` methods on
  ``context_seeds``. Held-out loss on the second half of the held-out split; passkey prompts from
  ``prompt_seed``. After training, the 1x control gate (``control_min_pass``).
- an **ablation** preset: variants as ``context`` methods, reported without a paired analysis.

The core arms: ``fpa-walk`` and ``fox`` (trained as usual, scored with the full cache and with
their own threshold rule at inference), and ``fpa-walk-rule``: FPA walk trained under its own rule
(``evict_threshold``: FPAEviction(threshold, within_chunks=True) in the training loop) and always
served under that rule, every stage included (fpa.experiments.lm.train_eval.served_rule).

Wall time: fpa.experiments.lm.cli.estimate_minutes (in ``fpa reproduce --help``; docs/reproduce.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypedDict

from fpa.checks import non_negative_int
from fpa.experiments.lm.grid import ABLATIONS, CONTEXT, RULE_CANDIDATE, TUNING_GRID, WALK_CANDIDATE, selected_specs
from fpa.experiments.lm.methods import CORE_ARMS, RULE_ARM, MethodSpec

# The selection frozen for `--preset cpu` when no `--selection` is given: per core arm, the
# configuration label and the threshold (inference rule for fpa-walk and fox; the training rule's
# for fpa-walk-rule, which its label also names), the tuning run's output (results/tune-cpu; a
# test checks they agree). SELECTION_PENDING: set when the grid changes after the committed tuning
# run, so that `fpa reproduce --preset cpu` refuses to report a selection the grid never made.
SELECTED_CPU = {
    "fpa-walk": ("offset=none,init=fox2", 4.0),
    "fox": ("bias=2", 8.0),
    RULE_ARM: ("offset=none,init=fox2,threshold=2,from=1000", 2.0),
}
SELECTION_PENDING = False


@dataclass(frozen=True)
class ReproducePreset:
    """Everything ``fpa reproduce`` does, for one preset (see the module docstring for the kinds).

    Training: ``steps`` optimizer steps of ``batch_size`` sequences of ``train_len`` tokens, a
    ``mix_rate`` share of them task samples at the training length from ``mix_task``
    (fpa.tasks.TASK_MIXERS). Loss: ``loss_windows`` held-out windows of ``loss_multiple`` x
    train_len tokens. Passkey: lengths ``passkey_multiples`` x train_len, ``depths`` x ``trials``
    prompts per length. Eviction: the own rule at each core arm's frozen threshold
    (``thresholds``) on the same prompts, and a window of the same per-length average size; kept
    keys against context length on held-out text of ``growth_lengths`` tokens. Tuning: the own
    rule swept over ``cache_thresholds`` on validation prompts. Gate: after training, every core
    arm must pass the 1x control (>= 90% at the training length, as served) on at least
    ``control_min_pass`` seeds, else nothing is evaluated and, with ``retry_steps``, the preset is
    trained again at that many steps (nothing else changed) in a sibling folder.
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
    thresholds: dict[str, float] = field(default_factory=dict)
    context: tuple[MethodSpec, ...] = ()
    context_seeds: tuple[int, ...] = ()
    tuning: tuple[MethodSpec, ...] = ()
    tuning_seeds: tuple[int, ...] = ()
    tuning_source: str | None = None  # the tuning run this preset's selection came from
    selection_pending: bool = False  # the frozen selection awaits a tuning run: only --selection reports
    cache_thresholds: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0, 32.0)
    threshold_tolerance: float = 0.02  # smallest threshold whose validation accuracy is within this of the full cache's
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
    control_min_pass: int = 0  # core arms: seeds that must pass the 1x control before the evaluation
    retry_steps: int | None = None  # steps of the retraining when the gate fails (None: stop)

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
        missing = [s.name for s in self.core if s.arm in CORE_ARMS and s.name not in self.thresholds]
        if missing:
            raise ValueError(f"preset {self.name!r}: no frozen eviction threshold for {missing}")
        name, what = f"preset {self.name!r}: control_min_pass", f"at most the {len(self.seeds)} seeds"
        if non_negative_int(name, self.control_min_pass, what) > len(self.seeds):
            raise ValueError(f"{name} must be a non-negative int ({what}), got {self.control_min_pass!r}")
        if self.retry_steps is not None and self.retry_steps <= self.steps:
            raise ValueError(
                f"preset {self.name!r}: retry_steps must exceed steps={self.steps}, got {self.retry_steps}"
            )

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


_CPU_CORE, _CPU_THRESHOLDS = selected_specs(SELECTED_CPU)

# The CPU recipe (2 cores): 2-layer models of width 128, 1500 AdamW steps of 32 x 128 byte tokens,
# three sequences in four replaced by a task sample (a passkey prompt, or copy lines "S is S.", a
# third of them). Evaluation: 1x-16x the training length, 20 needle depths x 2 prompts per length.
# Every committed run of this model at 1500 steps learned the copy; at 1000 steps, seeds that had
# not left the no-copy plateau by then stayed on it (the learning rate had decayed).
_CPU = _Recipe(
    train_len=128,
    steps=1500,
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
    model_overrides=dict(num_hidden_layers=2),
)

_SMOKE = dict(
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
    cache_thresholds=(4.0, 16.0),
    growth_lengths=(128, 256, 512),
    model_overrides=dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64
    ),
)


def _control_preset(name: str, spec: MethodSpec) -> ReproducePreset:
    """The CPU recipe's 1x control of one candidate configuration (as its own arm) on seeds 20-29,
    gate 9 of 10."""
    arm = spec.arm or spec.base
    core = (MethodSpec(arm, spec.base, dict(spec.model), dict(spec.train), arm),)
    threshold = spec.training_threshold or 4.0  # unused by the control; a reported preset needs one
    return ReproducePreset(
        name=name,
        core=core,
        thresholds={arm: threshold},
        seeds=tuple(range(20, 30)),
        tuning_seeds=(0, 1, 2),
        eval_batch_size=40,
        control_min_pass=9,
        **_CPU,
    )


PRESETS = {
    # CI: every stage and file, the gate (needing 0 passes: it is measured, never met by 4 steps)
    # and the rule-trained arms, in seconds. Too small to learn anything; checks the plumbing.
    "smoke": ReproducePreset(
        name="smoke",
        core=_CPU_CORE,
        thresholds=_CPU_THRESHOLDS,
        seeds=(5, 6),
        context=(CONTEXT[0], CONTEXT[-1]),
        context_seeds=(5,),
        retry_steps=6,
        **_SMOKE,  # type: ignore[arg-type]
    ),
    "cpu-tune": ReproducePreset(name="cpu-tune", tuning=TUNING_GRID, tuning_seeds=(0, 1, 2), **_CPU),
    "cpu": ReproducePreset(
        name="cpu",
        core=_CPU_CORE,
        thresholds=_CPU_THRESHOLDS,
        seeds=tuple(range(10, 20)),
        tuning_seeds=(0, 1, 2),
        tuning_source="results/tune-cpu",
        selection_pending=SELECTION_PENDING,
        eval_batch_size=40,
        control_min_pass=9,
        retry_steps=2000,
        **_CPU,
    ),
    # The 1x control of each FPA arm's candidate recipe on 10 seeds that are neither tuning nor
    # reported seeds (20-29), before a tuning run: run with --stop-after control.
    "cpu-walk-control": _control_preset("cpu-walk-control", WALK_CANDIDATE),
    "cpu-rule-control": _control_preset("cpu-rule-control", RULE_CANDIDATE),
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
        # FPA walk and FoX only: training under the rule runs FPA's chunked torch path on a GPU
        core=tuple(s for s in _CPU_CORE if s.arm != RULE_ARM),
        thresholds={a: t for a, t in _CPU_THRESHOLDS.items() if a != RULE_ARM},
        seeds=(10, 11, 12),
        growth_lengths=(16384, 32768, 65536, 131072),
        eval_every=1000,
    ),
}
PRESETS["smoke-tune"] = replace(
    PRESETS["smoke"],
    name="smoke-tune",
    core=(),
    thresholds={},
    seeds=(),
    context=(),
    context_seeds=(),
    retry_steps=None,
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
