"""The learners' inner optimizer settings (no JAX here: the leader process checks a
config without importing it). :func:`dipsjax.learner.step.make_inner_optimizer` builds the
optax chain from them."""

from __future__ import annotations

import dataclasses

_SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True, kw_only=True)
class InnerOptimizerConfig:
    """Inner AdamW settings (defaults: Di-PS seed 000 sec. 13, lr 6e-5; the rest is usual).

    Attributes:
      learning_rate: peak learning rate.
      warmup_steps: linear warmup from 0 to ``learning_rate`` over this many steps.
      schedule: after warmup, ``"constant"``, ``"cosine"`` or ``"linear"`` decay.
      decay_steps: length of the decay after warmup (required > 0 for cosine/linear).
      end_lr_ratio: final learning rate of a decay, as a fraction of ``learning_rate``.
      b1, b2, eps: AdamW moment decay rates and denominator epsilon.
      weight_decay: decoupled weight decay, applied to matrices only (ndim >= 2).
      clip_norm: global gradient-norm clipping threshold; ``None`` disables clipping.

    The schedule counts the learner's own inner steps across rounds (the AdamW state
    persists across rounds; a pull replaces parameters only).
    """

    learning_rate: float = 6e-5
    warmup_steps: int = 0
    schedule: str = "constant"
    decay_steps: int = 0
    end_lr_ratio: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_norm: float | None = 1.0

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not self.learning_rate > 0:
            raise ValueError(f"{name}.learning_rate must be > 0, got {self.learning_rate!r}")
        for field in ("warmup_steps", "decay_steps"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}.{field} must be an integer >= 0, got {value!r}")
        if self.schedule not in _SCHEDULES:
            raise ValueError(f"{name}.schedule must be one of {_SCHEDULES}, got {self.schedule!r}")
        if self.schedule != "constant" and self.decay_steps < 1:
            raise ValueError(
                f"{name}.decay_steps must be >= 1 for schedule={self.schedule!r}, "
                f"got {self.decay_steps}"
            )
        if not 0.0 <= self.end_lr_ratio <= 1.0:
            raise ValueError(f"{name}.end_lr_ratio must be in [0, 1], got {self.end_lr_ratio!r}")
        for field in ("b1", "b2"):
            if not 0.0 <= getattr(self, field) < 1.0:
                raise ValueError(f"{name}.{field} must be in [0, 1), got {getattr(self, field)!r}")
        if not self.eps > 0:
            raise ValueError(f"{name}.eps must be > 0, got {self.eps!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"{name}.weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ValueError(f"{name}.clip_norm must be > 0 or None, got {self.clip_norm!r}")
