"""The tenants file's ``runtimes`` list: parsed, validated with the key path, and enforced."""

from __future__ import annotations

import pytest

from sandbox.errors import InvalidArgument, NotFound, PermissionDenied
from sandbox.tenants.base import Tenant
from sandbox.tenants.config import TenantConfigError, parse_tenants
from sandbox.tenants.policy import check_runtime

KEY = "sha256:" + "0" * 64


def _tenants(extra: str) -> str:
    return f'[[tenant]]\nid = "acme"\nkeys = ["{KEY}"]\n{extra}\n'


def test_runtimes_parse_and_default_to_none() -> None:
    listed = parse_tenants(_tenants('runtimes = ["np", "sci-1.0"]')).tenant("acme")
    assert listed is not None and listed.runtimes == frozenset({"np", "sci-1.0"})
    unset = parse_tenants(_tenants("")).tenant("acme")
    assert unset is not None and unset.runtimes == frozenset()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            'runtimes = ["../x"]',
            "tenants file: tenant 'acme': runtimes[0]: runtime: '../x' is not a valid runtime "
            "name (1-64 of [a-z0-9._-], starting with a letter or digit, no '..')",
        ),
        (
            'runtimes = "np"',
            "tenants file: tenant 'acme': runtimes: must be a list of runtime names",
        ),
    ],
    ids=["escaping-name", "not-a-list"],
)
def test_bad_runtimes_name_the_key(extra: str, message: str) -> None:
    with pytest.raises(TenantConfigError) as caught:
        parse_tenants(_tenants(extra))
    assert caught.value.message == message


def test_check_runtime() -> None:
    tenant = Tenant(id="t", runtimes=frozenset({"np"}))
    check_runtime(tenant, "np")
    for default in (None, "", "default"):
        check_runtime(Tenant(id="t", runtimes=frozenset()), default)
    check_runtime(Tenant(id="any"), "whatever")  # no list (single tenant): any runtime
    with pytest.raises(PermissionDenied) as caught:
        check_runtime(tenant, "pure")
    assert caught.value.message == "runtime: tenant 't' may not use 'pure' (allowed: np)"
    built = {"np", "pure"}.__contains__
    with pytest.raises(PermissionDenied):
        check_runtime(tenant, "pure", built)
    with pytest.raises(NotFound) as missing:
        check_runtime(tenant, "gone", built)
    assert missing.value.message == (
        "runtime: no runtime named 'gone' on this server (tenant 't' may use: np)"
    )
    with pytest.raises(NotFound):  # on its list, but not built
        check_runtime(tenant, "np", lambda name: False)
    for holder in (tenant, Tenant(id="any")):  # a bad name first, for any tenant
        with pytest.raises(InvalidArgument) as bad:
            check_runtime(holder, "../np", built)
        assert bad.value.message.startswith("runtime: '../np' is not a valid runtime name")


def test_a_tenant_may_be_allowed_the_gvisor_backend() -> None:
    tenant = parse_tenants(_tenants('backends = ["gvisor"]')).tenant("acme")
    assert tenant is not None and tenant.backends == frozenset({"gvisor"})
