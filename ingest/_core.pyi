# ingest/_core.c: ingest.wire.decode_columns says what the tuple holds.
def decode(body: bytes, message: int, stack: int, attrs: int, attr: int, /) -> tuple[
    int, bytes | None, list[int], int, int, list[str], list[str], list[str | None], int,
    list[str | None], list[str | None] | None, list[str | None] | None,
    list[str | None] | None] | None: ...
