"""The learner's inner step: a pure, jitted, sharded AdamW step over a partition mesh.

Inner optimisation (Di-PS seed 000 sec. 3, DiLoCo): each learner runs H steps of

    g_t = clip(grad L(theta_t; x_t), c)        (global-norm clipping, c = clip_norm)
    theta_{t+1} = AdamW(theta_t, g_t; lr_t)    (optax.adamw, lr 6e-5 in the paper, sec. 13)

with ``L`` the mean next-token cross-entropy over a batch ``[batch, seq + 1]`` of int32
tokens (inputs ``x[:, :-1]``, targets ``x[:, 1:]``). Parameters are FP32 master weights;
with ``ModelConfig.dtype = "bfloat16"`` the forward and backward pass run in BF16 and the
gradients arrive in FP32 (they are gradients with respect to the FP32 parameters).

The NNX model is split once (``nnx.split``) into a static graph definition and an
``nnx.State`` of parameters; every function below is pure over pytrees,
``(params, opt_state, batch) -> (params, opt_state, metrics)``, jitted with explicit
``in_shardings``/``out_shardings`` derived from the parameter annotations and with the
parameter and optimizer buffers donated. Without a mesh the same functions are jitted
unsharded on one device: the reference the sharded step must match.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dipsjax.inner import InnerOptimizerConfig
from dipsjax.learner.mesh import (
    BATCH_AXES,
    batch_sharding,
    put_host,
    replicated,
    shardings_for,
)
from dipsjax.model.configs import ModelConfig
from dipsjax.model.llama import LAYERS_AXIS, Llama
from dipsjax.task import activation_sharding, activations_sharded

PyTree = Any


def learning_rate_schedule(config: InnerOptimizerConfig) -> optax.Schedule:
    """Linear warmup to the peak, then constant, cosine or linear decay to ``end_lr_ratio``."""
    peak, end = config.learning_rate, config.learning_rate * config.end_lr_ratio
    if config.schedule == "constant":
        after = optax.constant_schedule(peak)
    elif config.schedule == "cosine":
        after = optax.cosine_decay_schedule(peak, config.decay_steps, alpha=config.end_lr_ratio)
    else:
        after = optax.linear_schedule(peak, end, config.decay_steps)
    if config.warmup_steps == 0:
        return after
    warmup = optax.linear_schedule(0.0, peak, config.warmup_steps)
    return optax.join_schedules([warmup, after], [config.warmup_steps])


def _decay_mask(params: PyTree) -> PyTree:
    """Weight decay on matrices, not on vectors (norm scales): by each layer's own rank,
    so the scales of blocks stacked by ``scan_layers`` stay undecayed."""

    def decays(x: Any) -> Any:
        if isinstance(x, nnx.Variable):
            return x.replace(jnp.ndim(x.get_value()) - _stacked(x) >= 2)
        return x.ndim >= 2

    return jax.tree.map(decays, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """``g * (1 if ||g|| < c else c / ||g||)``: ``optax.clip_by_global_norm``'s rule (its
    trigger, its ``EmptyState``), with the clip taken as one scalar factor that multiplies
    each leaf rather than an elementwise ``g / ||g|| * c``.

    XLA fuses the product into AdamW's moment updates; optax's divide it writes out first,
    a second float32 copy of every gradient: 4.94 GB of the 7.94 GB of scratch XLA plans
    for one ``llama3.2-1b`` step (``benchmarks/learner_memory.py``). The same numbers bit
    for bit when the norm is below ``c``, to float32 rounding (an ulp) when it clips.
    """

    def update_fn(updates: PyTree, state: Any, params: PyTree = None) -> tuple[PyTree, Any]:
        del params
        norm = optax.tree.norm(updates)
        factor = jnp.where(norm < max_norm, jnp.ones_like(norm), max_norm / norm)
        return jax.tree.map(lambda g: g * factor.astype(g.dtype), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def make_inner_optimizer(config: InnerOptimizerConfig) -> optax.GradientTransformation:
    """``clip_by_global_norm(c) -> adamw(schedule)`` as an ``optax.named_chain``."""
    parts: list[tuple[str, optax.GradientTransformation]] = []
    if config.clip_norm is not None:
        parts.append(("clip", clip_by_global_norm(config.clip_norm)))
    parts.append(
        (
            "adamw",
            optax.adamw(
                learning_rate_schedule(config),
                b1=config.b1,
                b2=config.b2,
                eps=config.eps,
                weight_decay=config.weight_decay,
                mask=_decay_mask,
            ),
        )
    )
    return optax.named_chain(*parts)


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-token ``-log softmax(logits)[target]`` in nats, float32, shape of ``targets``."""
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return lse - picked


