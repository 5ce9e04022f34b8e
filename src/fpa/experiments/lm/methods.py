"""The methods ``fpa reproduce`` trains: base methods, the core arms and one named configuration
(``MethodSpec``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# base method -> (attention, fpa_mode): every configuration is one of these with overrides
BASES = {
    "fpa-free": ("fpa", "free"),
    "fpa-walk": ("fpa", "walk"),
    "fox": ("fox", "free"),
    "softmax-rope": ("softmax_rope", "free"),
    "softmax-alibi": ("softmax_alibi", "free"),
}
RULE_ARM = "fpa-walk-rule"  # FPA walk trained and served under its own threshold rule
CORE_ARMS = ("fpa-walk", "fox", RULE_ARM)
INFERENCE_RULE_ARMS = ("fpa-walk", "fox")  # trained as usual; their own rule's threshold is tuned at inference
CONTROL = 0.9  # the 1x positive control: passkey accuracy at the training length, as served


@dataclass(frozen=True)
class MethodSpec:
    """One named configuration of a base method: FPAConfig overrides (``model``) and TrainConfig
    overrides (``train``) on top of the preset's recipe. ``arm``: the core arm it belongs to
    (default: the base method's name); the tuning selects one configuration per arm."""

    name: str
    base: str
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    arm: str = ""

    def __post_init__(self) -> None:
        if self.base not in BASES:
            raise ValueError(f"MethodSpec base must be one of {tuple(BASES)}, got {self.base!r}")
        if not self.arm:
            object.__setattr__(self, "arm", self.base)

    @property
    def attention(self) -> str:
        """The ``FPAConfig.attention`` value of the base method."""
        return BASES[self.base][0]

    @property
    def fpa_mode(self) -> str:
        """The FPA mode (``FPAConfig.fpa.mode``, TrainConfig.fpa_mode) of the base method."""
        return BASES[self.base][1]

    @property
    def training_threshold(self) -> float | None:
        """The threshold of the rule it is trained (and therefore served) under, or None."""
        t = self.train.get("evict_threshold")
        return None if t is None else float(t)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a JSON-serialisable dict (the inverse of ``from_dict``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MethodSpec:
        """Rebuild a spec from ``to_dict`` output.

        Args:
            d: A dict with ``name`` and ``base`` and optional ``model`` and ``train`` overrides
                and ``arm``.

        Returns:
            The spec.
        """
        return cls(
            name=d["name"],
            base=d["base"],
            model=dict(d.get("model", {})),
            train=dict(d.get("train", {})),
            arm=d.get("arm", ""),
        )
