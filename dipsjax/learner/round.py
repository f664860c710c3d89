"""A learner round: H inner steps from a pulled global version, then a contribution.

Di-PS seed 000 sec. 3 (DiLoCo's two-level scheme): learner ``i`` starts round ``t`` from
``theta_start`` (the global parameters of version ``g`` it last pulled, or where it left
off if it did not take part in the last outer step), runs ``H`` AdamW steps to
``theta_end`` and emits a *contribution*: the pseudo-gradient, the tokens and steps it
consumed, and the version it started from. Two references for the pseudo-gradient:

* ``"start"`` (DiLoCo, Decoupled DiLoCo): ``delta = theta_start - theta_end``;
* ``"server"`` (Di-PS sec. 6: ``Delta_g = theta - theta_g``, formed against the server's
  *current* parameters): ``delta = theta_server_now - theta_end``.

Both are FP32 whatever the compute dtype. ``tokens = sum over steps of batch * seq_len``
(targets trained on), counted exactly on the host; a round ends early, with fewer steps,
if the batch iterator runs out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dipsjax.learner.mesh import put_host
from dipsjax.learner.step import (
    InnerOptimizerConfig,
    InnerStep,
    bits_per_byte,
    params_to_dict,
    trim_host_memory,
)
from dipsjax.model.configs import ModelConfig

Reference = Literal["start", "server"]
REFERENCES: tuple[str, ...] = ("start", "server")

ParamDict = dict[str, Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Contribution:
    """What a learner hands the syncer after a round (Di-PS sec. 5 ``PushRequest`` + data).

    Attributes:
      learner_id: who trained it.
      base_version: the global version the round started from (its last pull).
      tokens: tokens consumed, ``sum batch * seq_len`` over the round's steps (exact).
      steps: inner steps taken (``H``, or fewer if the data ran out).
      delta: the pseudo-gradient, a plain nested dict (string keys) of FP32 arrays with the
        parameters' structure; ``jax.Array`` on the learner's devices unless
        :meth:`to_host` was called.
      reference: ``"start"`` (``theta_start - theta_end``) or ``"server"``
        (``theta_server_now - theta_end``).
      train_loss: mean training loss (nats/token) over the round's steps; NaN if none.
      grad_norm: mean global gradient norm (before clipping) over the round's steps; NaN if
        none, or if the inner step does not report one.
    """

    learner_id: Hashable
    base_version: int
    tokens: int
    steps: int
    delta: ParamDict
    reference: str = "start"
    train_loss: float = math.nan
    grad_norm: float = math.nan

    def to_host(self) -> Contribution:
        """A copy whose ``delta`` leaves are NumPy arrays (fetched from the devices)."""
        return dataclasses.replace(self, delta=jax.device_get(self.delta))


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """Validation result: mean cross-entropy (nats/token), bits per byte and token count."""

    loss: float
    bits_per_byte: float
    tokens: int


def _difference(reference: Any, end: Any) -> Any:
    return jax.tree.map(lambda r, e: r.astype(jnp.float32) - e.astype(jnp.float32), reference, end)


#: ``pseudo_gradient(reference, end) = reference - end`` leaf by leaf in FP32, sharded like
#: the inputs (jitted).
pseudo_gradient = jax.jit(_difference)
# The round's own reference copy is dead after the difference: its buffers are reused.
_pseudo_gradient_in_place = jax.jit(_difference, donate_argnums=0)


def evaluate(
    inner: InnerStep,
    params: nnx.State,
    batches: Iterable[Any],
    *,
    bytes_per_token: float = 1.0,
) -> EvalResult:
    """The task's mean loss over ``batches``, each weighted by what it counts (tokens), and
    bits per byte: ``loss = sum_b loss_b * n_b / sum_b n_b`` (for a language model, the mean
    next-token cross-entropy over every target); ``bits_per_byte = loss / (ln 2 *
    bytes_per_token)`` (``= loss / ln 2`` for byte-level tokens).
    """
    total = 0.0
    tokens = 0
    for batch in batches:
        n = inner.tokens_in(batch)
        tokens += n
        total += float(inner.eval_loss(params, inner.put_batch(batch))) * n
    if tokens == 0:
        raise ValueError("evaluate: no batches given")
    loss = total / tokens
    return EvalResult(loss, bits_per_byte(loss, bytes_per_token=bytes_per_token), tokens)


class Learner:
    """One partition's inner loop: pull a version, run H steps, emit a :class:`Contribution`.

    The parameters and AdamW state live on ``mesh`` (sharded by :class:`InnerStep`); the
    AdamW state persists across rounds, a :meth:`pull` replaces the parameters only.
    Learners on disjoint meshes may run in different threads of one process.

    Example::

        learner = Learner(get_config("tiny"), mesh=make_partition_mesh(), learner_id="a")
        learner.pull(global_params, version=3)
        contribution = learner.run_round(batches, num_steps=64)
    """

    def __init__(
        self,
        config: ModelConfig | Any,
        optimizer: InnerOptimizerConfig | Any = None,
        *,
        mesh: Mesh | None,
        learner_id: Hashable,
        reference: Reference = "start",
        seed: int = 0,
        params: Mapping[str, Any] | nnx.State | None = None,
        version: int = 0,
        donate: bool = True,
    ):
        """Builds the partition's inner step and its starting state.

        Args:
          config: what is trained: a LLaMA model configuration, or a
            :class:`dipsjax.task.Task` (its model, loss and batches).
          optimizer: inner AdamW settings, or an optax transform (``None``: the task's
            own, else the paper's AdamW defaults).
          mesh: the partition mesh (:func:`~dipsjax.learner.make_partition_mesh`), or
            ``None`` for an unsharded single-device learner.
          learner_id: the name under which contributions are reported.
          reference: default pseudo-gradient reference, ``"start"`` or ``"server"``.
          seed: initialisation seed, used when ``params`` is ``None``.
          params: starting parameters (e.g. a pulled global model), copied.
          version: the global version of ``params`` (the first round's base version).
          donate: donate parameter and optimizer buffers to the step (saves memory).
        """
        if reference not in REFERENCES:
            raise ValueError(f"Learner.reference must be one of {REFERENCES}, got {reference!r}")
        self.learner_id = learner_id
        self.reference: Reference = reference
        self.inner = InnerStep(config, optimizer, mesh=mesh, donate=donate)
        self.version = int(version)
        if params is None:
            self._params = self.inner.init_params(seed)
        else:
            self._params = self.inner.put_params(params)
        self._opt_state = self.inner.init_opt_state(self._params)
        trim_host_memory()  # what initialising freed (at 1B: 7.7 GB of its scratch)
        self.steps_done = 0
        self.tokens_done = 0

    @property
    def mesh(self) -> Mesh | None:
        return self.inner.mesh

    @property
    def params(self) -> nnx.State:
        """The live parameters (donated by the next step: copy before keeping them)."""
        return self._params

    def params_dict(self) -> ParamDict:
        """A copy of the parameters as a plain nested dict of arrays (on the devices)."""
        return params_to_dict(self.inner.copy_params(self._params))

    @property
    def opt_state(self) -> Any:
        """The inner (AdamW) state, live (donated by the next step: copy before keeping)."""
        return self._opt_state

    def set_opt_state(self, state: Any) -> None:
        """Replaces the inner state (e.g. from a checkpoint) with arrays of the same tree
        structure and shapes, placed like the current ones."""
        cur = jax.tree.structure(self._opt_state)
        if jax.tree.structure(state) != cur:
            raise ValueError(f"inner state tree {jax.tree.structure(state)} is not {cur}")

        def put(old: jax.Array, new: Any) -> jax.Array:
            if tuple(jnp.shape(new)) != tuple(old.shape):
                raise ValueError(f"inner state leaf of shape {jnp.shape(new)}, want {old.shape}")
            if isinstance(new, jax.Array):
                return jax.device_put(new.astype(old.dtype), old.sharding)
            return put_host(np.asarray(new, old.dtype), old.sharding)

        self._opt_state = jax.tree.map(put, self._opt_state, state)

    def pull(
        self,
        params: Mapping[str, Any] | nnx.State,
        *,
        version: int,
        reset_optimizer: bool = False,
    ) -> None:
        """Adopts global parameters of ``version`` (copied, cast to the parameter dtype).

        The AdamW state is kept (DiLoCo keeps inner optimizer state across rounds) unless
        ``reset_optimizer``.
        """
        self._params = self.inner.put_params(params)
        self.version = int(version)
        if reset_optimizer:
            self._opt_state = self.inner.init_opt_state(self._params)

    def run_round(
        self,
        batches: Iterable[Any],
        *,
        num_steps: int,
        server_params: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        reference: Reference | None = None,
    ) -> Contribution:
        """Runs up to ``num_steps`` inner steps on ``batches`` and returns the contribution.

        Args:
          batches: iterable of int32 ``[batch, seq_len + 1]`` token arrays.
          num_steps: ``H``; fewer steps are taken if ``batches`` runs out.
          server_params: for ``reference="server"``, the server's current parameters (a
            nested dict), or a callable returning them at the end of the round.
          reference: overrides the learner's default pseudo-gradient reference.
        """
        ref = self.reference if reference is None else reference
        if ref not in REFERENCES:
            raise ValueError(f"run_round: reference must be one of {REFERENCES}, got {ref!r}")
        if ref == "server" and server_params is None:
            raise ValueError('run_round: reference="server" needs server_params')
        if not isinstance(num_steps, int) or num_steps < 0:
            raise ValueError(f"run_round: num_steps must be an integer >= 0, got {num_steps!r}")
        start = self.inner.copy_params(self._params) if ref == "start" else None
        iterator = iter(batches)
        losses, norms = [], []
        tokens = 0
        steps = 0
        while steps < num_steps:
            try:
                batch = next(iterator)
            except StopIteration:
                break
            tokens += self.inner.tokens_in(batch)
            self._params, self._opt_state, metrics = self.inner.step(
                self._params, self._opt_state, self.inner.put_batch(batch)
            )
            losses.append(metrics["loss"])
            if "grad_norm" in metrics:
                norms.append(metrics["grad_norm"])
            steps += 1
        if ref == "server":
            given = server_params() if callable(server_params) else server_params
            start = self.inner.put_params(given)
        delta = params_to_dict(_pseudo_gradient_in_place(start, self._params))
        train_loss = float(jnp.mean(jnp.stack(losses))) if losses else math.nan
        grad_norm = float(jnp.mean(jnp.stack(norms))) if norms else math.nan
        self.steps_done += steps
        self.tokens_done += tokens
        return Contribution(
            learner_id=self.learner_id,
            base_version=self.version,
            tokens=tokens,
            steps=steps,
            delta=delta,
            reference=ref,
            train_loss=train_loss,
            grad_norm=grad_norm,
        )

    def evaluate(self, batches: Iterable[Any], *, bytes_per_token: float = 1.0) -> EvalResult:
        """:func:`evaluate` on the learner's current parameters."""
        return evaluate(self.inner, self._params, batches, bytes_per_token=bytes_per_token)
