"""Worker processes (core.workers): /errors answers and uploads are built beside the
server, and a worker that dies, or outlives its server, does not leave a mess.

The refused forms share one server (``server`` below), each on a project of its own name:
a server per case was most of their time. The tests that count or kill the server's
workers start their own (``own_server``): which workers are alive depends on every job
the server has run."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.sourcemaps import handmade
from tests.support.server import Server, create_project

STACK = """TypeError: boom {n}
    at render{n} (https://b.box.example/assets/app.js:1:{col})
    at https://b.box.example/assets/other.js:3:9"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("workers") / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A fresh server: its workers are those this test's jobs started."""
    srv = Server(tmp_path / "data").start()
    yield srv
    srv.stop()


@pytest.fixture
def own_api(own_server: Server) -> Iterator[httpx.Client]:
    with own_server.client() as client:
        yield client


# A project per refused form on the shared server.
_form_projects = (f"form-{n}" for n in itertools.count())


def _children(pid: int) -> dict[int, str]:
    """Child processes of ``pid`` and their command lines."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                out[int(child)] = Path(f"/proc/{child}/cmdline").read_bytes().decode()
            except OSError:
                continue
    return out


def _workers(server: Server) -> list[int]:
    assert server.proc is not None
    return [pid for pid, cmd in _children(server.proc.pid).items()
            if "spawn_main" in cmd and "resource_tracker" not in cmd]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _seed(server: Server, api: httpx.Client) -> None:
    key = str(create_project(api, "w")["ingestKey"])
    js = "function render(){}\n"
    source_map = handmade.source_map("AAAA,KAAK", sources=["src/app.ts"], names=["render"],
                                     contents=["export function render() {}\n"])
    r = api.post("/v1/projects/w/sourcemaps", data={"urlPrefix": "~/assets"}, files=[
        ("file", ("app.js", js.encode())), ("file", ("app.js.map", handmade.dumps(source_map)))])
    assert r.status_code == 201, r.text
    events = [{"level": "error", "message": f"m{n}",
               "error": {"type": "TypeError", "message": f"boom {n}",
                         "stack": STACK.format(n=n % 3, col=1 + n % 7)}} for n in range(40)]
    r = httpx.post(f"{server.url}/v1/ingest", params={"key": key},
                   json={"context": {"boxId": "b"}, "events": events})
    assert r.status_code == 202


def _answers(api: httpx.Client) -> list[object]:
    out = []
    for params in ({"since": "1h"}, {"since": "1h", "groupBy": "fingerprint", "limit": 2}):
        r = api.get("/v1/projects/w/errors", params=params)
        assert r.status_code == 200, r.text
        out.append(_timeless(r.json()))
    return out


def _timeless(answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` without what depends on when it was asked: the groups' series run from
    ``since`` to now, so their buckets move between two asks; their sums do not."""
    if "groups" not in answer:
        return answer
    groups = [{**g, "series": sum(g["series"])} for g in answer["groups"]]
    return {k: v for k, v in answer.items() if not k.startswith("series")} | {"groups": groups}


def test_errors_in_a_worker_process_match_a_thread_of_the_server(tmp_path: Path) -> None:
    first = Server(tmp_path / "data").start()
    try:
        with first.client() as api:
            _seed(first, api)
            in_process = _answers(api)
            assert _workers(first), "the answers were built in a worker process"
            frames = in_process[0]["rows"][0]["error"]["frames"]  # type: ignore[index]
            assert frames[0]["symbolicated"] is True and frames[0]["file"] == "src/app.ts"
            metrics = api.get("/metrics").text
            # Counted in the worker, reported by the server.
            assert 'boxtrail_symbolication_frames_total{problem="none"}' in metrics
            assert not list((tmp_path / "data" / "tmp").iterdir())  # inputs deleted
    finally:
        first.stop()
    second = Server(tmp_path / "data", {"BOXTRAIL_WORKER_PROCESSES": "0"}).start()
    try:
        with second.client() as api:
            assert _answers(api) == in_process
            assert not _workers(second)
    finally:
        second.stop()


def test_a_worker_killed_between_jobs_is_replaced(own_server: Server,
                                                  own_api: httpx.Client) -> None:
    _seed(own_server, own_api)
    before = _answers(own_api)
    killed = _workers(own_server)
    assert len(killed) == 2  # one per lane: reads, uploads
    for worker in killed:
        os.kill(worker, signal.SIGKILL)
    time.sleep(0.5)
    assert _answers(own_api) == before  # nothing was lost: the next job starts a new worker
    [replaced] = _workers(own_server)  # reads only, until the next upload
    assert replaced not in killed


def test_workers_end_with_their_server(own_server: Server, own_api: httpx.Client) -> None:
    _seed(own_server, own_api)
    _answers(own_api)
    workers = _workers(own_server)
    assert workers
    own_server.kill()  # SIGKILL: no shutdown code runs
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)


def _post(api: httpx.Client, project: str, body: bytes, content_type: str) -> httpx.Response:
    return api.post(f"/v1/projects/{project}/sourcemaps", content=body,
                    headers={"Content-Type": content_type})


def _form(*parts: bytes, end: bool = True) -> bytes:
    return b"".join(b"--xx\r\n" + p + b"\r\n" for p in parts) + (b"--xx--\r\n" if end else b"")


@pytest.mark.parametrize(("body", "content_type", "status", "code"), [
    (b'{"file": []}', "application/json", 400, "invalid_upload"),
    (b"", "multipart/form-data", 400, "invalid_upload"),  # no boundary
    (_form(b'Content-Disposition: form-data; name="file"; filename="a.js.map"\r\n\r\n{}',
           end=False), "multipart/form-data; boundary=xx", 400, "invalid_upload"),
    (_form(b'Content-Disposition: form-data; name="file"\r\n\r\n{}'),
     "multipart/form-data; boundary=xx", 400, "invalid_upload"),  # no filename
    (_form(b'Content-Disposition: form-data; name="release"\r\n\r\n1',
           b'Content-Disposition: form-data; name="release"\r\n\r\n2'),
     "multipart/form-data; boundary=xx", 400, "invalid_upload"),
    (_form(b'Content-Disposition: form-data; name="release"\r\n\r\n\xff'),
     "multipart/form-data; boundary=xx", 400, "invalid_upload"),
    (_form(b'Content-Disposition: form-data; name="urlPrefix"\r\n\r\n' + b"~/" * 5000),
     "multipart/form-data; boundary=xx", 400, "invalid_upload"),
    (_form(*[b'Content-Disposition: form-data; name="file"; filename="%d.js"\r\n\r\nx' % i
             for i in range(1000)]), "multipart/form-data; boundary=xx", 413,
     "upload_too_large"),
    (_form(b'Content-Disposition: form-data; name="file"; filename="big.js.map"\r\n\r\n'
           + b" " * ((64 << 20) + 1)), "multipart/form-data; boundary=xx", 413,
     "upload_too_large"),
])
def test_a_form_that_cannot_be_read_is_refused_whole(
        server: Server, api: httpx.Client, body: bytes, content_type: str, status: int,
        code: str) -> None:
    project = next(_form_projects)
    create_project(api, project)
    r = _post(api, project, body, content_type)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert api.get(f"/v1/projects/{project}/sourcemaps").json() == {"files": []}
    assert not list((server.data_dir / "tmp").iterdir())
