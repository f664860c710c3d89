"""One validation pass over a run's whole config, before anything is written or started.

The schema is declarative: :data:`TOP`, :data:`SIM`, :data:`REQUIREMENTS`, :data:`SLURM` and
:data:`KUBERNETES` give each field its rule (type, range or allowed set), :data:`CROSS`,
:data:`TOP_CROSS` and :func:`check_partitions` (``launch`` against ``sim``) the rules between
fields. :func:`validate` applies them all and returns the run's
:class:`~dipsjax.sim.config.SimConfig`; the first field that breaks its rule raises
:class:`ConfigError`, which names the field by its dotted path, the allowed values and the
value it got (``config sim.batch_size: must be an integer in [1, 65536], got 0``).

Bounds are sanity bounds, far above every shipped config (the paper-scale ones included),
there to refuse values no run can mean (``learners=5000``, ``heartbeat_interval=1e999``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dipsjax.data.corpus import BUILTIN_CORPORA, corpus_documents
from dipsjax.model.configs import CONFIG_NAMES
from dipsjax.runtime.spec import RunSpec
from dipsjax.sim import config as sim_lib
from dipsjax.syncer import methods as methods_lib

#: Methods each command runs: ``dipsjax run`` (and the launch scripts) only those of the
#: runtime's syncer; ``dipsjax simulate`` every simulated one.
COMMAND_METHODS = {"run": methods_lib.METHODS, "simulate": sim_lib.METHODS}

MAX_LEARNERS = 1024
MAX_FOLLOWERS = 256
NAME_MAX = 64


class ConfigError(ValueError):
    """A config value outside its rule: ``field`` (dotted path), ``allowed``, ``value``."""

    def __init__(self, field: str, allowed: str, value: Any, context: str = "") -> None:
        self.field, self.allowed, self.value = field, allowed, value
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{context}config {field}: must be {allowed}, got {shown}")


@dataclasses.dataclass(frozen=True)
class Rule:
    """A field's rule: ``allowed`` says what is allowed, ``check(value)`` whether it is."""

    allowed: str
    check: Callable[[Any], bool]

    def __call__(self, field: str, value: Any) -> None:
        try:
            ok = self.check(value)
        except (TypeError, ValueError, OverflowError, OSError):  # OSError: a path too long
            ok = False
        if not ok:
            raise ConfigError(field, self.allowed, value)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def Int(lo: int, hi: int) -> Rule:
    return Rule(f"an integer in [{lo}, {hi}]", lambda v: _is_int(v) and lo <= v <= hi)


def Real(lo: float, hi: float, *, open_lo: bool = False) -> Rule:
    left = "(" if open_lo else "["
    return Rule(
        f"a finite number in {left}{lo:g}, {hi:g}]",
        lambda v: _is_real(v) and (lo < v if open_lo else lo <= v) and v <= hi,
    )


def OneOf(options: tuple[Any, ...]) -> Rule:
    return Rule(
        f"one of {tuple(options)}",
        lambda v: type(v) in (str, type(None)) and v in options,
    )


def Optional(rule: Rule) -> Rule:
    return Rule(f"None or {rule.allowed}", lambda v: v is None or rule.check(v))


def Seq(rule: Rule, max_len: int) -> Rule:
    return Rule(
        f"a sequence of at most {max_len} items, each {rule.allowed}",
        lambda v: (
            isinstance(v, (tuple, list)) and len(v) <= max_len and all(rule.check(x) for x in v)
        ),
    )


def Record(*rules: Rule) -> Rule:
    return Rule(
        "(" + ", ".join(r.allowed for r in rules) + ")",
        lambda v: (
            isinstance(v, (tuple, list))
            and len(v) == len(rules)
            and all(r.check(x) for r, x in zip(rules, v, strict=True))
        ),
    )


