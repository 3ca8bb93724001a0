"""Renders a kustomize base for the fields `deploy/kubernetes/kustomization.yaml` uses, with
kustomize's rules for them, and refuses every other field, so the real `kustomize build` (or
`kubectl kustomize`) renders the same documents. Neither tool is in the Debian archive CI
installs from (`apt-cache policy kustomize kubectl` finds no candidate), and the subset is three
fields, too small to justify a third-party reimplementation of kustomize as a dependency:

- ``resources``: files in the base's directory, each one or more YAML documents, in order;
- ``namespace``: set on every namespaced object (all the kinds the base holds are);
- ``labels``: each entry's ``pairs`` added to every object's ``metadata.labels``, and with
  ``includeTemplates: true`` to a workload's pod template labels; ``includeSelectors`` must
  be false (selectors stay as written, as kustomize does then).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["render"]

_FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources"}
_CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
_WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


def render(base: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(kustomization) - _FIELDS
    if unknown:
        raise ValueError(
            f"{base}/kustomization.yaml: fields this renderer lacks: {sorted(unknown)}"
        )
    if (kustomization.get("apiVersion"), kustomization.get("kind")) != (
        "kustomize.config.k8s.io/v1beta1",
        "Kustomization",
    ):
        raise ValueError(f"{base}/kustomization.yaml: not a kustomize.config.k8s.io Kustomization")
    documents: list[dict[str, Any]] = []
    for name in kustomization.get("resources", []):
        path = (base / name).resolve()
        if path.parent != base.resolve() or not path.is_file():
            raise ValueError(f"{base}/kustomization.yaml: resource {name!r} is not a file here")
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document is not None:
                documents.append(document)
    namespace = kustomization.get("namespace")
    for document in documents:
        metadata = document.setdefault("metadata", {})
        if namespace and document["kind"] not in _CLUSTER_SCOPED:
            metadata["namespace"] = namespace
        for entry in kustomization.get("labels", []):
            if entry.get("includeSelectors", False):
                raise ValueError("labels.includeSelectors: true is not implemented")
            pairs = dict(entry["pairs"])
            metadata.setdefault("labels", {}).update(pairs)
            if entry.get("includeTemplates", False) and document["kind"] in _WORKLOADS:
                template = document["spec"]["template"].setdefault("metadata", {})
                template.setdefault("labels", {}).update(pairs)
    keys = [(d["apiVersion"], d["kind"], d["metadata"]["name"]) for d in documents]
    duplicates = {k for k in keys if keys.count(k) > 1}
    if duplicates:
        raise ValueError(f"objects defined twice: {sorted(duplicates)}")
    return documents
