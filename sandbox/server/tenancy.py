"""`SingleTenant`: the default tenancy when the server has no tenants file.

One tenant, ``default``, with the server's own defaults and ceilings and no API key. Admission
still bounds concurrency: up to ``max_concurrent`` executions run, up to ``queue`` more wait, and
anything beyond is refused with RESOURCE_EXHAUSTED and a retry-after hint. The real,
multi-tenant implementation replaces this through the same `sandbox.tenants.base.Tenancy`
protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager

from sandbox.errors import ResourceExhausted
from sandbox.tenants.base import Tenant

__all__ = ["SingleTenant"]


class SingleTenant:
    def __init__(self, tenant: Tenant | None = None) -> None:
        self.tenant = tenant or Tenant(id="default", max_concurrent=64, queue=1024)
        self._running = asyncio.Semaphore(self.tenant.max_concurrent)
        self._waiting = 0

    @property
    def requires_auth(self) -> bool:
        return False

    def authenticate(self, metadata: Mapping[str, str]) -> Tenant:
        return self.tenant

    def admit(self, tenant: Tenant) -> AbstractAsyncContextManager[None]:
        return self._admit()

    @contextlib.asynccontextmanager
    async def _admit(self) -> AsyncIterator[None]:
        if self._running.locked():
            if self._waiting >= self.tenant.queue:
                raise ResourceExhausted(
                    f"tenant {self.tenant.id!r}: {self.tenant.max_concurrent} executions are "
                    f"running and {self._waiting} are queued",
                    retry_after_s=1.0,
                )
            self._waiting += 1
            try:
                await self._running.acquire()
            finally:
                self._waiting -= 1
        else:
            await self._running.acquire()
        try:
            yield
        finally:
            self._running.release()