def split_batch(batch: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``[batch, seq + 1]`` tokens -> inputs ``[:, :-1]`` and targets ``[:, 1:]``."""
    return batch[:, :-1], batch[:, 1:]


def check_batch(batch: Any) -> tuple[int, int]:
    """Validates a token batch's shape and dtype; returns ``(batch, seq_len)``."""
    if not hasattr(batch, "shape") or not hasattr(batch, "dtype"):
        batch = np.asarray(batch)
    shape = tuple(batch.shape)
    if len(shape) != 2 or shape[1] < 2 or shape[0] < 1:
        raise ValueError(
            f"a batch must be int32 [batch, seq_len + 1] with seq_len >= 1, got {shape}"
        )
    if not jnp.issubdtype(batch.dtype, jnp.integer):
        raise ValueError(f"a batch must hold integer token ids, got dtype {batch.dtype}")
    return shape[0], shape[1] - 1


def tokens_in(batch: Any) -> int:
    """Tokens a step trains on: ``batch * seq_len`` (the target count), an exact int."""
    b, s = check_batch(batch)
    return b * s


def _stacked(variable: Any) -> bool:
    """Whether a parameter is stacked over layers (``ModelConfig.scan_layers``): its first
    logical axis is :data:`~dipsjax.model.llama.LAYERS_AXIS`."""
    names = (
        variable.get_metadata().get("out_sharding") if isinstance(variable, nnx.Variable) else None
    )
    return bool(names) and names[0] == LAYERS_AXIS


def _layer(x: Any, i: int) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
    return x[i]


def _insert(tree: dict, path: tuple, leaf: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = leaf


def params_to_dict(params: nnx.State) -> dict[str, Any]:
    """An ``nnx.State`` as a plain nested dict with string keys (layer ``i`` -> ``"i"``).

    A parameter stacked over layers (``ModelConfig.scan_layers``: first logical axis
    ``layers``) at ``(a, *rest)`` appears as one array a layer at ``(a, "i", *rest)``,
    ``i`` counting from 0: the dict of the unrolled model, which is what the syncer,
    checkpoints and exports see whichever way a learner stores its blocks. Its layers are
    slices (views of a host array, copies of a device array; shapes of an abstract one).
    """
    out: dict[str, Any] = {}
    for path, variable in nnx.to_flat_state(params):
        keys = tuple(str(k) for k in path)
        value = variable.get_value() if isinstance(variable, nnx.Variable) else variable
        if _stacked(variable):
            for i in range(value.shape[0]):
                _insert(out, (keys[0], str(i), *keys[1:]), _layer(value, i))
        else:
            _insert(out, keys, value)
    return out


def _stack(leaves: list[Any]) -> Any:
    if all(isinstance(x, jax.Array) for x in leaves):
        return jnp.stack(leaves)
    return np.stack([np.asarray(x) for x in leaves])


def params_from_dict(template: nnx.State, tree: Mapping[str, Any]) -> nnx.State:
    """Inverse of :func:`params_to_dict` onto ``template``'s structure (keys and shapes checked).

    Leaves are taken as given (no copy, no cast; the layers of a parameter stacked over
    layers are stacked, a copy): see :meth:`InnerStep.put_params`.
    """

    def match(tmpl: Any, given: Any, path: str) -> Any:
        if isinstance(tmpl, Mapping):
            if not isinstance(given, Mapping):
                raise ValueError(f"parameter tree: expected a dict at {path or '/'}")
            keys = {str(k) for k in tmpl}
            if set(given) != keys:
                missing, extra = sorted(keys - set(given)), sorted(set(given) - keys)
                raise ValueError(
                    f"parameter tree at {path or '/'}: missing keys {missing}, unexpected {extra}"
                )
            return {k: match(v, given[str(k)], f"{path}/{k}") for k, v in tmpl.items()}
        if tuple(np.shape(given)) != tuple(tmpl.shape):
            raise ValueError(
                f"parameter {path}: expected shape {tuple(tmpl.shape)}, "
                f"got {tuple(np.shape(given))}"
            )
        return given

    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), template)
    given = match(params_to_dict(shapes), tree, "")
    pure: dict[Any, Any] = {}
    for path, variable in nnx.to_flat_state(template):
        keys = tuple(str(k) for k in path)

        def at(keys: tuple[str, ...]) -> Any:
            node = given
            for key in keys:
                node = node[key]
            return node

        if _stacked(variable):
            n = variable.get_value().shape[0]
            leaf = _stack([at((keys[0], str(i), *keys[1:])) for i in range(n)])
        else:
            leaf = at(keys)
        _insert(pure, tuple(path), leaf)
    out = jax.tree.map(lambda x: x, template)
    nnx.replace_by_pure_dict(out, pure)
    return out


