"""Without a tenants file a server's one tenant may use every backend the server offers
(`ptc serve --gvisor` offers gVisor to it, not PERMISSION_DENIED), as a
tenants file's tenant with no `backends` key may; the server runs no backend it was not started
with, so allowing all of them grants nothing more. The served path is
tests/server/test_serve_gvisor.py (it needs Docker with runsc)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.server.tenancy import SingleTenant
from sandbox.tenants import hash_key
from sandbox.tenants.config import load_tenants
from sandbox.tenants.policy import check_backend


@pytest.mark.parametrize("backend", ["process", "docker", "gvisor"])
def test_the_single_tenant_may_use_every_backend(backend: str) -> None:
    check_backend(SingleTenant().tenant, backend)


def test_the_same_default_as_a_tenants_file(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(f'[[tenant]]\nid = "a"\nkeys = ["{hash_key("k")}"]\n')
    tenant = load_tenants(path).tenant("a")
    assert tenant is not None
    assert tenant.backends == SingleTenant().tenant.backends == {"process", "docker", "gvisor"}