BOOL = Rule("True or False", lambda v: isinstance(v, bool))
SAFE_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{NAME_MAX - 1}}}")
NAME = Rule(
    f"a safe path component ({SAFE_NAME.pattern}: letters, digits, '.', '_', '-'; no '/', "
    f"no leading '.', at most {NAME_MAX} characters)",
    lambda v: isinstance(v, str) and SAFE_NAME.fullmatch(v) is not None and ".." not in v,
)
TEXT = Rule(
    "a non-empty string of at most 256 printable characters",
    lambda v: isinstance(v, str) and 0 < len(v) <= 256 and v.isprintable(),
)


def _corpus_ok(v: Any) -> bool:
    if not isinstance(v, str) or not v or len(v) > 4096 or "\x00" in v:
        return False
    if v in BUILTIN_CORPORA:
        return True
    folder = Path(v)
    return folder.is_dir() and any(p.is_file() for p in folder.glob("*.txt"))


WORD = Rule(
    "a word of at most 256 characters: letters, digits, '.', '_', ',', '-'",
    lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._,-]{1,256}", v) is not None,
)
CORPUS = Rule(
    f"a built-in corpus {BUILTIN_CORPORA} or an existing folder holding *.txt files",
    _corpus_ok,
)

LEARNER = Int(0, MAX_LEARNERS - 1)
TIME = Real(0, 1e9)
GBPS = Real(0, 1e6, open_lo=True)

IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]{0,255}:[A-Za-z_][\w.]{0,255}")
FUNCTION = Rule(
    "'' or an import path 'package.module:function'",
    lambda v: isinstance(v, str) and (v == "" or IMPORT_PATH.fullmatch(v) is not None),
)


def _task_args_ok(v: Any) -> bool:
    if isinstance(v, Mapping):
        v = tuple(v.items())
    return (
        isinstance(v, (tuple, list))
        and len(v) <= 256
        and all(
            isinstance(kv, (tuple, list)) and len(kv) == 2 and isinstance(kv[0], str) for kv in v
        )
    )


#: Every :class:`SimConfig` field's rule (the ``sim`` block; ``sim.method`` per command).
SIM: dict[str, Rule] = {
    "method": OneOf(sim_lib.METHODS),
    "task": FUNCTION,
    "task_args": Rule("a dict of keyword arguments for the task (at most 256)", _task_args_ok),
    "inner_schedule": OneOf(("constant", "cosine", "linear")),
    "inner_warmup": Int(0, 10**9),
    "inner_decay_steps": Int(0, 10**9),
    "inner_weight_decay": Real(0, 10),
    "inner_clip": Optional(Real(0, 1e9, open_lo=True)),
    # below 1 by more than float32 rounds away (1 - b2 ** t must stay above 0)
    "inner_b1": Real(0, 0.999999),
    "inner_b2": Real(0, 0.999999),
    "inner_eps": Real(1e-30, 1),  # a float32 normal number (0 would divide 0 by 0)
    "outer_optimizer": FUNCTION,
    "learners": Int(1, MAX_LEARNERS),
    "followers": Int(1, MAX_FOLLOWERS),
    "model": OneOf(CONFIG_NAMES),
    "corpus": CORPUS,
    "validation_doc": Optional(TEXT),
    "batch_size": Int(1, 1 << 16),
    "seq_len": Int(1, 1 << 17),
    "chunk_len": Int(1, 1 << 30),
    "inner_steps": Int(1, 1_000_000),
    "inner_lr": Real(0, 10, open_lo=True),
    "outer_lr": Optional(Real(0, 10, open_lo=True)),
    "outer_momentum": Optional(Real(0, 0.999999)),
    "outer_preset": OneOf(("", *sim_lib.OUTER_PRESETS)),
    "outer_clip": OneOf(sim_lib.CLIPS),
    "outer_clip_norm": Real(0, 1e9, open_lo=True),
    "outer_clip_history": Int(1, 100_000),
    "anomaly_penalty": BOOL,
    "token_budget": Int(1, 10**15),
    "eta": Real(0, 10_000),  # percent of step-time heterogeneity
    "speeds": Seq(Real(0, 1000, open_lo=True), MAX_LEARNERS),
    "step_time": Real(0, 1e6, open_lo=True),
    "step_noise": Real(0, 0.999999),
    "virtual_params": Real(0, 1e15, open_lo=True),
    "wire": OneOf(tuple(sim_lib.WIRE_BYTES)),
    "bandwidth_gbps": Seq(GBPS, MAX_LEARNERS),
    "follower_gbps": GBPS,
    "latency": Real(0, 3600),
    "update_seconds": Real(0, 1e6),
    "grace": OneOf(("", "none", "fixed", "dynamic", "quorum")),
    "grace_seconds": Real(0, 86400),
    "quorum": Int(1, MAX_LEARNERS),
    "grace_gamma": Real(0, 0.999999),
    "grace_targeted": BOOL,
    "rda": BOOL,
    "round_token_scale": BOOL,
    "adaptive_steps": BOOL,
    "adaptive_max": Real(1, 1000),
    "refuse_nonfinite": BOOL,
    "overlap": BOOL,
    "adopt": OneOf(("replace", "delta")),
    "alpha": Real(0, 1, open_lo=True),
    "beta": Real(0, 1e6, open_lo=True),
    "warmup": Int(0, 1_000_000),
    "min_max_score": Optional(Real(-1e6, 1e6)),
    "min_sigma_ratio": Real(0, 1e6),
    "max_staleness": Optional(Int(0, 1_000_000)),
    "version_cache": Int(1, 4096),
    "checkpoint_every": Int(1, 1_000_000),
    "deal_chunks": BOOL,
    "schedule": OneOf(("greedy", "optimal")),
    "failures": Seq(Record(LEARNER, TIME, TIME), 10_000),
    "joins": Seq(Record(LEARNER, TIME), 10_000),
    "leaves": Seq(Record(LEARNER, TIME), 10_000),
    "heartbeat_interval": Real(0, 3600, open_lo=True),
    "eval_every": Int(1, 1_000_000),
    "eval_tokens": Int(1, 100_000_000),
    "data_layout": OneOf(("spread", "contiguous")),
    "seed": Int(0, 2**32 - 1),
    "error_feedback": BOOL,
    "feedback_decay": Real(0, 1),
    "wire_topk": Optional(Real(0, 1, open_lo=True)),
}

