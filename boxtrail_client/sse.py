"""Server-Sent Events, as a tail sends them: ``(event, id, data)`` per message."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator


class Reader:
    """Lines in, messages out; comments (heartbeats) and ``retry`` are skipped."""

    def __init__(self) -> None:
        self.event: str | None = None
        self.id: str | None = None
        self.data: list[str] = []

    def line(self, line: str) -> tuple[str | None, str | None, str] | None:
        if not line:
            message = (self.event, self.id, "\n".join(self.data)) if self.data else None
            self.event, self.id, self.data = None, None, []
            return message
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self.event = value
        elif name == "id":
            self.id = value
        elif name == "data":
            self.data.append(value)
        return None


def messages(lines: Iterable[str]) -> Iterator[tuple[str | None, str | None, str]]:
    reader = Reader()
    for line in lines:
        if (message := reader.line(line)) is not None:
            yield message


async def amessages(lines: AsyncIterator[str]
                    ) -> AsyncIterator[tuple[str | None, str | None, str]]:
    reader = Reader()
    async for line in lines:
        if (message := reader.line(line)) is not None:
            yield message
