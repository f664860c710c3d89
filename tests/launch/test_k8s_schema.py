"""The offline manifest validator: real JobSet CRD and core schemas, errors named by path."""

import gzip
import json

import pytest

from dipsjax.launch import k8s_schema


def _replicated_job(name: str, replicas: int) -> dict:
    container = {
        "name": name,
        "image": "dipsjax:dev",
        "command": ["dipsjax", name],
        "ports": [{"name": "grpc", "containerPort": 50051}],
        "resources": {"limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 1}},
    }
    pod = {"spec": {"restartPolicy": "OnFailure", "containers": [container]}}
    job = {"completions": 1, "parallelism": 1, "backoffLimit": 4, "template": pod}
    return {"name": name, "replicas": replicas, "template": {"spec": job}}


def _jobset() -> dict:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "dips", "labels": {"app": "dipsjax"}},
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": "dips"},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["leader"]},
            "failurePolicy": {
                "maxRestarts": 3,
                "rules": [
                    {
                        "name": "leaderGaveUp",
                        "action": "FailJobSet",
                        "onJobFailureReasons": ["BackoffLimitExceeded"],
                        "targetReplicatedJobs": ["leader"],
                    }
                ],
            },
            "replicatedJobs": [_replicated_job("leader", 1), _replicated_job("learner", 2)],
        },
    }


def _service() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "dips-leader"},
        "spec": {
            "clusterIP": "None",
            "selector": {"jobset.sigs.k8s.io/replicatedjob-name": "leader"},
            "ports": [{"name": "grpc", "port": 50051, "targetPort": "grpc"}],
        },
    }


def _errors(docs) -> list[str]:
    with pytest.raises(ValueError) as info:
        k8s_schema.validate(docs)
    return str(info.value).splitlines()[1:]


def _containers(jobset: dict, index: int) -> list[dict]:
    return jobset["spec"]["replicatedJobs"][index]["template"]["spec"]["template"]["spec"][
        "containers"
    ]


def test_valid_manifests_pass():
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dips.config"}}
    config["data"] = {"run.json": "{}"}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "dips-token"}}
    secret |= {"type": "Opaque", "data": {"token": "c2VjcmV0"}, "stringData": {"raw": "x y"}}
    k8s_schema.validate([_jobset(), _service(), config, secret])
    k8s_schema.validate([])


def test_bad_type_is_named_by_path():
    jobset = _jobset()
    jobset["spec"]["replicatedJobs"][1]["replicas"] = "two"
    (error,) = _errors([jobset])
    assert error.startswith("JobSet/dips: $.spec.replicatedJobs[1].replicas: ")
    assert "'two' is not of type 'integer'" in error


def test_missing_required_field():
    jobset = _jobset()
    del jobset["spec"]["replicatedJobs"][0]["template"]
    del _containers(jobset, 1)[0]["image"]  # optional in the schema: no error
    del _containers(jobset, 1)[0]["name"]
    assert _errors([jobset]) == [
        "JobSet/dips: $.spec.replicatedJobs[0]: 'template' is a required property",
        "JobSet/dips: $.spec.replicatedJobs[1].template.spec.template.spec.containers[0]: "
        "'name' is a required property",
    ]


def test_unknown_fields_are_rejected_down_to_the_pod_template():
    jobset = _jobset()
    jobset["spec"]["network"]["enableDnsHostnames"] = True  # wrong case
    _containers(jobset, 0)[0]["imagePullPolice"] = "Always"
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"] = {
        "labels": {"role": "leader"},
        "generateName": "x-",  # not in the CRD's embedded ObjectMeta
    }
    jobset["spec"]["bogus"] = 1
    errors = _errors([jobset])
    assert len(errors) == 4
    for path, field in [
        ("$.spec", "bogus"),
        ("$.spec.network", "enableDnsHostnames"),
        ("$.spec.replicatedJobs[0].template.spec.template.metadata", "generateName"),
        ("$.spec.replicatedJobs[0].template.spec.template.spec.containers[0]", "imagePullPolice"),
    ]:
        assert any(e.startswith(f"JobSet/dips: {path}: ") and repr(field) in e for e in errors)


def test_enums_patterns_and_duplicate_keys():
    jobset = _jobset()
    jobset["spec"]["successPolicy"]["operator"] = "Most"
    jobset["spec"]["failurePolicy"]["rules"][0]["action"] = "RestartLeader"
    jobset["spec"]["replicatedJobs"][1]["name"] = "leader"
    _containers(jobset, 0)[0]["resources"]["limits"]["cpu"] = "4 cores"
    errors = "\n".join(_errors([jobset]))
    assert "$.spec.successPolicy.operator: 'Most' is not one of ['All', 'Any']" in errors
    assert "$.spec.failurePolicy.rules[0].action: 'RestartLeader' is not one of" in errors
    assert "$.spec.replicatedJobs[1]: duplicate entry for keys ['name']" in errors
    assert "containers[0].resources.limits.cpu: '4 cores' does not match" in errors


def test_service_with_a_bad_port():
    service = _service()
    service["spec"]["ports"][0]["port"] = "http"
    service["spec"]["ports"].append({"name": "big", "port": 2**31})
    assert _errors([_jobset(), service]) == [
        "Service/dips-leader: $.spec.ports[0].port: 'http' is not of type 'integer'",
        "Service/dips-leader: $.spec.ports[1].port: 2147483648 is not a 'int32'",
    ]


def test_names_secrets_and_kinds():
    jobset = _jobset()
    jobset["metadata"]["name"] = "Dips_run"
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tok"}}
    secret["data"] = {"token": "plain text"}  # must be base64 (stringData takes plain text)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}}
    old = {"apiVersion": "jobset.x-k8s.io/v1alpha1", "kind": "JobSet", "metadata": {}}
    errors = _errors([jobset, secret, job, old, "text", {"apiVersion": "v1", "kind": "Service"}])
    assert errors[0].startswith("JobSet/Dips_run: $.metadata.name: 'Dips_run' does not match")
    assert errors[1] == "Secret/tok: $.data.token: 'plain text' is not a 'byte'"
    assert errors[2].startswith("Job/x: unknown apiVersion/kind 'batch/v1' 'Job' (")
    assert errors[3].startswith("document 3 (JobSet): unknown apiVersion/kind")
    assert errors[4] == "document 4: not a mapping but str"
    assert errors[5] == "document 5 (Service): $: 'metadata' is a required property"
    assert len(errors) == 6


def test_vendored_jobset_schema_spells_out_the_pod_template():
    with gzip.open(k8s_schema._DIR / "jobset-v1alpha2.json.gz") as f:
        text = f.read().decode()
    assert "x-kubernetes-preserve-unknown-fields" not in text
    pod = json.loads(text)["properties"]["spec"]["properties"]["replicatedJobs"]["items"]
    pod = pod["properties"]["template"]["properties"]["spec"]["properties"]["template"]
    assert "containers" in pod["properties"]["spec"]["properties"]
    # The validator's copy is made strict; the vendored file stays as upstream wrote it.
    assert "additionalProperties" not in pod["properties"]["metadata"]