MAX_CONNECTIONS = 65536

#: The run config's own fields (``launch`` and ``placement`` are checked by their tables);
#: all but ``name`` are :class:`~dipsjax.runtime.spec.RunSpec` fields
#: (:data:`dipsjax.launch.config.SPEC_FIELDS`).
TOP: dict[str, Rule] = {
    "name": NAME,
    "heartbeat_interval": Real(0, 3600, open_lo=True),
    "dataplane_max_connections": Int(1, MAX_CONNECTIONS),
    "dataplane_max_per_address": Int(1, MAX_CONNECTIONS),
    "dataplane_first_frame_timeout": Real(0, 3600, open_lo=True),
    "dataplane_idle_timeout": Real(0, 86400, open_lo=True),
    "peer_rpc_cap": Int(0, MAX_CONNECTIONS),
    "standby_leader": BOOL,
    "leader_lease": Real(0, 3600, open_lo=True),
}

#: Rules between the run config's own fields: (field named, allowed (formatted with the
#: fields), predicate over the fields; those not set at RunSpec's defaults).
TOP_CROSS: tuple[tuple[str, str, Callable[[Mapping[str, Any]], bool]], ...] = (
    (
        "dataplane_max_per_address",
        "at most dataplane_max_connections ({dataplane_max_connections})",
        lambda c: c["dataplane_max_per_address"] <= c["dataplane_max_connections"],
    ),
)

#: :class:`~dipsjax.launch.core.Requirements` fields (``launch.learner``, ``launch.leader``...).
REQUIREMENTS: dict[str, Rule] = {
    "cpus": Int(1, 4096),
    "memory_gb": Optional(Real(0, 1e6, open_lo=True)),
    "cpu_devices": Optional(Int(1, 4096)),
    "accelerators": Optional(Seq(Int(0, 4095), 4096)),
    "platform": OneOf(("cpu", "gpu", "tpu")),
    "processes": Int(1, 4096),
    "mesh_data": Int(1, 4096),
    "mesh_tensor": Int(1, 4096),
}