def chunked_cross_entropy(
    hidden: jax.Array, targets: jax.Array, logits_of: Any, chunk: int
) -> jax.Array:
    """:func:`cross_entropy` of ``logits_of(hidden)`` taken ``chunk`` positions of the
    sequence at a time (``hidden [batch, seq, d]``, ``targets [batch, seq]``; the sequence
    padded to a multiple of ``chunk``): a scan whose step is rematerialised, so the
    forward keeps one chunk's ``[batch, chunk, vocab]`` logits at a time and the backward
    recomputes each chunk's instead of keeping them all. The batch axis stays whole (its
    sharding is kept). Per-token nats ``[batch, seq]``, float32."""
    b, s, d = hidden.shape
    pad = -s % chunk
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, -1, chunk, d)
    t = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, -1, chunk)

    @jax.checkpoint
    def one(hc: jax.Array, tc: jax.Array) -> jax.Array:
        return cross_entropy(logits_of(hc), tc)

    nll = jax.lax.map(lambda xs: one(*xs), (jnp.moveaxis(h, 1, 0), jnp.moveaxis(t, 1, 0)))
    return jnp.moveaxis(nll, 0, 1).reshape(b, -1)[:, :s]


def lm_loss(model: Any, batch: jax.Array) -> jax.Array:
    """The language model's loss: mean next-token cross-entropy (nats/token) of a token
    batch ``[batch, seq + 1]``, its activations constrained to the partition's
    :func:`~dipsjax.task.activation_sharding`. With the model's ``config.loss_chunk`` set,
    the logits are never whole (:func:`chunked_cross_entropy`)."""
    inputs, targets = split_batch(batch)
    chunk = getattr(getattr(model, "config", None), "loss_chunk", 0)
    if not chunk:
        return jnp.mean(
            cross_entropy(model(inputs, activation_sharding=activation_sharding()), targets)
        )
    hidden = model.hidden(inputs, activation_sharding=activation_sharding())
    return jnp.mean(chunked_cross_entropy(hidden, targets, model.logits, chunk))


@functools.cache
def lm_model(config: ModelConfig) -> Any:
    """The LLaMA factory ``model(rngs)`` of ``config`` (one object per configuration: the
    compiled inner steps are shared by every learner of equal configuration)."""

    def model(rngs: nnx.Rngs) -> Llama:
        return Llama(config, rngs=rngs)

    return model


@dataclasses.dataclass(frozen=True)
class _InnerFunctions:
    tx: optax.GradientTransformation
    graphdef: nnx.GraphDef
    abstract_params: nnx.State
    param_shardings: Any
    opt_shardings: Any
    batch_sharding: Any
    activation_sharding: Any
    step: Any
    loss_and_grads: Any
    eval_loss: Any
    init_opt_state: Any
    init_params: Any
    copy: Any


def _split_params(model: Any, what: str) -> tuple[nnx.GraphDef, nnx.State]:
    """``nnx.split(model, nnx.Param)``; a clear error for a model with other state."""
    _, _, *rest = nnx.split(model, nnx.Param, ...)
    others = [x for r in rest for x in jax.tree.leaves(r)]
    if others:
        raise ValueError(
            f"{what}: the model holds state other than nnx.Param ({len(others)} leaves, e.g. "
            f"{jax.tree.structure(rest)}); dipsjax trains, syncs and exports nnx.Param leaves "
            "only: build it without dropout RNGs or batch statistics"
        )
    return nnx.split(model, nnx.Param)


