"""The operator's endpoints: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio

import msgspec
from litestar import Response, Router, get

from core.errors import ServiceUnavailable
from core.metrics import Registry
from core.openapi import error_responses
from core.storage import Storage, StorageError
from core.supervisor import Supervisor
from tenancy.guard import PUBLIC


class Health(msgspec.Struct, frozen=True):
    status: str


def operations_router(storage: Storage, metrics: Registry, supervisor: Supervisor) -> Router:
    @get("/healthz", summary="Liveness")
    async def healthz() -> Health:
        return Health("ok")

    @get("/readyz", summary="Readiness: storage reachable, no background task failing",
         responses=error_responses(503))
    async def readyz() -> Health:
        # A loop that keeps dying (core.supervisor) is named; its traceback is logged.
        if failing := supervisor.failing():
            raise ServiceUnavailable(
                "background tasks keep failing: "
                + ", ".join(f.describe() for f in failing) + "; see the server log",
                detail={"failing": [{"task": f.task, "deaths": f.deaths, "error": f.error}
                                    for f in failing]})
        try:
            await asyncio.wait_for(asyncio.to_thread(storage.check), 5)
        except (StorageError, TimeoutError) as exc:
            raise ServiceUnavailable(f"storage is not reachable: {exc}") from exc
        return Health("ready")

    @get("/metrics", summary="Prometheus metrics", media_type="text/plain; version=0.0.4")
    async def metrics_text() -> Response[str]:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    # Probes and scrapers carry no key; nothing here names a tenant.
    return Router("", route_handlers=[healthz, readyz, metrics_text], opt=PUBLIC)