#: :class:`~dipsjax.launch.slurm.Slurm` fields (``launch.slurm``).
SLURM: dict[str, Rule] = {
    "partition": Optional(WORD),
    "time": Rule(
        "a SLURM time limit [D-]HH:MM:SS",
        lambda v: (
            isinstance(v, str) and re.fullmatch(r"(\d{1,3}-)?\d{1,3}:\d{2}:\d{2}", v) is not None
        ),
    ),
    "account": Optional(WORD),
    "python": TEXT,
    "max_restarts": Int(0, 1000),
    "restart_backoff": Real(0, 3600),
    "sbatch": Seq(TEXT, 256),
    "env": Seq(Record(TEXT, Rule("a string", lambda v: isinstance(v, str))), 256),
}

PORT = Int(1, 65535)

#: :class:`~dipsjax.launch.kubernetes.Kubernetes` fields (``launch.kubernetes``).
KUBERNETES: dict[str, Rule] = {
    "image": TEXT,
    "namespace": Rule(
        "an RFC 1123 label (lowercase letters, digits, '-'; at most 63)",
        lambda v: (
            isinstance(v, str)
            and re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", v) is not None
        ),
    ),
    "leader_port": PORT,
    "follower_port": PORT,
    "coordinator_port": PORT,
    "run_claim": Optional(TEXT),
    "max_restarts": Int(0, 1000),
}

#: Rules between the ``sim`` fields: (field named, allowed, predicate over the fields, whether
#: only a run needs it: a ``--dry-run`` plan of the paper-scale configs reads no data).
CROSS: tuple[tuple[str, str, Callable[[Mapping[str, Any]], bool], bool], ...] = (
    (
        "sim.speeds",
        "empty or one slowdown factor per learner (len == sim.learners)",
        lambda s: len(s["speeds"]) in (0, s["learners"]),
        False,
    ),
    (
        "sim.bandwidth_gbps",
        "empty or one value per learner (len == sim.learners)",
        lambda s: len(s["bandwidth_gbps"]) in (0, s["learners"]),
        False,
    ),
    (
        "sim.quorum",
        "at most sim.learners",
        lambda s: s["quorum"] <= s["learners"],
        False,
    ),
    (
        "sim.grace_targeted",
        "false unless the grace policy is the quorum's (sim.grace 'quorum', or Decoupled "
        "DiLoCo's own) and learners wait for their pull (sim.overlap false)",
        lambda s: (
            not s["grace_targeted"]
            or (
                (s["grace"] == "quorum" or (s["grace"] == "" and s["method"] == "decoupled"))
                and not s["overlap"]
            )
        ),
        False,
    ),
    (
        "sim.adaptive_steps",
        "false when learners overlap (sim.overlap true): the count aims the round a pull "
        "notice starts",
        lambda s: not (s["adaptive_steps"] and s["overlap"]),
        False,
    ),
    (
        "sim.adaptive_steps",
        f"false unless sim.method is one that weighs pushes by tokens "
        f"({', '.join(sim_lib.ADAPTIVE_METHODS)})",
        lambda s: not s["adaptive_steps"] or s["method"] in sim_lib.ADAPTIVE_METHODS,
        False,
    ),
    (
        "sim.chunk_len",
        ">= sim.batch_size * sim.seq_len (a chunk holds at least one batch)",
        lambda s: s["chunk_len"] >= s["batch_size"] * s["seq_len"],
        True,
    ),
    (
        "sim.failures",
        "entries (learner, t_fail, t_back) with learner < sim.learners and t_fail < t_back",
        lambda s: all(f[0] < s["learners"] and f[1] < f[2] for f in s["failures"]),
        False,
    ),
    (
        "sim.joins",
        "entries (learner, t) with learner < sim.learners",
        lambda s: all(e[0] < s["learners"] for e in s["joins"]),
        False,
    ),
    (
        "sim.leaves",
        "entries (learner, t) with learner < sim.learners",
        lambda s: all(e[0] < s["learners"] for e in s["leaves"]),
        False,
    ),
)


