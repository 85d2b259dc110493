"""A small Server-Sent Events reader for tests, over an httpx streaming response."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx


@dataclass
class Message:
    event: str | None = None
    id: str | None = None
    data: str = ""
    comment: str | None = None

    def json(self) -> dict[str, object]:
        return json.loads(self.data)  # type: ignore[no-any-return]


def messages(response: httpx.Response) -> Iterator[Message]:
    current = Message()
    started = False
    for line in response.iter_lines():
        if line == "":
            if started:
                yield current
            current, started = Message(), False
            continue
        started = True
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "":
            current.comment = value
        elif name == "data":
            current.data = value if not current.data else current.data + "\n" + value
        elif name in ("event", "id"):
            setattr(current, name, value)


@dataclass
class Tail:
    """Reads a tail on a thread, collecting what arrives until closed."""

    client: httpx.Client
    path: str
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    received: list[Message] = field(default_factory=list)
    status: int = 0
    ended: str = ""  # why the stream ended before close() was called: "" while it is open

    def __post_init__(self) -> None:
        self._opened = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._opened.wait(10), "tail did not open"

    def _run(self) -> None:
        try:
            with self.client.stream("GET", self.path, params=self.params, headers=self.headers,
                                    timeout=httpx.Timeout(30, read=None)) as response:
                self.status = response.status_code
                self._opened.set()
                if response.status_code != 200:
                    response.read()
                    return
                for message in messages(response):
                    self.received.append(message)
                    if self._stop.is_set():
                        return
                if not self._stop.is_set():
                    self.ended = "the server ended the stream"
        except httpx.HTTPError as exc:
            if not self._stop.is_set():
                self.ended = f"{type(exc).__name__}: {exc}"
            self._opened.set()

    def logs(self) -> list[dict[str, object]]:
        return [m.json() for m in list(self.received) if m.event == "log"]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
