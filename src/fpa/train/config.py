"""TrainConfig: every setting of a training run, validated, loadable from JSON or YAML."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from fpa.checks import check_known_keys, check_number, closest_name, non_negative_int, positive_int

DEVICES = ("auto", "cpu", "cuda")
PARALLEL = ("auto", "none", "ddp", "fsdp")
PRECISIONS = ("auto", "fp32", "bf16")
TOKENIZERS = ("byte", "bpe")
# former spellings of TrainConfig keys -> the current ones (rejected with a did-you-mean)
RENAMED = {"evict_tau": "evict_threshold", "live_reg_tau": "live_reg_threshold"}


@dataclass
class TrainConfig:
    """A training run. ``batch_size`` is the GLOBAL number of sequences per optimizer step: it is
    split over ``world_size * grad_accum`` micro-batches, so the same config trains the same model
    on one CPU or on many GPUs. Data come from ``data_dir`` (a ``prepare_corpus`` folder) or, when it
    is None, are prepared on the fly from ``data_source`` into ``out_dir/data``."""

    out_dir: str
    data_dir: str | None = None
    data_source: str | list | None = "stdlib"
    tokenizer: str = "byte"
    vocab_size: int | None = None
    max_bytes: int | None = None
    preset: str = "tiny"
    attention: str = "fpa"
    fpa_mode: str = "walk"  # FPAOptions.mode of the model (attention="fpa"); the default is FPAOptions()'s
    model_overrides: dict = field(default_factory=dict)
    seq_len: int = 256
    batch_size: int = 16
    grad_accum: int = 1
    steps: int = 1000
    lr: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 0
    ckpt_every: int = 200
    keep_checkpoints: int = 2
    log_every: int = 10
    eval_every: int = 200
    eval_batches: int = 4
    device: str = "auto"
    precision: str = "auto"
    parallel: str = "auto"
    mix_task: str | None = None
    mix_rate: float = 0.0
    progress: bool = True
    verify_data: bool = True  # sha256 of every shard at start (one read of the data); False for huge corpora
    tensorboard: bool = False
    live_reg: float = 0.0  # weight of fpa.train.regularizers.LiveFractionRegularizer (0 = off; FPA models only)
    live_reg_threshold: float = 16.0  # the eviction threshold whose soft kept fraction it penalises
    live_reg_from_step: int = 0  # ... from this step on (before it, no live-fraction term)
    evict_threshold: float | None = (
        None  # train with FPAEviction(evict_threshold) inside attention (None = off; FPA only)
    )
    evict_from_step: int = 0  # ... from this step on (before it, attention as usual)
    # a ramp into the rule: from evict_from_step the threshold falls geometrically from
    # evict_threshold_start to evict_threshold over evict_ramp_steps steps (None / 0: no ramp)
    evict_threshold_start: float | None = None
    evict_ramp_steps: int = 0
    # gradients of attention without the rule, the forward pass under it (a hidden key can come back)
    evict_straight_through: bool = False

    def __post_init__(self) -> None:
        self.out_dir = str(self.out_dir)
        if self.data_dir is not None:
            self.data_dir = str(self.data_dir)
        for name in (
            "seq_len",
            "batch_size",
            "grad_accum",
            "steps",
            "ckpt_every",
            "keep_checkpoints",
            "log_every",
            "eval_every",
            "eval_batches",
        ):
            positive_int(name, getattr(self, name))
        for name in ("warmup_steps", "seed", "evict_from_step", "live_reg_from_step"):
            non_negative_int(name, getattr(self, name))
        check_number("live_reg", self.live_reg, low=0)
        check_number("live_reg_threshold", self.live_reg_threshold, low=0, low_open=True)
        if self.evict_threshold is not None:
            check_number("evict_threshold", self.evict_threshold, low=0, what="or None")
            if self.attention not in ("fpa", "fox"):
                raise ValueError(
                    "evict_threshold needs attention='fpa' or 'fox' (it applies the model's own eviction rule), "
                    f"got {self.attention!r}"
                )
        elif self.evict_from_step:
            raise ValueError(f"evict_from_step is {self.evict_from_step} but evict_threshold is not set")
        if not isinstance(self.evict_straight_through, bool):
            raise ValueError(f"evict_straight_through must be true or false, got {self.evict_straight_through!r}")
        if self.evict_straight_through and self.evict_threshold is None:
            raise ValueError(
                "evict_straight_through is set but evict_threshold is not (there is no rule to go through)"
            )
        non_negative_int("evict_ramp_steps", self.evict_ramp_steps)
        if (self.evict_threshold_start is None) != (self.evict_ramp_steps == 0):
            raise ValueError(
                "evict_threshold_start and evict_ramp_steps go together (a ramp needs both; None and 0: none), "
                f"got {self.evict_threshold_start!r} and {self.evict_ramp_steps}"
            )
        if self.evict_threshold_start is not None:
            if self.evict_threshold is None or self.evict_threshold <= 0:
                raise ValueError(f"a ramp needs evict_threshold > 0 to fall to, got {self.evict_threshold!r}")
            check_number(
                "evict_threshold_start",
                self.evict_threshold_start,
                low=self.evict_threshold,
                low_open=True,
                what="(the ramp starts above evict_threshold)",
            )
        if self.live_reg_from_step and self.live_reg == 0:
            raise ValueError(f"live_reg_from_step is {self.live_reg_from_step} but live_reg is 0 (off)")
        if self.live_reg > 0 and self.attention != "fpa":
            raise ValueError(f"live_reg needs attention='fpa' (it regularises FPA's penalties), got {self.attention!r}")
        check_number("lr", self.lr, low=0, low_open=True)
        for name in ("weight_decay", "grad_clip"):
            check_number(name, getattr(self, name), low=0)
        for name in ("min_lr_ratio", "mix_rate", "beta1", "beta2"):
            check_number(name, getattr(self, name), low=0, high=1)
        for name, allowed in (("device", DEVICES), ("parallel", PARALLEL), ("precision", PRECISIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of grad_accum ({self.grad_accum})")
        if self.mix_rate > 0 and not self.mix_task:
            raise ValueError(
                f"mix_rate is {self.mix_rate} but mix_task is not set; name a task from fpa.tasks.TASK_MIXERS"
            )
        if self.data_dir is None and self.data_source is None:
            raise ValueError("set data_dir (a prepared folder) or data_source (to prepare on the fly)")
        if not isinstance(self.model_overrides, dict):
            raise ValueError(f"model_overrides must be a dict, got {type(self.model_overrides).__name__}")
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")
        for name in ("vocab_size", "max_bytes"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name), "or None")
        self._check_model()

    def _check_model(self) -> None:
        """preset, attention, fpa_mode and every model override, before any data or file is touched."""
        from fpa.layers.options import FPA_MODES, FPAOptions
        from fpa.models.configuration_fpa import PRESETS, check_field, check_keys

        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {self.preset!r}")
        check_field("attention", self.attention)
        if self.fpa_mode not in FPA_MODES:
            raise ValueError(f"fpa_mode must be one of {FPA_MODES}, got {self.fpa_mode!r}")
        check_keys(self.model_overrides, "model_overrides")
        if "attention" in self.model_overrides:
            raise ValueError("set attention with the training config's own 'attention' key, not in model_overrides")
        fpa = self.model_overrides.get("fpa")
        if fpa is not None:
            FPAOptions.from_dict(fpa, "model_overrides fpa")
            if isinstance(fpa, FPAOptions) or "mode" in fpa:
                raise ValueError(
                    "set the FPA mode with the training config's own 'fpa_mode' key, not in model_overrides fpa"
                )
            if self.attention != "fpa":
                raise ValueError(f"model_overrides fpa needs attention='fpa', got {self.attention!r}")
        for name, val in self.model_overrides.items():
            check_field(name, val)
        self.model_config(1)  # the whole model config (e.g. hidden_size % heads), before any data is read

    def model_config(self, vocab_size: int):
        """The FPAConfig of this run: the preset with attention, fpa_mode (as ``fpa.mode``) and
        model_overrides; vocab_size defaults to the tokenizer's (``vocab_size``)."""
        from fpa.models.configuration_fpa import FPAConfig

        over = {"vocab_size": vocab_size, **self.model_overrides}
        if "num_attention_heads" in over and "num_key_value_heads" not in over:
            over["num_key_value_heads"] = over["num_attention_heads"]  # the preset's kv heads may not divide
        if over["vocab_size"] < vocab_size:
            raise ValueError(
                f"model_overrides vocab_size ({over['vocab_size']}) is smaller than the tokenizer's ({vocab_size})"
            )
        if self.attention == "fpa":
            over["fpa"] = {**over.get("fpa", {}), "mode": self.fpa_mode}
        return FPAConfig.from_preset(self.preset, attention=self.attention, **over)

    def evict_threshold_at(self, step: int) -> float | None:
        """The eviction threshold the training forward uses at ``step``: None before
        ``evict_from_step`` (or with no rule), then ``evict_threshold``, or on a ramp
        start * (end / start) ** ((step - evict_from_step) / evict_ramp_steps) until it reaches it."""
        if self.evict_threshold is None or step < self.evict_from_step:
            return None
        done = step - self.evict_from_step
        if self.evict_threshold_start is None or done >= self.evict_ramp_steps:
            return self.evict_threshold
        start = self.evict_threshold_start
        return start * (self.evict_threshold / start) ** (done / self.evict_ramp_steps)

    def to_dict(self) -> dict:
        """The config as a JSON-serialisable dict (the inverse of ``from_dict``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """Build a config from ``to_dict`` output.

        Raises:
            ValueError: If ``d`` has a key that is not a TrainConfig field.
        """
        names = sorted(f.name for f in fields(cls))

        def hint(key: str) -> str | None:
            m = RENAMED.get(key) or closest_name(key, names)
            return None if m is None else repr(m)

        check_known_keys(d, names, "the training config", hint=hint)
        return cls(**d)

    @classmethod
    def from_file(cls, path: str | Path, **overrides) -> TrainConfig:
        """Load a .json or .yaml/.yml file; ``overrides`` (non-None values) win over the file."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config file {path} does not exist")
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ValueError("YAML config files need PyYAML (pip install pyyaml); or use JSON") from None
            try:
                d = yaml.safe_load(text)
            except yaml.YAMLError as e:
                raise ValueError(f"config file {path} is not valid YAML: {' '.join(str(e).split())}") from None
        elif path.suffix == ".json":
            try:
                d = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"config file {path} is not valid JSON: {e}") from None
        else:
            raise ValueError(f"config file must end in .json, .yaml or .yml, got {path.name}")
        if not isinstance(d, dict):
            raise ValueError(f"config file {path} must hold a mapping of settings")
        return cls.from_dict({**d, **{k: v for k, v in overrides.items() if v is not None}})
