"""Renders a kustomization for the fields `deploy/kubernetes/kustomization.yaml` and its overlays
use, with kustomize's rules for them, and refuses every other field, so the real `kustomize
build` (or `kubectl kustomize`) renders the same documents. Neither tool is in the Debian archive
CI installs from (`apt-cache policy kustomize kubectl` finds no candidate), and the subset is
four fields, too small to justify a third-party reimplementation of kustomize as a dependency:

- ``resources``: files in the kustomization's directory, each one or more YAML documents, in
  order, or a directory holding another kustomization (a base), rendered first with its own
  fields;
- ``namespace``: set on every namespaced object (all the kinds the base holds are);
- ``labels``: each entry's ``pairs`` added to every object's ``metadata.labels``, and with
  ``includeTemplates: true`` to a workload's pod template labels; ``includeSelectors`` must
  be false (selectors stay as written, as kustomize does then);
- ``patches``: each entry an inline JSON patch (RFC 6902, written as a YAML list) with a
  ``target`` naming ``kind`` and ``name``, applied by the `jsonpatch` library to the one object
  it names (a target that matches nothing is an error, as in kustomize).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

__all__ = ["render"]

_FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources", "patches"}
_PATCH_FIELDS = {"target", "patch"}
_TARGET_FIELDS = {"kind", "name"}
_CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
_WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


def render(base: Path) -> list[dict[str, Any]]:
    where = f"{base}/kustomization.yaml"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(kustomization) - _FIELDS
    if unknown:
        raise ValueError(f"{where}: fields this renderer lacks: {sorted(unknown)}")
    if (kustomization.get("apiVersion"), kustomization.get("kind")) != (
        "kustomize.config.k8s.io/v1beta1",
        "Kustomization",
    ):
        raise ValueError(f"{where}: not a kustomize.config.k8s.io Kustomization")
    documents: list[dict[str, Any]] = []
    for name in kustomization.get("resources", []):
        path = (base / name).resolve()
        if path.is_dir() and (path / "kustomization.yaml").is_file():
            documents.extend(render(path))
            continue
        if path.parent != base.resolve() or not path.is_file():
            raise ValueError(f"{where}: resource {name!r} is not a file here nor a kustomization")
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document is not None:
                documents.append(document)
    for number, entry in enumerate(kustomization.get("patches", [])):
        documents = _patch(documents, entry, f"{where}: patches[{number}]")
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


def _patch(
    documents: list[dict[str, Any]], entry: dict[str, Any], where: str
) -> list[dict[str, Any]]:
    if set(entry) != _PATCH_FIELDS or set(entry["target"]) != _TARGET_FIELDS:
        raise ValueError(
            f"{where}: only an inline JSON patch with target kind and name is implemented"
        )
    target = entry["target"]
    operations = yaml.safe_load(entry["patch"])
    if not isinstance(operations, list):
        raise ValueError(f"{where}: the patch is not a JSON patch (a list of operations)")
    matches = [
        i
        for i, d in enumerate(documents)
        if (d["kind"], d["metadata"]["name"]) == (target["kind"], target["name"])
    ]
    if len(matches) != 1:
        raise ValueError(f"{where}: target {target} matches {len(matches)} objects, not one")
    patched = list(documents)
    try:
        patched[matches[0]] = jsonpatch.apply_patch(
            copy.deepcopy(documents[matches[0]]), operations
        )
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise ValueError(f"{where}: {exc}") from exc
    return patched