@functools.lru_cache(maxsize=64)
def _inner_functions(
    factory: Any,
    loss: Any,
    optimizer: InnerOptimizerConfig | optax.GradientTransformation,
    mesh: Mesh | None,
    donate: bool,
) -> _InnerFunctions:
    """Builds (once per model factory, loss, optimizer and mesh) the jitted inner functions.

    Cached so that learners of one configuration on equal meshes (e.g. the simulator's many
    unsharded learners) share compiled executables; ``jax.jit`` functions are thread-safe.
    """
    if isinstance(optimizer, InnerOptimizerConfig):
        tx = make_inner_optimizer(optimizer)
    else:
        tx = optimizer
    graphdef, abstract_params = _split_params(
        nnx.eval_shape(lambda: factory(nnx.Rngs(0))), "the task's model"
    )
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    act = None if mesh is None else NamedSharding(mesh, PartitionSpec(BATCH_AXES))

    def loss_fn(params, batch):
        with activations_sharded(act):
            return loss(nnx.merge(graphdef, params), batch)

    def train_step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": value, "grad_norm": optax.tree.norm(grads)}

    def init_params(seed):
        return nnx.split(factory(nnx.Rngs(jax.random.key(seed))), nnx.Param)[1]

    def loss_and_grads(params, batch):
        return jax.value_and_grad(loss_fn)(params, batch)

    def eval_loss(params, batch):
        return jnp.asarray(loss_fn(params, batch), jnp.float32)

    def copy(tree):
        return jax.tree.map(jnp.copy, tree)

    donated = (0, 1) if donate else ()
    if mesh is None:
        # Fresh state is committed to the device, as the step's outputs are: otherwise
        # the second step (its inputs committed) compiles the step again.
        here = jax.sharding.make_single_device_sharding(jax.local_devices()[0])
        return _InnerFunctions(
            tx=tx,
            graphdef=graphdef,
            abstract_params=abstract_params,
            param_shardings=None,
            opt_shardings=None,
            batch_sharding=None,
            activation_sharding=None,
            step=jax.jit(train_step, donate_argnums=donated),
            loss_and_grads=jax.jit(loss_and_grads),
            eval_loss=jax.jit(eval_loss),
            init_opt_state=jax.jit(tx.init, out_shardings=here),
            init_params=jax.jit(init_params, out_shardings=here),
            copy=jax.jit(copy, out_shardings=here),
        )
    ps = shardings_for(abstract_params, mesh)
    os_ = shardings_for(abstract_opt, mesh)
    bs = batch_sharding(mesh)
    rep = replicated(mesh)
    return _InnerFunctions(
        tx=tx,
        graphdef=graphdef,
        abstract_params=abstract_params,
        param_shardings=ps,
        opt_shardings=os_,
        batch_sharding=bs,
        activation_sharding=act,
        step=jax.jit(
            train_step,
            in_shardings=(ps, os_, bs),
            out_shardings=(ps, os_, {"loss": rep, "grad_norm": rep}),
            donate_argnums=donated,
        ),
        loss_and_grads=jax.jit(loss_and_grads, in_shardings=(ps, bs), out_shardings=(rep, ps)),
        eval_loss=jax.jit(eval_loss, in_shardings=(ps, bs), out_shardings=rep),
        init_opt_state=jax.jit(tx.init, in_shardings=(ps,), out_shardings=os_),
        init_params=jax.jit(init_params, out_shardings=ps),
        copy=jax.jit(copy, in_shardings=(ps,), out_shardings=ps),
    )


