"""``Client``: boxtrail's HTTP API for programs. Rows come back as Structs (``rows``); a
refusal raises :class:`~boxtrail_client.errors.ApiError` with the server's code; no answer
raises :class:`~boxtrail_client.errors.ClientError`.

    with Client() as bt:  # BOXTRAIL_URL, BOXTRAIL_API_KEY
        for row in bt.search("shop", "level:error", since="2h"):
            print(row.ts, row.message)

    async for row in Client().tail("shop", box="b1"):  # until cancelled
        ...
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from boxtrail_client.errors import ApiError, ClientError, raise_for
from boxtrail_client.rows import ErrorRow, Row, Uploaded, UsageRow
from boxtrail_client.sse import amessages
from boxtrail_client.upload import upload

DEFAULT_URL = "http://127.0.0.1:8780"
MAX_BACKOFF_S = 10.0
T = TypeVar("T")


class _Page(msgspec.Struct, rename="camel"):
    rows: list[Row]
    next_cursor: str | None = None


class _ErrorRows(msgspec.Struct):
    rows: list[ErrorRow]


class _UsagePage(msgspec.Struct, rename="camel"):
    rows: list[UsageRow]
    next_cursor: str | None = None


class _Listing(msgspec.Struct):
    files: list[dict[str, Any]]


class _Deleted(msgspec.Struct):
    deleted: int


class _Dropped(msgspec.Struct):
    count: int


class _Closed(msgspec.Struct):
    error: dict[str, Any]


def _params(**values: object) -> dict[str, str]:
    return {k: str(v) for k, v in values.items() if v is not None and v != ""}


class Client:
    def __init__(self, url: str | None = None, api_key: str | None = None, *,
                 timeout_s: float = 30.0, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.url = (url or env.get("BOXTRAIL_URL") or DEFAULT_URL).rstrip("/")
        self.api_key = api_key or env.get("BOXTRAIL_API_KEY") or ""
        if not self.api_key:
            raise ClientError("set BOXTRAIL_API_KEY to an API key (POST /v1/keys, or "
                              "`boxtrail keys create` on the server)")
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {self.api_key}"}
        self._http = httpx.Client(base_url=self.url, headers=self._headers,
                                  timeout=httpx.Timeout(timeout_s))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, type_: type[T], *, params: Mapping[str, str]
              | None = None, json: object = None) -> T:
        try:
            response = self._http.request(method, path, params=params, json=json)
        except httpx.TransportError as exc:
            raise ClientError(f"cannot reach {self.url}: {exc}") from None
        raise_for(response)
        if not response.content:
            return None  # type: ignore[return-value]
        return msgspec.json.decode(response.content, type=type_)

    @staticmethod
    def _project(project: str) -> str:
        return "/v1/projects/" + _quote(project)

    # Reading.

    def search(self, project: str, query: str = "", *, since: str = "1h",
               until: str | None = None, box: str | None = None, limit: int | None = None,
               page_size: int = 1000) -> Iterator[Row]:
        """Matching rows, newest first, every page (at most ``limit`` rows if given)."""
        cursor: str | None = None
        given = 0
        while True:
            wanted = page_size if limit is None else min(page_size, limit - given)
            page = self._call("GET", self._project(project) + "/logs", _Page, params=_params(
                query=query, since=since, until=until, boxId=box, limit=wanted,
                cursor=cursor))
            yield from page.rows
            given += len(page.rows)
            cursor = page.next_cursor
            if cursor is None or (limit is not None and given >= limit):
                return

    def errors(self, project: str, *, since: str = "24h", box: str | None = None,
               limit: int = 100) -> list[ErrorRow]:
        """Error rows, newest first, their frames rewritten by the uploaded source maps."""
        return self._call("GET", self._project(project) + "/errors", _ErrorRows,
                          params=_params(since=since, boxId=box, limit=limit)).rows

    def error_groups(self, project: str, *, since: str = "24h", box: str | None = None,
                     limit: int = 100) -> dict[str, Any]:
        """``/errors?groupBy=fingerprint``: the largest groups, as the server words them."""
        return self._call("GET", self._project(project) + "/errors", dict[str, Any],
                          params=_params(since=since, boxId=box, limit=limit,
                                         groupBy="fingerprint"))

    async def tail(self, project: str, query: str = "", *, box: str | None = None,
                   after: str | None = None,
                   dropped: Callable[[int], None] | None = None) -> AsyncIterator[Row]:
        """Rows as they arrive, oldest first, until the caller stops. The stream is resumed
        with ``Last-Event-ID`` after a drop or a server restart: no row lost or repeated.
        ``after``: a row id to resume from; ``dropped(n)``: told when the server skipped
        ``n`` rows this reader fell behind on. A refusal (an unknown project, a key revoked
        while tailing) raises :class:`ApiError`."""
        last_id = after
        backoff = 0.5
        timeout = httpx.Timeout(self.timeout_s, read=None)
        async with httpx.AsyncClient(base_url=self.url, headers=self._headers,
                                     timeout=timeout) as http:
            while True:
                headers = {"Last-Event-ID": last_id} if last_id else {}
                try:
                    async with http.stream("GET", self._project(project) + "/tail",
                                           params=_params(query=query, boxId=box),
                                           headers=headers) as response:
                        if not response.is_success:
                            await response.aread()
                            raise_for(response)
                        backoff = 0.5
                        async for event, event_id, data in amessages(response.aiter_lines()):
                            last_id = event_id or last_id
                            if event == "log":
                                yield msgspec.json.decode(data, type=Row)
                            elif event == "dropped" and dropped is not None:
                                dropped(msgspec.json.decode(data, type=_Dropped).count)
                            elif event == "closed":
                                error = msgspec.json.decode(data, type=_Closed).error
                                raise ApiError(int(error.get("status", 401)),
                                               str(error.get("code", "closed")),
                                               str(error.get("message", "")),
                                               error.get("detail"))
                except (httpx.TransportError, httpx.StreamError):
                    pass  # dropped, or the server restarted: resume from the last id
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    # Source maps (what CI does).

    def upload_sourcemaps(self, project: str, root: str | Path, *, release: str | None = None,
                          url_prefix: str = "~/", progress: TextIO | None = None) -> Uploaded:
        """Every .js file and map under ``root`` in one request: all stored, or none (an
        :class:`ApiError` naming the file). ``progress``: where a bar is drawn."""
        answer, _, _, _ = upload(Path(root), url=self.url, api_key=self.api_key,
                                 project=project, release=release, url_prefix=url_prefix,
                                 progress=progress)
        return answer

    def sourcemaps(self, project: str, release: str | None = None) -> list[dict[str, Any]]:
        """The stored files (all, or one release's)."""
        return self._call("GET", self._project(project) + "/sourcemaps", _Listing,
                          params=_params(release=release)).files

    def delete_sourcemaps(self, project: str, release: str) -> int:
        """Delete a release's files (``""``: those uploaded without one); how many."""
        return self._call("DELETE", self._project(project) + "/sourcemaps", _Deleted,
                          params={"release": release}).deleted

    # Keys, usage, deletions.

    def api_keys(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/keys", list[dict[str, Any]])

    def create_key(self, name: str, scopes: list[str], expires_in_s: int | None = None
                   ) -> dict[str, Any]:
        body: dict[str, object] = {"name": name, "scopes": scopes}
        if expires_in_s is not None:
            body["expiresIn"] = expires_in_s
        return self._call("POST", "/v1/keys", dict[str, Any], json=body)

    def revoke_key(self, key_id: str) -> None:
        self._call("DELETE", "/v1/keys/" + _quote(key_id), type(None))

    def usage(self, *, since: str = "24h", until: str | None = None, interval: str = "hour",
              kinds: list[str] | None = None, project: str | None = None,
              box: str | None = None, group_by: list[str] | None = None
              ) -> Iterator[UsageRow]:
        """The tenant's usage rows (every page)."""
        cursor: str | None = None
        while True:
            page = self._call("GET", "/v1/usage", _UsagePage, params=_params(
                since=since, until=until, interval=interval,
                kind=",".join(kinds) if kinds else None, project=project, box=box,
                groupBy=",".join(group_by) if group_by is not None else None,
                limit=10_000, cursor=cursor))
            yield from page.rows
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def delete_rows(self, project: str, *, box: str | None = None, since: str | None = None,
                    until: str | None = None, query: str | None = None) -> dict[str, Any]:
        """A deletion job for the project's rows that match (at least one of them)."""
        body = {k: v for k, v in (("box", box), ("since", since), ("until", until),
                                  ("query", query)) if v is not None}
        return self._call("POST", self._project(project) + "/deletions", dict[str, Any],
                          json=body)

    def deletions(self, project: str | None = None) -> list[dict[str, Any]]:
        path = self._project(project) + "/deletions" if project else "/v1/deletions"
        return self._call("GET", path, list[dict[str, Any]])

    def deletion(self, deletion_id: str) -> dict[str, Any]:
        return self._call("GET", "/v1/deletions/" + _quote(deletion_id), dict[str, Any])


def _quote(part: str) -> str:
    return quote(part, safe="")
