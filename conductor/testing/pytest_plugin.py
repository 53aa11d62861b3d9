"""The test kit as a pytest plugin (registered by acp-conductor's `pytest11` entry point).

Fixtures, for tests of a proxy:

- `acp_proxies`: the proxies under test, editor side first. Empty by default: override it
  (in the test module or conftest.py) to return your proxy instances.
- `acp_agent`: the `ScriptedAgent` at the end of the chain (script it before prompting).
- `acp_client`: a `TestClient`, initialized, on `acp_proxies` -> `acp_agent`, in memory.
- `acp_chain`: `open_test_chain`, for a test that builds chains of its own.
- `acp_conductor`: `open_conductor`, a real conductor process on a chain file.
- `acp_process`: `open_process_client`, any ACP command over pipes.

An async test that uses any of them runs under anyio without any configuration: the
fixtures need anyio's `anyio_backend`, and unless the project chooses backends itself
(its own `anyio_backend` fixture or parametrization), they run on asyncio, the backend
the conductor itself runs on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from conductor.plugins.api import Proxy
    from conductor.testing.kit import ScriptedAgent, TestClient

# The fixtures that run the conductor in the test's event loop.
ASYNC_FIXTURES = frozenset({"acp_client", "acp_chain", "acp_conductor", "acp_process"})


@pytest.fixture
def acp_proxies() -> list[Proxy[Any]]:
    """The proxies under test, in chain order (editor side first). Override this fixture."""
    return []


@pytest.fixture
def acp_agent() -> ScriptedAgent:
    """The scripted agent at the end of `acp_client`'s chain."""
    from conductor.testing.kit import ScriptedAgent

    return ScriptedAgent()


@pytest.fixture
async def acp_client(acp_proxies: list[Proxy[Any]], acp_agent: ScriptedAgent,
                     anyio_backend: object) -> AsyncIterator[TestClient]:
    """An initialized editor on `acp_proxies` -> `acp_agent`, through the real router."""
    from conductor.testing.kit import open_test_chain

    async with open_test_chain(acp_proxies, acp_agent) as client:
        yield client


@pytest.fixture
def acp_chain(anyio_backend: object) -> Callable[..., Any]:
    """`open_test_chain(proxies, agent, ...)`: `async with acp_chain([P()]) as client`."""
    from conductor.testing.kit import open_test_chain

    return open_test_chain


@pytest.fixture
def acp_conductor(anyio_backend: object) -> Callable[..., Any]:
    """`open_conductor(chain_file, *args)`: a real conductor process, driven over pipes."""
    from conductor.testing.kit import open_conductor

    return open_conductor


@pytest.fixture
def acp_process(anyio_backend: object) -> Callable[..., Any]:
    """`open_process_client(argv)`: any ACP command (an agent, a conductor) over pipes."""
    from conductor.testing.kit import open_process_client

    return open_process_client


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test using the fixtures runs on asyncio, unless the project picks backends.

    anyio's default `anyio_backend` runs every backend installed; a plugin written for
    asyncio (as the conductor runs it) would then fail under trio for no fault of its own.
    A parametrize mark is what pytest lets win over a parametrized fixture; it is added
    only where `anyio_backend` is still anyio's own fixture.
    """
    names = set(metafunc.fixturenames)
    if "anyio_backend" not in names or ASYNC_FIXTURES.isdisjoint(names):
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        if "anyio_backend" in str(mark.args[0] if mark.args else mark.kwargs.get("argnames")):
            return
    definitions = getattr(metafunc, "_arg2fixturedefs", {}).get("anyio_backend") or ()
    if not definitions or not _is_anyios_own(definitions[-1]):
        return
    metafunc.definition.add_marker(pytest.mark.parametrize("anyio_backend", ["asyncio"]))


def _is_anyios_own(definition: Any) -> bool:
    func = getattr(definition, "func", None)
    return getattr(func, "__module__", None) == "anyio.pytest_plugin"
