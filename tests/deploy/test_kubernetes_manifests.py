"""The Kubernetes base in deploy/kubernetes/ and its overlays: rendered with kustomize's rules for
the fields they use, every document validated (strictly: unknown fields fail) against the
Kubernetes 1.33 OpenAPI schemas that the `kubernetes-validate` package ships, and their contents
held to the server they deploy: the container's arguments parse with `ptc serve`'s own parser,
the ConfigMap's server.toml loads with the server's loader, the placeholder Secrets fail closed,
every name the Deployment refers to is an object of the base, and the pod's memory limit covers
every sandbox at its memory ceiling plus the server. Running each variant in a container:
test_kubernetes_variants.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from kubernetes_validate import utils as kubernetes_validate

from sandbox.cli import build_parser
from sandbox.errors import InvalidArgument
from sandbox.server.config import load_config
from sandbox.server.fleet import READINESS_SERVICE
from tests.deploy.k8s_variants import (
    SERVER_RESERVE_BYTES,
    VARIANTS,
    container,
    example_tenants,
    pod_spec,
    quantity_bytes,
    rendered,
    server_toml,
)
from tests.deploy.kustomize_subset import render
from tests.deploy.variants_table import read_table, render_table

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33"  # hostUsers + procMount: Unmasked need 1.33 (see README.md)

DOCUMENTS = render(BASE)
RENDERED = {name: rendered(name) for name in VARIANTS}


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
    "document",
    [d for documents in RENDERED.values() for d in documents],
    ids=[f"{v}:{d['kind']}/{d['metadata']['name']}" for v, ds in RENDERED.items() for d in ds],
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
    # The fleet reaches it at the pod's IP (a pod's host name does not resolve).
    assert parsed.advertise == "$(POD_IP):50051" and "POD_IP" in env
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


def test_the_overlay_changes_only_what_it_says() -> None:
    """overlays/privileged: the same objects as the base; its Deployment differs only in the
    fields its kustomization names (the argument, the user namespace, the security context)."""
    base, privileged = RENDERED["base"], RENDERED["privileged"]
    key = [(d["kind"], d["metadata"]["name"]) for d in base]
    assert [(d["kind"], d["metadata"]["name"]) for d in privileged] == key
    for before, after in zip(base, privileged, strict=True):
        if before["kind"] != "Deployment":
            assert after == before
    pod_before, pod_after = pod_spec(base), pod_spec(privileged)
    assert pod_before["hostUsers"] is False and "hostUsers" not in pod_after
    before, after = container(base), container(privileged)
    assert before["args"] == [*after["args"], "--allow-degraded"]
    assert after["securityContext"] == {
        "privileged": True,
        "runAsUser": 0,
        "runAsGroup": 0,
        "runAsNonRoot": False,
        "allowPrivilegeEscalation": True,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "Unconfined"},
        "appArmorProfile": {"type": "Unconfined"},
    }
    strip = ("args", "securityContext")
    assert {k: v for k, v in before.items() if k not in strip} == {
        k: v for k, v in after.items() if k not in strip
    }


@pytest.mark.parametrize(("variant", "degraded"), [("base", True), ("privileged", False)])
def test_only_the_base_serves_without_cgroups(variant: str, degraded: bool, tmp_path: Path) -> None:
    """The base must become Ready where cgroups are read-only; the privileged variant must fail
    closed there instead of silently running without whole-sandbox limits (neither its
    arguments nor its server.toml allow it)."""
    documents = RENDERED[variant]
    parsed = build_parser().parse_args(list(container(documents)["args"]))
    toml = tmp_path / "server.toml"
    toml.write_text(server_toml(documents))
    assert load_config(toml).with_overrides(
        allow_degraded=parsed.allow_degraded
    ).allow_degraded is (degraded)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_memory_limit_covers_every_sandbox_at_its_ceiling_plus_the_server(
    variant: str, tmp_path: Path
) -> None:
    """max_sandboxes x the tenants' memory ceiling + the server's reserve <= the pod's memory
    limit (the arithmetic the manifests' comments and README.md state): otherwise sandboxes
    within their own limits could drive the pod past its limit and the kernel could OOM-kill
    the server itself."""
    from sandbox.tenants.config import load_tenants

    documents = RENDERED[variant]
    toml = tmp_path / "server.toml"
    toml.write_text(server_toml(documents))
    config = load_config(toml)
    tenants_toml, _ = example_tenants(documents)
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(tenants_toml)
    ceilings = [t.tenant.ceilings.memory_bytes for t in load_tenants(tenants).tenants]
    assert ceilings == [256 * 1024**2]
    resources = container(documents)["resources"]
    limit = quantity_bytes(resources["limits"]["memory"])
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert (config.max_sandboxes, limit) == (12, 4 * 1024**3)
    assert config.max_sandboxes * max(ceilings) + SERVER_RESERVE_BYTES <= limit
    # The warm pool holds sandboxes too: it must leave room for executions beyond it.
    assert config.pool_size < config.max_sandboxes
    # The memory-backed /tmp counts against the pod's limit: it is part of the reserve.
    (tmp,) = [v for v in pod_spec(documents)["volumes"] if v["name"] == "tmp"]
    assert quantity_bytes(tmp["emptyDir"]["sizeLimit"]) < SERVER_RESERVE_BYTES


def test_a_missing_patch_target_or_a_failed_test_op_is_an_error(tmp_path: Path) -> None:
    """The renderer refuses an overlay whose guard does not hold (the argument it removes moved)
    or whose target does not exist, as kustomize does, instead of rendering the base unchanged."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    header = f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {BASE}\n"
    guard = (
        "patches:\n  - target: {kind: Deployment, name: ptc-server}\n    patch: |-\n"
        "      - {op: test, path: /spec/template/spec/containers/0/args/0, value: run}\n"
    )
    (overlay / "kustomization.yaml").write_text(header + guard)
    with pytest.raises(ValueError, match=r"patches\[0\]: .*not equal to tested value"):
        render(overlay)
    missing = guard.replace("name: ptc-server}", "name: nothing}")
    (overlay / "kustomization.yaml").write_text(header + missing)
    with pytest.raises(ValueError, match=r"matches 0 objects, not one"):
        render(overlay)


def test_the_readmes_table_of_variants_is_what_the_variant_tests_saw() -> None:
    """The table is rendered from tests/deploy/variants_outcomes.json, which the Docker tests
    check (or, with PTC_K8S_RECORD=1, write): a hand edit of either side fails here."""
    assert read_table() == render_table(), (
        "deploy/kubernetes/README.md's table of variants is not the rendering of"
        " tests/deploy/variants_outcomes.json: python -m tests.deploy.variants_table"
    )
    assert "{" not in read_table()  # every cell filled


def test_the_table_fails_on_a_cell_no_test_saw() -> None:
    """A cell whose outcome the JSON lacks cannot be rendered: nothing is written by hand."""
    with pytest.raises(KeyError, match="ready"):
        render_table({"base": {}, "privileged": {}})