def _held_out_ok(s: Mapping[str, Any]) -> bool:
    """``validation_doc`` names a document of the corpus and leaves one to train on."""
    if s["validation_doc"] is None or s.get("task"):
        return True
    docs = corpus_documents(s["corpus"])
    return s["validation_doc"] in docs and len(docs) > 1


@functools.lru_cache(maxsize=32)
def _num_chunks(corpus: str, chunk_len: int, validation_doc: str | None) -> int:
    from dipsjax.data import ByteTokenizer, train_chunks

    chunks = train_chunks(
        corpus, chunk_len=chunk_len, tokenizer=ByteTokenizer(), validation_doc=validation_doc
    )
    return int(chunks.shape[0])


CROSS += (
    (
        "sim.validation_doc",
        "None or the name of one of sim.corpus's documents (not its only one)",
        _held_out_ok,
        False,
    ),
    (
        "sim.chunk_len",
        "at most the training tokens of sim.corpus (a run needs one chunk at least)",
        lambda s: (
            bool(s.get("task"))
            or _num_chunks(s["corpus"], s["chunk_len"], s["validation_doc"]) >= 1
        ),
        True,
    ),
)

SIM_DEFAULTS = {f.name: f.default for f in dataclasses.fields(sim_lib.SimConfig)}
TOP_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunSpec) if f.name in TOP}
SEQUENCES = ("speeds", "bandwidth_gbps", "failures", "joins", "leaves")


def _plain(value: Any) -> Any:
    """ml_collections' blocks and lists as dicts and tuples (what the rules and SimConfig see)."""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_plain(x) for x in value)
    return value


def check_block(where: str, block: Any, table: Mapping[str, Rule]) -> dict[str, Any]:
    """``block``'s fields checked against ``table`` (unknown fields refused)."""
    if not isinstance(block, Mapping):
        raise ConfigError(where, f"a block of fields among {sorted(table)}", block)
    for key, value in block.items():
        if key not in table:
            raise ConfigError(f"{where}.{key}", f"a known field of {where}: {sorted(table)}", value)
        table[key](f"{where}.{key}", value)
    return dict(block)


def validate_sim(
    fields: Mapping[str, Any], command: str = "run", where: str = "sim", plan_only: bool = False
) -> sim_lib.SimConfig:
    """The ``sim`` fields checked (each rule, then :data:`CROSS`; ``plan_only``: those a
    ``--dry-run`` needs) and built."""
    fields = check_block(where, _plain(dict(fields)), SIM)
    methods = COMMAND_METHODS[command]
    method = fields.get("method", SIM_DEFAULTS["method"])
    if method not in methods:
        raise ConfigError(f"{where}.method", f"one of {methods} for `dipsjax {command}`", method)
    full = {**SIM_DEFAULTS, **fields}
    if command == "run" and full["wire"] in sim_lib.SIM_ONLY_WIRES:
        allowed = f"not {full['wire']} for `dipsjax run` (simulator only so far)"
        raise ConfigError(f"{where}.wire", allowed, full["wire"])
    for name, allowed, ok, run_only in CROSS:
        try:
            holds = (run_only and plan_only) or ok(full)
        except (TypeError, ValueError, OSError):
            holds = False
        if not holds:
            field = name.replace("sim.", f"{where}.", 1)
            raise ConfigError(field, allowed, full[name.split(".", 1)[1]])
    try:
        return sim_lib.SimConfig(**fields)
    except (TypeError, ValueError) as e:  # a rule SimConfig has that this table lacks
        raise ConfigError(where, f"a valid SimConfig ({e})", "") from None


