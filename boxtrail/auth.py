"""Bearer API keys -> tenant, and a tenant's view of projects (others' are a plain 404)."""

from __future__ import annotations

from boxtrail.errors import NotFound, Unauthorized
from boxtrail.tenancy import Project, Tenancy


def require_tenant(authorization: str | None, tenancy: Tenancy) -> str:
    header = authorization or ""
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("send the API key as 'Authorization: Bearer <key>'")
    tenant = tenancy.authenticate(key.strip())
    if tenant is None:
        raise Unauthorized("unknown API key")
    return tenant


def require_project(authorization: str | None, tenancy: Tenancy, id_or_name: str) -> Project:
    tenant = require_tenant(authorization, tenancy)
    project = tenancy.get_project(tenant, id_or_name)
    if project is None:
        raise NotFound(f"no project {id_or_name!r}", detail={"project": id_or_name})
    return project
