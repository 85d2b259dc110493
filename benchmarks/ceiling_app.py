"""The ingest ceiling: a bare Litestar endpoint that only decodes the body into typed Structs.

It does what any ingest endpoint must do (read the body, decode and type-check every
event, answer 202) and nothing boxtrail adds (auth, validation rules, WAL, fsync), so
boxtrail's events/s over this app's is the share of the budget the real work costs.

    python benchmarks/ceiling_app.py --port 0 [--server uvicorn|granian]

prints ``listening on http://127.0.0.1:PORT`` once it accepts requests.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, post
from litestar.exceptions import ValidationException

from ingest.wire import body_decoder

# The very decoder boxtrail's ingest uses (typed gc=False Structs, attrs kept raw), so
# the ratio measures what boxtrail adds after decoding, not a cheaper or dearer decode.
DECODER = body_decoder


@post("/v1/ingest", status_code=202)
async def ingest(request: Request[Any, Any, Any]) -> Response[bytes]:
    try:
        body = DECODER.decode(await request.body())
    except msgspec.DecodeError as exc:  # ValidationError is a subclass
        raise ValidationException(str(exc)) from exc
    ack = b'{"accepted":%d,"rejected":[]}' % len(body.events)
    return Response(ack, status_code=202, media_type="application/json")


app = Litestar(route_handlers=[ingest], openapi_config=None)


def announce(port: int) -> None:
    print(f"listening on http://127.0.0.1:{port}", flush=True)


def serve_uvicorn(port: int) -> None:
    """Serve like boxtrail does: uvicorn, uvloop, httptools, one process, no access log."""
    import uvicorn
    import uvloop

    # Binding ourselves makes --port 0 work and tells us the port uvicorn would hide.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn.Config(
        app, loop="uvloop", http="httptools", access_log=False, log_level="warning",
        lifespan="on", workers=1,
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            announce(sock.getsockname()[1])
        await task

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def announce_when_accepting(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                announce(port)
                return
        except OSError:
            time.sleep(0.05)


def serve_granian(port: int) -> None:
    """Granian with one worker process; it binds in Rust, so port 0 is resolved here first."""
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops
    from granian.log import LogLevels

    port = port or free_port()
    threading.Thread(target=announce_when_accepting, args=(port,), daemon=True).start()
    Granian(
        "ceiling_app:app", address="127.0.0.1", port=port, interface=Interfaces.ASGI,
        workers=1, loop=Loops.uvloop, http=HTTPModes.http1, websockets=False,
        log_access=False, log_level=LogLevels.warning,
        working_dir=Path(__file__).resolve().parent,
    ).serve()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--server", choices=("uvicorn", "granian"), default="uvicorn")
    args = parser.parse_args(argv)
    if args.server == "granian":
        serve_granian(args.port)
    else:
        serve_uvicorn(args.port)


if __name__ == "__main__":
    main()
