"""Each framework's extra is enough to run its example: every module an example under
`examples/` imports comes from a distribution that the package's own dependencies plus that one
extra bring, followed through every dependency's requirements (`Requires-Dist`, with extras and
markers). The requirements are read from the metadata of the distributions installed in this
environment (the dev extra installs them all), so this checks the dependency graph of these
versions without a network or a fresh install; the `integrations` and `dev` extras hold every
framework extra's requirements."""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]

EXAMPLES = {
    "anthropic": "anthropic_sdk_example.py",
    "langchain": "langchain_example.py",
    "mcp": "mcp_example.py",
    "openai": "openai_sdk_example.py",
    "openai-agents": "openai_agents_example.py",
    "smolagents": "smolagents_example.py",
}


def imported_modules(path: Path) -> set[str]:
    """The top-level modules ``path`` imports, besides the standard library and this package,
    with those of the modules beside it that it imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.partition(".")[0])
    # A module beside it (`weather_task`: examples/ is on the path of an example run from
    # there) counts by what it imports in turn.
    siblings = {p.stem for p in path.parent.glob("*.py")} & found
    for name in siblings:
        found |= imported_modules(path.parent / f"{name}.py")
    return found - set(sys.stdlib_module_names) - {"__future__", "sandbox"} - siblings


def brought(requirements: Iterable[str]) -> set[str]:
    """The names of every distribution ``requirements`` bring, recursively."""
    names: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [(text, "") for text in requirements]
    while pending:
        text, extra = pending.pop()
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        names.add(key[0])
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            pytest.fail(f"{requirement.name} (needed by the extra) is not installed here")
        for sub in requires:
            pending.extend((sub, active) for active in ("", *sorted(requirement.extras)))
    return names


@pytest.mark.parametrize("extra", sorted(EXAMPLES))
def test_the_extra_brings_what_its_example_imports(extra: str) -> None:
    modules = imported_modules(ROOT / "examples" / EXAMPLES[extra])
    assert modules, "the example imports no framework at all"
    installed = brought([*PROJECT["dependencies"], *EXTRAS[extra]])
    providers = metadata.packages_distributions()
    missing = {
        module: sorted(providers.get(module, ["(no installed distribution)"]))
        for module in sorted(modules)
        if not {canonicalize_name(d) for d in providers.get(module, [])} & installed
    }
    assert missing == {}, (
        f'pip install ".[{extra}]" does not bring these modules (and their providers)'
    )


@pytest.mark.parametrize("umbrella", ["integrations", "dev"])
def test_integrations_and_dev_hold_every_framework_extra(umbrella: str) -> None:
    wanted = {req for extra in EXAMPLES for req in EXTRAS[extra]}
    assert sorted(wanted - set(EXTRAS[umbrella])) == []
