"""The Kubernetes base in deploy/kubernetes/: rendered with kustomize's rules for the fields it
uses, every document validated (strictly: unknown fields fail) against the Kubernetes 1.33
OpenAPI schemas that the `kubernetes-validate` package ships, and its contents held to the
server they deploy: the container's arguments parse with `ptc serve`'s own parser, the
ConfigMap's server.toml loads with the server's loader, the placeholder Secrets fail closed,
and every name the Deployment refers to is an object of the base."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from kubernetes_validate import utils as kubernetes_validate
from kustomize_subset import render

from sandbox.cli import build_parser
from sandbox.errors import InvalidArgument
from sandbox.server.config import load_config
from sandbox.server.fleet import READINESS_SERVICE

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33"  # hostUsers + procMount: Unmasked need 1.33 (see README.md)

DOCUMENTS = render(BASE)


def _by_kind(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in DOCUMENTS if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _container() -> dict[str, Any]:
    deployment = _by_kind("Deployment", "ptc-server")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_the_base_renders_the_expected_objects_in_one_namespace() -> None:
    assert sorted((d["kind"], d["metadata"]["name"]) for d in DOCUMENTS) == [
        ("ConfigMap", "ptc-server-config"),
        ("Deployment", "ptc-server"),
        ("NetworkPolicy", "ptc-server"),
        ("PodDisruptionBudget", "ptc-server"),
        ("Secret", "ptc-checkpoint-key"),
        ("Secret", "ptc-postgres"),
        ("Secret", "ptc-tenants"),
        ("Service", "ptc-server"),
        ("Service", "ptc-server-headless"),
        ("ServiceAccount", "ptc-server"),
    ]
    for document in DOCUMENTS:
        assert document["metadata"]["namespace"] == "ptc"
        assert document["metadata"]["labels"]["app.kubernetes.io/part-of"] == "ptc-sandbox"
    template = _by_kind("Deployment", "ptc-server")["spec"]["template"]["metadata"]["labels"]
    assert template == {
        "app.kubernetes.io/name": "ptc-server",
        "app.kubernetes.io/part-of": "ptc-sandbox",
    }


@pytest.mark.parametrize(
    "document", DOCUMENTS, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in DOCUMENTS]
)
def test_every_document_validates_against_the_kubernetes_schemas(document: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True) == (
        KUBERNETES_VERSION
    )


def test_the_validator_rejects_what_the_schemas_forbid() -> None:
    """A positive control: the validation above would catch a misspelt field or a wrong type."""
    deployment = _by_kind("Deployment", "ptc-server")
    misspelt: dict[str, Any] = {**deployment, "spec": {**deployment["spec"], "replica": 3}}
    with pytest.raises(kubernetes_validate.ValidationError, match="'replica' was unexpected"):
        kubernetes_validate.validate(misspelt, KUBERNETES_VERSION, strict=True)
    wrong = {**deployment, "spec": {**deployment["spec"], "replicas": "three"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="'three' is not of type"):
        kubernetes_validate.validate(wrong, KUBERNETES_VERSION, strict=True)


def test_the_container_arguments_parse_with_ptc_serve() -> None:
    container = _container()
    args = list(container["args"])
    parsed = build_parser().parse_args(args)
    assert isinstance(parsed, argparse.Namespace)
    assert (parsed.listen, parsed.config, parsed.tenants) == (
        "0.0.0.0:50051",
        "/etc/ptc/server.toml",
        "/etc/ptc/tenants/tenants.toml",
    )
    assert parsed.metrics_listen == "0.0.0.0:9464"  # the container's "metrics" port
    # $(VAR) is expanded by the kubelet from the container's env, which must define it.
    env = {e["name"] for e in container["env"]}
    assert parsed.audit_db == "$(PTC_AUDIT_DB)" and "PTC_AUDIT_DB" in env
    assert parsed.instance_id == "$(POD_NAME)" and "POD_NAME" in env
    assert "PTC_CHECKPOINT_KEY" in env


def test_the_configmap_server_toml_loads_and_the_placeholder_secrets_fail_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "server.toml"
    toml.write_text(_by_kind("ConfigMap", "ptc-server-config")["data"]["server.toml"])
    config = load_config(toml)
    assert (config.pool_size, config.shutdown_grace_s) == (4, 20.0)
    assert (config.checkpoint_interval_s, config.checkpoint_dir) == (
        300.0,
        "/var/lib/ptc/checkpoints",
    )
    deployment = _by_kind("Deployment", "ptc-server")
    assert (
        config.shutdown_grace_s + 2
        < deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    )
    from sandbox.tenants.config import TenantConfigError, load_tenants

    tenants = tmp_path / "tenants.toml"
    tenants.write_text(_by_kind("Secret", "ptc-tenants")["stringData"]["tenants.toml"])
    with pytest.raises(TenantConfigError, match="expected at least one"):
        load_tenants(tenants)
    from sandbox.audit.checkpoints import load_private_key

    # The kubelet sets PTC_CHECKPOINT_KEY to the Secret's value: empty, which the server refuses.
    monkeypatch.setenv(
        "PTC_CHECKPOINT_KEY", _by_kind("Secret", "ptc-checkpoint-key")["stringData"]["key"]
    )
    with pytest.raises(InvalidArgument, match="no checkpoint key"):
        load_private_key(None)


def test_every_reference_of_the_deployment_is_an_object_of_the_base() -> None:
    names = {(d["kind"], d["metadata"]["name"]) for d in DOCUMENTS}
    pod = _by_kind("Deployment", "ptc-server")["spec"]["template"]["spec"]
    assert ("ServiceAccount", pod["serviceAccountName"]) in names
    for volume in pod["volumes"]:
        if "configMap" in volume:
            assert ("ConfigMap", volume["configMap"]["name"]) in names
        if "secret" in volume:
            assert ("Secret", volume["secret"]["secretName"]) in names
    container = _container()
    for item in container["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            secret = _by_kind("Secret", ref["name"])
            assert ref["key"] in secret["stringData"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9464}
    selector = _by_kind("Deployment", "ptc-server")["spec"]["selector"]["matchLabels"]
    for kind, name in (("Service", "ptc-server"), ("PodDisruptionBudget", "ptc-server")):
        spec = _by_kind(kind, name)["spec"]
        assert spec.get("selector", {}).get("matchLabels", spec.get("selector")) == selector


def test_probes_use_the_grpc_health_service() -> None:
    container = _container()
    assert container["livenessProbe"]["grpc"] == {"port": 50051}  # service "": the whole server
    assert container["startupProbe"]["grpc"] == {"port": 50051}
    readiness = container["readinessProbe"]["grpc"]
    assert readiness == {"port": 50051, "service": READINESS_SERVICE}


def test_the_security_context_is_the_measured_minimum() -> None:
    pod = _by_kind("Deployment", "ptc-server")["spec"]["template"]["spec"]
    context = _container()["securityContext"]
    assert context["capabilities"] == {
        "drop": ["ALL"],
        "add": ["SYS_ADMIN", "SETUID", "SETGID", "KILL"],
    }
    assert (context["privileged"], context["readOnlyRootFilesystem"]) == (False, True)
    assert context["seccompProfile"] == {"type": "Unconfined"}
    assert context["procMount"] == "Unmasked"
    assert pod["hostUsers"] is False  # required by Kubernetes for procMount: Unmasked
    assert pod["automountServiceAccountToken"] is False