def check_launch(block: Any) -> None:
    """The ``launch`` block: per-role requirements and the executors' settings."""
    if block is None:
        return
    block = _plain(block)
    roles = {"learner", "follower", "leader"}
    known = {*roles, "learners", "slurm", "kubernetes"}
    if not isinstance(block, Mapping):
        raise ConfigError("launch", f"a block of fields among {sorted(known)}", block)
    for key, value in block.items():
        if key in roles:
            req = check_block(f"launch.{key}", value, REQUIREMENTS)
            platform = req.get("platform", "cpu")
            if (platform == "cpu") != (req.get("accelerators") is None):
                raise ConfigError(
                    f"launch.{key}.accelerators",
                    f"device ids exactly when launch.{key}.platform is 'gpu' or 'tpu'",
                    req.get("accelerators"),
                )
            for name in ("mesh_data", "mesh_tensor"):
                if key != "learner" and req.get(name, 1) != 1:
                    raise ConfigError(
                        f"launch.{key}.{name}",
                        "1: only a learner's partition has a mesh",
                        req[name],
                    )
        elif key == "learners":
            if not isinstance(value, Mapping):
                raise ConfigError("launch.learners", "{'J': Requirements fields}", value)
            for j, fields in value.items():
                if not str(j).isdigit() or int(str(j)) >= MAX_LEARNERS:
                    raise ConfigError("launch.learners", "keys: learner indices", j)
                check_block(f"launch.learners.{j}", fields, REQUIREMENTS)
        elif key == "slurm":
            check_block("launch.slurm", value, SLURM)
        elif key == "kubernetes":
            check_block("launch.kubernetes", value, KUBERNETES)
        else:
            raise ConfigError(f"launch.{key}", f"a known block: {sorted(known)}", value)


