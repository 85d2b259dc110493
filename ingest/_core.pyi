# ingest/_core.c: ingest.wire.decode_columns says what the tuple holds.
_Strings = tuple[bytes, bytes, bytes | None]  # offsets, data, validity

def decode(body: bytes, message: int, stack: int, attrs: int, attr: int, /) -> tuple[
    int, bytes | None, bytes, int, int, _Strings, _Strings, _Strings, int, _Strings,
    _Strings | None, _Strings | None, _Strings | None] | None: ...
