# ingest/_core.c: ingest.wire.decode_columns says what the tuple holds.
_Strings = tuple[bytes, bytes, bytes | None]  # offsets, data, validity

def decode(body: bytes, message: int, stack: int, attrs: int, attr: int, /) -> tuple[
    int, bytes | None, bytes, int, int, _Strings, _Strings, _Strings, int, _Strings,
    _Strings | None, _Strings | None, _Strings | None] | None: ...

def logs(payload: bytes, message: int, attrs: int, attr: int, max_tags: int, min_ts: int, /
         ) -> tuple[int, str | None, bytes, int, int, _Strings, _Strings, _Strings] | None: ...