def trim_host_memory() -> bool:
    """Hands the C heap's free pages back to the OS (glibc's ``malloc_trim(0)``; whether
    it could: elsewhere it does nothing). Buffers XLA:CPU freed otherwise stay in the
    process's resident memory, where a large model's step then finds no room: measured at
    ``llama3.2-1b`` on CPU, 13.1 GB resident after initialising 4.9 GB of parameters,
    5.4 GB after this."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False


class InnerStep:
    """The jitted inner-loop functions of one partition (or unsharded, ``mesh=None``).

    Attributes:
      config: what is trained: a LLaMA :class:`~dipsjax.model.configs.ModelConfig` (the
        built-in language model) or a :class:`dipsjax.task.Task` (its model and loss).
      mesh: the partition mesh, or ``None`` for the single-device reference.
      graphdef: the static NNX graph definition.
      abstract_params: ``nnx.State`` of ``ShapeDtypeStruct`` with partition metadata.
      tx: the inner optimizer (:func:`make_inner_optimizer`, or the task's own).
      param_shardings, opt_shardings, batch_sharding: ``NamedSharding`` trees (``None``
        without a mesh).

    Functions (all jitted, all pure): :meth:`step`, :meth:`loss_and_grads`,
    :meth:`eval_loss`, :meth:`init_params`, :meth:`init_opt_state`.

    Example::

        mesh = make_partition_mesh(jax.devices()[:4], tensor=2)
        inner = InnerStep(get_config("tiny"), InnerOptimizerConfig(), mesh=mesh)
        params = inner.init_params(0)
        opt_state = inner.init_opt_state(params)
        params, opt_state, metrics = inner.step(params, opt_state, inner.put_batch(tokens))
    """

    def __init__(
        self,
        config: ModelConfig | Any,
        optimizer: InnerOptimizerConfig | optax.GradientTransformation | None = None,
        *,
        mesh: Mesh | None,
        donate: bool = True,
    ):
        self.config = config
        self.is_lm = isinstance(config, ModelConfig)
        if self.is_lm:
            factory, loss = lm_model(config), lm_loss
        else:
            factory, loss = config.model, config.loss
            if optimizer is None:
                optimizer = config.inner_optimizer
        self.optimizer = optimizer or InnerOptimizerConfig()
        self.mesh = mesh
        fns = _inner_functions(factory, loss, self.optimizer, mesh, donate)
        self.tx = fns.tx
        self.graphdef, self.abstract_params = fns.graphdef, fns.abstract_params
        self.param_shardings, self.opt_shardings = fns.param_shardings, fns.opt_shardings
        self.batch_sharding = fns.batch_sharding
        self.activation_sharding = fns.activation_sharding
        self.step = fns.step
        self.loss_and_grads = fns.loss_and_grads
        self.eval_loss = fns.eval_loss
        self.init_opt_state = fns.init_opt_state
        self._init_params = fns.init_params
        self._copy = fns.copy
        self._param_dtypes = jax.tree.map(lambda x: x.dtype, self.abstract_params)

    def tokens_in(self, batch: Any) -> int:
        """What ``batch`` counts in the books (a token batch: ``batch * seq_len``)."""
        return tokens_in(batch) if self.is_lm else self.config.tokens_in(batch)

    def init_params(self, seed: int = 0) -> nnx.State:
        """Freshly initialised parameters (``model(nnx.Rngs(seed))``), sharded."""
        return self._init_params(jnp.asarray(seed, jnp.uint32))

    def copy_params(self, params: nnx.State) -> nnx.State:
        """A copy in new buffers (survives donation of ``params`` to :meth:`step`)."""
        return self._copy(params)

    def put_params(self, tree: Mapping[str, Any] | nnx.State) -> nnx.State:
        """Parameters from a nested dict (or ``State``) as new sharded buffers in ``param_dtype``.

        Never aliases the input: the result can be donated to :meth:`step` safely.
        """
        if not isinstance(tree, nnx.State):
            tree = params_from_dict(self.abstract_params, tree)

        def put(x: Any, dtype: Any, sharding: Any) -> jax.Array:
            if isinstance(x, jax.Array):
                x = x if x.dtype == dtype else x.astype(dtype)
                return jax.device_put(x, sharding, may_alias=False)
            return put_host(np.asarray(x, dtype=dtype), sharding)

        if self.param_shardings is None:
            device = jax.local_devices()[0]
            return jax.tree.map(lambda x, dt: put(x, dt, device), tree, self._param_dtypes)
        return jax.tree.map(put, tree, self._param_dtypes, self.param_shardings)

    def put_batch(self, batch: Any) -> Any:
        """A host batch on the partition, every leaf split over ``data`` along its leading
        axis (a token batch ``[batch, seq + 1]`` as int32)."""
        if self.is_lm:
            check_batch(batch)
            if not isinstance(batch, jax.Array):
                batch = np.asarray(batch, dtype=np.int32)
        else:
            check_tree_batch(batch)
        where = jax.local_devices()[0] if self.batch_sharding is None else self.batch_sharding

        def put(x: Any) -> jax.Array:
            if isinstance(x, jax.Array) or self.batch_sharding is None:
                return jax.device_put(x, where)
            return put_host(np.asarray(x), where)

        return jax.tree.map(put, batch)


def check_tree_batch(batch: Any) -> int:
    """Checks that a task's batch is a pytree of arrays sharing a leading (batch) axis;
    returns its size."""
    leaves = jax.tree.leaves(batch)
    if not leaves:
        raise ValueError("a batch must be a pytree of arrays; got one with no leaves")
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
    if None in sizes or len(sizes) != 1:
        raise ValueError(
            "a batch's leaves must share their leading (batch) axis; got shapes "
            f"{[np.shape(x) for x in leaves]}"
        )
    return sizes.pop()


def bits_per_byte(loss_nats: float, *, bytes_per_token: float = 1.0) -> float:
    """``bpb = loss / (ln 2 * bytes_per_token)``; byte-level tokens: ``loss / ln 2``."""
    return loss_nats / (math.log(2.0) * bytes_per_token)
