"""Any stack text, through ``parse_stack`` and ``Symbolicator.symbolicate``: never an
exception, always bounded (issue 10: every stored stack is chosen by whoever reads a page).

Hypothesis writes stacks of every engine's format mixed with arbitrary unicode (lone
surrogates and NULs included), positions of every size and sign, very long lines and more
frames than are kept, for URLs with and without an uploaded map. A real ``ArtifactStore``
(SQLite, local storage) serves a hand-written map, so frames really are looked up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.storage import LocalStorage
from ingest.envelope import error_of
from metadata.sqlite import open_db
from symbolicate.lookup import StackInput, Symbolicator
from symbolicate.rewrite import MAX_CONTEXT_CHARS
from symbolicate.sourcemaps import UploadedFile, plan_upload
from symbolicate.stack import MAX_FRAMES, MAX_LINE_CHARS, MAX_MESSAGE_CHARS, parse_stack
from tests.fixtures.sourcemaps import handmade
from tests.symbolicate.test_symbolicate_store import wired

APP = "https://b1.box.parallelsandbox.com/assets/app.js"
PROBLEMS = {None, "missing_sourcemap", "url_mismatch", "malformed_sourcemap", "no_mapping",
            "release_mismatch", "no_original_source", "invalid_location", "no_location",
            "missing_column", "missing_source_name", "missing_sources_content",
            "missing_minified_source"}  # internal_error and sourcemap_unavailable: never here
SOURCE = "\n".join(f"line {i} " + "x" * (i * 37 % 300) for i in range(40))


class Setup(NamedTuple):
    loop: asyncio.AbstractEventLoop
    symbolicator: Symbolicator


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root: Path = tmp_path_factory.mktemp("hostile-stacks")
    loop = asyncio.new_event_loop()
    store, symbolicator = wired(open_db(root / "meta.sqlite"),
                                LocalStorage(str(root / "objects")))
    source_map = handmade.source_map(
        handmade.mappings([[(0, 0, 0, 0), (9,), (9, 1, 2, 3)], [(0, 0, 30, 100)]]),
        sources=["src/app.js", None], contents=[SOURCE, None])
    files = [UploadedFile("assets/app.js", handmade.JS.encode()),
             UploadedFile("assets/app.js.map", handmade.dumps(source_map))]
    loop.run_until_complete(store.upload("prj_1", "1.0", plan_upload(files, "~/")))
    yield Setup(loop, symbolicator)
    loop.close()


# Any code point: NULs, controls, and lone surrogates (which characters() leaves out unless
# asked: they cannot be encoded, so SQLite and UTF-8 encoders refuse them).
ANY_CHAR = st.one_of(st.characters(codec=None), st.characters(categories=["Cs"]))
TEXT = st.text(ANY_CHAR, max_size=12)
NAME = st.one_of(st.sampled_from(["f", "Object.<anonymous>", "async g", "new C", "h [as i]",
                                  "", "@", "a@b", "eval code", "global code"]), TEXT)
URL = st.one_of(st.just(APP), st.sampled_from([APP, APP + "?v=1#x", "https://[b1/assets/app.js",
                                               "https://b1\ud800/assets/app.js\x00",
                                 "~/assets/app.js", "/assets/app.js", "app.js",
                                 "data:text/javascript;base64," + "A" * 500, "<anonymous>",
                                 "https://other.test/assets/app.js", "native"]),
                TEXT.map(lambda t: f"https://{t}/app.js"))
SMALL = st.integers(0, 40).map(str)  # where the map has mappings, and just past them
NUMBER = st.one_of(SMALL, SMALL, SMALL, st.integers(-(2**40), 2**40).map(str),
                   st.sampled_from([0, 1, 2, 10, 19, 2**31 - 1, 2**31, 2**32, 10**9 - 1, 10**30])
                   .map(str),
                   st.sampled_from(["", "-1", "1.5", "\u0663", "9" * 5000, "0x10", " 1"]))
FRAME = st.one_of(
    st.builds("    at {} ({}:{}:{})".format, NAME, URL, NUMBER, NUMBER),
    st.builds("    at {}:{}:{}".format, URL, NUMBER, NUMBER),
    st.builds("    at async {} ({}:{})".format, NAME, URL, NUMBER),
    st.builds("    at eval (eval at {} ({}:{}:{}), <anonymous>:{}:{})".format,
              NAME, URL, NUMBER, NUMBER, NUMBER, NUMBER),
    st.builds("{}@{}:{}:{}".format, NAME, URL, NUMBER, NUMBER),
    st.builds("{}@{} line {} > eval:{}:{}".format, NAME, URL, NUMBER, NUMBER, NUMBER),
    st.builds("{}:{}:{}".format, URL, NUMBER, NUMBER),
    st.sampled_from(["[native code]", "    at Array.map (<anonymous>)", "eval code",
                     "    at async Promise.all (index 0)", "@", "at", "\x00", "\ud800"]),
    TEXT,
)


@st.composite
def stacks(draw: st.DrawFn) -> str:
    frames = draw(st.lists(FRAME, max_size=12))
    if frames and draw(st.booleans()):  # more frames than are kept
        frames = frames * draw(st.integers(1, 2 * MAX_FRAMES))
    if frames and draw(st.booleans()):  # a line past the cut, either end kept
        at = draw(st.integers(0, len(frames) - 1))
        frames[at] = draw(TEXT) * 9000 + frames[at]
    message = draw(st.one_of(st.none(), st.just("TypeError: x"), TEXT,
                             st.just("E" * (3 * MAX_MESSAGE_CHARS))))
    lines = ([message] if message is not None else []) + frames
    return draw(st.sampled_from(["\n", "\r\n", "\r", "\n\n"])).join(lines)


INPUTS = st.builds(StackInput, release=st.one_of(st.none(), st.just("1.0"), st.just("\udfff"),
                                                 TEXT),
                   debug_ids=st.dictionaries(URL, st.one_of(TEXT, st.uuids().map(str)),
                                             max_size=3),
                   stack=stacks(), header=st.one_of(st.none(), TEXT), frames=st.none())


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(INPUTS, min_size=1, max_size=4))
def test_any_stack_text_is_symbolicated_within_bounds(setup: Setup,
                                                      items: list[StackInput]) -> None:
    for item in items:
        parsed = parse_stack(item.stack)
        assert len(parsed.frames) <= MAX_FRAMES
    started = time.process_time()
    results = setup.loop.run_until_complete(setup.symbolicator.symbolicate("prj_1", items))
    assert time.process_time() - started < 5
    assert len(results) == len(items)
    for item, result in zip(items, results, strict=True):
        assert len(result.frames) <= MAX_FRAMES
        header = max(MAX_MESSAGE_CHARS, len(item.header or ""))
        assert len(result.stack) <= header + len(result.frames) * (2 * MAX_LINE_CHARS) + 100
        for frame in result.frames:
            assert frame.problem in PROBLEMS, frame
            assert 0 < len(frame.raw) <= MAX_LINE_CHARS
            for text in (frame.context_line, *frame.pre_context, *frame.post_context):
                assert text is None or len(text) <= MAX_CONTEXT_CHARS + 2
            if frame.symbolicated:
                assert frame.line is not None and 1 <= frame.line <= 2**31
                assert frame.column is not None and 1 <= frame.column <= 2**31


# Frames as Sentry's SDKs send them, structured (ingest.envelope): any value in any field.
SENT_VALUE = st.one_of(st.none(), st.booleans(), TEXT, URL, NAME, st.integers(-(2**40), 2**40),
                       st.floats(allow_nan=False), st.sampled_from([0, 1, 2**31, 2**31 - 1]),
                       st.text(ANY_CHAR, min_size=5000, max_size=9000))
SENT_FRAME = st.fixed_dictionaries({}, optional={
    "abs_path": SENT_VALUE, "filename": SENT_VALUE, "function": SENT_VALUE,
    "lineno": st.one_of(SENT_VALUE, SMALL.map(int)), "colno": st.one_of(SENT_VALUE,
                                                                      SMALL.map(int))})


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(st.lists(SENT_FRAME, max_size=8), min_size=1, max_size=3),
       st.one_of(st.none(), TEXT))
def test_any_structured_frames_are_symbolicated_within_bounds(
        setup: Setup, sent: list[list[dict[str, object]]], header: str | None) -> None:
    items = []
    for frames in sent:
        error, kept = error_of({"exception": {"values": [
            {"type": "TypeError", "value": "x", "stacktrace": {"frames": frames}}]}})
        assert len(kept) == len(frames)
        items.append(StackInput(release="1.0", debug_ids={}, stack=(error and error.stack) or "",
                                header=header, frames=kept))
    results = setup.loop.run_until_complete(setup.symbolicator.symbolicate("prj_1", items))
    for item, result in zip(items, results, strict=True):
        assert len(result.frames) == len(item.frames or [])
        for frame, kept in zip(result.frames, item.frames or [], strict=True):
            assert frame.problem in PROBLEMS, frame
            assert 0 < len(frame.raw) <= MAX_LINE_CHARS and frame.raw == kept.raw
            if frame.symbolicated:
                assert frame.file is None or frame.file.startswith("src/")
                assert frame.line is not None and 1 <= frame.line <= 2**31
