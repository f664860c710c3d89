"""Offline validation of the launcher's Kubernetes manifests against their real schemas.

No cluster is needed: the schemas are vendored in ``schemas/`` (see its README.md):

- ``jobset.x-k8s.io/v1alpha2`` JobSet: the CRD's ``openAPIV3Schema`` from kubernetes-sigs/jobset
  v0.12.0 (commit f22e565ac3cc3265c7c45ef67ecffdc689af5d77, built against k8s.io/api v0.36.0). It
  spells out the whole batch Job and pod template; its top-level ``metadata`` is checked against
  the core ObjectMeta.
- ``v1`` Service, ConfigMap, Secret (and ObjectMeta): Kubernetes 1.36 JSON schemas, the strict
  variant, from the kubernetes-validate 1.37.0 wheel on PyPI.

What is checked is the schema part of what the API server checks on create with kubectl's
default strict field validation: types, required fields, enums, patterns, bounds, the
int32/int64/byte (base64) formats, unknown fields (the CRD schema gets ``additionalProperties:
false`` wherever it lists ``properties``), unique keys in ``x-kubernetes-list-type: map``/``set``
lists; plus a ``metadata.name`` that is a valid DNS name for the kind. Not checked: CEL rules
(``x-kubernetes-validations``), the checks written in Go (a Service port within 1..65535, the
JobSet webhook's: lengths of generated Job/pod names, ``targetReplicatedJobs`` naming existing
jobs, ...) and defaulting.
"""

import base64
import binascii
import functools
import gzip
import json
import pathlib

import jsonschema
from jsonschema import validators

_DIR = pathlib.Path(__file__).with_name("schemas")
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_JOBSET = "io.x-k8s.jobset.v1alpha2.JobSet"
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# RFC 1035 label: Services, and JobSets (whose Job and pod names must be such labels too).
_DNS1035_LABEL = {"type": "string", "maxLength": 63, "pattern": r"^[a-z]([-a-z0-9]*[a-z0-9])?$"}
_DNS1123_SUBDOMAIN = {"type": "string", "maxLength": 253, "pattern": rf"^{_LABEL}(\.{_LABEL})*$"}

# (apiVersion, kind) -> (its schema in the $defs, the rule for its metadata.name)
KINDS = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): (_JOBSET, _DNS1035_LABEL),
    ("v1", "Service"): ("io.k8s.api.core.v1.Service", _DNS1035_LABEL),
    ("v1", "ConfigMap"): ("io.k8s.api.core.v1.ConfigMap", _DNS1123_SUBDOMAIN),
    ("v1", "Secret"): ("io.k8s.api.core.v1.Secret", _DNS1123_SUBDOMAIN),
}

_FORMATS = jsonschema.FormatChecker(formats=())


@_FORMATS.checks("int32")
def _int32(value) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@_FORMATS.checks("int64")
def _int64(value) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


@_FORMATS.checks("byte", raises=binascii.Error)
def _byte(value) -> bool:
    return not isinstance(value, str) or base64.b64decode(value, validate=True) is not None


def _duplicates(keys):
    seen = set()
    for i, key in enumerate(json.dumps(k, sort_keys=True, default=repr) for k in keys):
        if key in seen:
            yield i, key
        seen.add(key)


def _list_map_keys(validator, names, instance, schema):
    if validator.is_type(instance, "array") and schema.get("x-kubernetes-list-type") == "map":
        keys = [[x.get(n) for n in names] if isinstance(x, dict) else x for x in instance]
        for i, key in _duplicates(keys):
            yield jsonschema.ValidationError(f"duplicate entry for keys {names}: {key}", path=[i])


def _list_type(validator, list_type, instance, schema):
    if validator.is_type(instance, "array") and list_type == "set":
        for i, key in _duplicates(instance):
            yield jsonschema.ValidationError(f"duplicate entry in a set: {key}", path=[i])


_Validator = validators.extend(
    jsonschema.Draft202012Validator,
    {"x-kubernetes-list-map-keys": _list_map_keys, "x-kubernetes-list-type": _list_type},
)


def _strict(schema: dict) -> None:
    """Reject unknown fields: additionalProperties false where the schema lists properties."""
    open_ = "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and not open_:
        schema["additionalProperties"] = False
    for key, value in schema.items():
        if key == "properties":
            for sub in value.values():
                _strict(sub)
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            _strict(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            for sub in value:
                _strict(sub)


@functools.cache
def _defs() -> dict:
    defs = json.loads((_DIR / "core-v1.json").read_text())["$defs"]
    with gzip.open(_DIR / "jobset-v1alpha2.json.gz") as f:
        jobset = json.load(f)
    _strict(jobset)
    jobset["properties"]["metadata"] = {"$ref": f"#/$defs/{_OBJECT_META}"}
    return {**defs, _JOBSET: jobset}


@functools.cache
def _validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    key, name_rule = KINDS[api_version, kind]
    metadata = {"type": "object", "required": ["name"], "properties": {"name": name_rule}}
    schema = {
        "$defs": _defs(),
        "allOf": [
            {"$ref": f"#/$defs/{key}"},
            {"required": ["metadata"], "properties": {"metadata": metadata}},
        ],
    }
    return _Validator(schema, format_checker=_FORMATS)


def _describe(error: jsonschema.ValidationError) -> str:
    message = error.message
    if error.context:  # anyOf/oneOf: say what each alternative wanted
        message += " (" + "; ".join(sorted({e.message for e in error.context})) + ")"
    elif error.validator in ("maxLength", "minLength", "maxItems", "minItems"):
        message += f" ({error.validator} {error.validator_value})"
    return message if len(message) <= 300 else message[:297] + "..."


def validate(docs: list[dict]) -> None:
    """Raise ValueError listing every schema violation in ``docs``, one line per error.

    Each line names the document (kind/name), the JSON path of the bad field and what the schema
    wanted. A document of an apiVersion/kind not in ``KINDS`` is an error too.
    """
    errors = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            errors.append(f"document {i}: not a mapping but {type(doc).__name__}")
            continue
        api_version, kind = doc.get("apiVersion"), doc.get("kind")
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        where = f"{kind}/{name}" if name else f"document {i} ({kind})"
        gvk = (api_version, kind)
        if not all(isinstance(x, str) for x in gvk) or gvk not in KINDS:
            known = ", ".join(f"{a} {k}" for a, k in KINDS)
            errors.append(f"{where}: unknown apiVersion/kind {api_version!r} {kind!r} ({known})")
            continue
        found = _validator(api_version, kind).iter_errors(doc)
        for error in sorted(found, key=lambda e: list(e.absolute_path)):
            errors.append(f"{where}: {error.json_path}: {_describe(error)}")
    if errors:
        raise ValueError(f"{len(errors)} manifest error(s):\n" + "\n".join(errors))
