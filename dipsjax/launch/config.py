"""Run configs: a shipped config by name (``quickstart``: ``dipsjax/configs/NAME.py``) or a
``.py`` file of your own, with ``get_config(arg)`` (ml_collections), overridden from the
command line, validated whole before anything is written
(:mod:`dipsjax.launch.schema`), errors naming the field.

A run config has ``name``, ``sim`` (the fields of :class:`~dipsjax.sim.config.SimConfig`),
optionally the run-level settings of :data:`SPEC_FIELDS` (``heartbeat_interval``, the
followers' data-plane limits: :class:`~dipsjax.runtime.spec.RunSpec` fields of the same
names), ``placement`` (for ``--dry-run``) and ``launch`` (the jobs' requirements and the
cluster executors' settings: :mod:`dipsjax.launch.core`).

Overrides: ``--set sim.learners=2 --set launch.learner.cpu_devices=2``: the value is read
as a Python literal (a string otherwise), must keep the type of the field it replaces, and
the field must exist (except under ``launch``, whose blocks are all optional).
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from dipsjax.sim.config import SimConfig

#: The run config's top-level fields that are :class:`~dipsjax.runtime.spec.RunSpec` fields
#: of the same name: the runtime's settings, not the experiment's (the simulator has no
#: heartbeats of its own processes and no data plane).
SPEC_FIELDS = (
    "heartbeat_interval",
    "dataplane_max_connections",
    "dataplane_max_per_address",
    "dataplane_first_frame_timeout",
    "dataplane_idle_timeout",
    "peer_rpc_cap",
    "standby_leader",
    "leader_lease",
)
TOP = {"name", "sim", "placement", "launch", *SPEC_FIELDS}


def parse_value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def apply_overrides(cfg: Any, overrides: list[str]) -> Any:
    """``cfg`` with each ``path=value`` of ``overrides`` set (errors name the path)."""
    import ml_collections

    for item in overrides:
        path, eq, text = item.partition("=")
        if not eq or not path:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE, e.g. sim.learners=2")
        keys = path.split(".")
        if keys[0] not in TOP:
            raise ValueError(f"--set {path}: unknown field {keys[0]!r}; known {sorted(TOP)}")
        node = cfg
        for i, key in enumerate(keys[:-1]):
            if not hasattr(node, "keys"):
                raise ValueError(f"--set {path}: {'.'.join(keys[:i])} is not a block of fields")
            if key not in node:
                if keys[0] != "launch":
                    raise ValueError(f"--set {path}: {'.'.join(keys[: i + 1])} does not exist")
                node[key] = ml_collections.ConfigDict()
            node = node[key]
        last, value = keys[-1], parse_value(text)
        if not hasattr(node, "keys"):
            raise ValueError(f"--set {path}: {'.'.join(keys[:-1])} is not a block of fields")
        if len(keys) == 1 and keys[0] in ("sim", "launch", "placement"):
            raise ValueError(f"--set {path}: a block; set one of its fields ({path}.FIELD=...)")
        if keys[0] == "sim" and len(keys) == 2 and last not in SIM_FIELDS:
            raise ValueError(f"--set {path}: SimConfig has no field {last!r}")
        if last in node and node[last] is not None and value is not None:
            old = node[last]
            if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if isinstance(old, (list, tuple)) and isinstance(value, (list, tuple)):
                value = type(old)(value)
            nested = isinstance(old, (dict, ml_collections.ConfigDict))
            if type(value) is not type(old) and not nested:
                raise ValueError(
                    f"--set {path}: expected {type(old).__name__} (now {old!r}), got "
                    f"{type(value).__name__} {value!r}"
                )
        try:
            node[last] = value
        except (TypeError, ValueError) as e:  # ml_collections' own type check
            raise ValueError(f"--set {path}: {e}") from None
    return cfg


SIM_FIELDS = {f.name for f in dataclasses.fields(SimConfig)}


def sim_config(
    cfg: Any, method: str | None = None, command: str = "run", plan_only: bool = False
) -> SimConfig:
    """The config validated whole (:func:`dipsjax.launch.schema.validate`: every field's
    rule and the cross-field rules; :class:`~dipsjax.launch.schema.ConfigError` names the
    field, the allowed values and the value) and its ``sim`` block as a :class:`SimConfig`."""
    from dipsjax.launch.schema import validate

    return validate(cfg, method, command, plan_only)


def spec_settings(cfg: Any) -> dict[str, Any]:
    """The :data:`SPEC_FIELDS` the config sets, as ``make_spec``'s keyword arguments (the
    others keep :class:`~dipsjax.runtime.spec.RunSpec`'s defaults)."""
    return {key: cfg[key] for key in SPEC_FIELDS if key in cfg}


def load(name: str, arg: str | None = None, overrides: list[str] | None = None) -> Any:
    """The config ``name`` (a shipped config's name or a path to a ``.py`` file, see
    :func:`dipsjax.configs.path`): its ``get_config(arg)`` with ``overrides`` applied."""
    from dipsjax.sim.experiments import load_experiment

    return apply_overrides(load_experiment(name, arg), list(overrides or []))