def check_partitions(block: Any, sim: sim_lib.SimConfig) -> None:
    """The rules between ``launch`` and ``sim`` (what :func:`~dipsjax.launch.core.role_jobs`
    needs of them), on each learner's requirements (``launch.learner``, overridden by
    ``launch.learners.J``):

    * ``launch.learners``' keys name learners below ``sim.learners``;
    * a partition's platform and accelerators agree (``launch.learners.J`` merged with
      ``launch.learner``);
    * a partition's devices (``cpu_devices``, or ``len(accelerators)`` on a GPU or TPU,
      times ``processes``) divide ``sim.batch_size``: the batch is split over them
      (over those ``mesh_tensor`` leaves, where it is set);
    * ``mesh_data x mesh_tensor`` divides the partition's devices (``fsdp`` takes the rest);
    * a TPU partition has 1, 2, 4 or 8 chips a process (the shapes a TPU host splits
      into, :data:`~dipsjax.launch.core.TPU_CHIP_BOUNDS`).
    """
    from dipsjax.launch.core import TPU_CHIP_BOUNDS, Requirements

    if block is None:
        return
    block = _plain(block)
    base = dict(block.get("learner") or {})
    per = {int(str(j)): (str(j), dict(f)) for j, f in (block.get("learners") or {}).items()}
    for j, (key, _) in sorted(per.items()):
        if j >= sim.learners:
            raise ConfigError(
                f"launch.learners.{key}",
                f"a learner index below sim.learners ({sim.learners}) as its key",
                j,
            )
    for j in range(sim.learners):
        key, own = per.get(j, (None, {}))
        fields = {**base, **own}

        def where(name: str, key: str | None = key, own: dict = own) -> str:
            return f"launch.learners.{key}.{name}" if name in own else f"launch.learner.{name}"

        platform = fields.get("platform", "cpu")
        accelerators = fields.get("accelerators")
        if (platform == "cpu") != (accelerators is None):
            mine = "platform" in own or "accelerators" in own  # the partition's own block
            raise ConfigError(
                f"launch.learners.{key}.accelerators" if mine else "launch.learner.accelerators",
                f"device ids exactly when {where('platform')} is 'gpu' or 'tpu' (learner {j})",
                accelerators,
            )
        if accelerators is not None:
            fields["accelerators"] = tuple(accelerators)
            if platform == "tpu" and len(accelerators) not in TPU_CHIP_BOUNDS:
                raise ConfigError(
                    where("accelerators"),
                    f"1, 2, 4 or 8 TPU chips a process (learner {j})",
                    accelerators,
                )
        mesh = {k: fields.pop(k) for k in ("mesh_data", "mesh_tensor") if k in fields}
        n = Requirements(**fields).partition_devices
        data, tensor = mesh.get("mesh_data", 1), mesh.get("mesh_tensor", 1)
        if n % (data * tensor):
            named = next((k for k in ("mesh_tensor", "mesh_data") if k in own), None)
            named = named or ("mesh_tensor" if "mesh_tensor" in mesh else "mesh_data")
            raise ConfigError(
                where(named),
                f"such that {where('mesh_data')} x {where('mesh_tensor')} ({data} x {tensor}) "
                f"divides learner {j}'s partition devices ({n}): the fsdp axis takes the rest",
                mesh.get(named, 1),
            )
        if tensor > 1 and sim.batch_size % (n // tensor):
            raise ConfigError(
                where("mesh_tensor"),
                f"such that learner {j}'s batch devices (data x fsdp = {n} / {tensor}) divide "
                f"sim.batch_size ({sim.batch_size}): the batch is split over them",
                tensor,
            )
        if n < 1 or (tensor == 1 and sim.batch_size % n):
            per_process = "accelerators" if platform != "cpu" else "cpu_devices"
            # The field the partition's own block sets, else the one launch.learner sets.
            options = (per_process, "processes")
            named = next((k for k in options if own.get(k) is not None), None)
            named = named or next((k for k in options if base.get(k) is not None), per_process)
            shown = f"len({where(per_process)})" if platform != "cpu" else where(per_process)
            raise ConfigError(
                where(named),
                f"such that learner {j}'s partition devices ({shown} x "
                f"{where('processes')} = {n}) divide sim.batch_size ({sim.batch_size}): "
                "the batch is split over them",
                fields.get(named, 1),
            )


def check_placement(block: Any, learners: int) -> None:
    """The ``placement`` block (``--dry-run``): site names and a [site][learner] matrix."""
    if block is None:
        return
    block = _plain(block)
    sites = Seq(TEXT, 1024)
    rule = {"sites": sites, "bandwidth_gbps": Seq(Seq(GBPS, MAX_LEARNERS), 1024)}
    block = check_block("placement", block, rule)
    n = len(block.get("sites", ()))
    matrix = block.get("bandwidth_gbps", ())
    if matrix and (len(matrix) != n or any(len(row) != learners for row in matrix)):
        raise ConfigError(
            "placement.bandwidth_gbps", f"[{n} sites][{learners} learners] (Gbps)", matrix
        )


def validate(
    cfg: Any, method: str | None = None, command: str = "run", plan_only: bool = False
) -> sim_lib.SimConfig:
    """Every field of a run config (``name``, the run-level settings of :data:`TOP`, ``sim``,
    ``launch``, ``placement``) checked against its rule and the cross-field rules; nothing is
    written. ``method`` (``--method``) replaces ``sim.method``; ``plan_only``: for ``--dry-run``
    (the rules only a run needs are skipped). Returns the run's SimConfig."""
    cfg = _plain(cfg)
    if not isinstance(cfg, Mapping):
        raise ConfigError("config", "a block of fields", cfg)
    known = {*TOP, "sim", "launch", "placement"}
    for key in cfg:
        if key not in known:
            raise ConfigError(key, f"a known field: {sorted(known)}", cfg[key])
    if "name" not in cfg:
        raise ConfigError("name", NAME.allowed, None)
    for key, rule in TOP.items():
        if key in cfg:
            rule(key, cfg[key])
    top = {**TOP_DEFAULTS, **{key: cfg[key] for key in TOP if key in cfg}}
    for name, allowed, ok in TOP_CROSS:
        if not ok(top):
            raise ConfigError(name, allowed.format_map(top), top[name])
    if "sim" not in cfg:
        raise ConfigError("sim", "a block of SimConfig fields", None)
    sim = dict(cfg["sim"]) if isinstance(cfg["sim"], Mapping) else cfg["sim"]
    if not isinstance(sim, dict):
        raise ConfigError("sim", "a block of SimConfig fields", sim)
    if method is not None:
        sim["method"] = method
    out = validate_sim(sim, command, plan_only=plan_only)
    check_launch(cfg.get("launch"))
    check_partitions(cfg.get("launch"), out)
    check_placement(cfg.get("placement"), out.learners)
    return out
