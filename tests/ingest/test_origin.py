"""allowedOrigins against the Origin header: parsed hosts, not strings."""

from __future__ import annotations

import re

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidParameter
from ingest.origin import box_from_origin, box_pattern, origin_allowed
from tenancy.tenants import validate_origins

PROPERTY = settings(max_examples=400, deadline=None, derandomize=True, database=None)


@pytest.mark.parametrize(("entry", "origin", "allowed"), [
    ("https://*.example.com", "https://a.example.com", True),
    ("https://*.example.com", "https://a.b.example.com", True),
    ("https://*.example.com", "https://A.EXAMPLE.COM", True),
    ("https://*.example.com", "https://a.example.com.", True),  # the same DNS name
    ("https://*.example.com", "https://example.com", False),  # subdomains only
    ("https://*.example.com", "http://a.example.com", False),
    ("https://*.example.com", "https://a.example.com:8443", False),
    ("https://*.example.com:8443", "https://a.example.com:8443", True),
    ("https://*.example.com", "https://evilexample.com", False),
    # Text around a host does not pass for it.
    ("https://*.example.com", "https://evil.com/.example.com", False),
    ("https://*.example.com", "https://evil.com?.example.com", False),
    ("https://*.example.com", "https://evil.com#.example.com", False),
    ("https://*.example.com", "https://evil.com\\.example.com", False),
    ("https://*.example.com", "https://a.example.com@evil.com", False),
    ("https://*.example.com", "https://evil.com:1@a.example.com", False),
    ("https://*.example.com", "https://a.example.com/", False),
    ("https://*.example.com", "https://a.example.com ", False),
    ("https://app.example.com", "https://app.example.com/x", False),
    ("https://app.example.com", "https://app.example.com.evil.com", False),
    # Default ports, case, punycode: equal origins are equal.
    ("https://app.example.com", "https://app.example.com:443", True),
    ("https://app.example.com:443", "https://app.example.com", True),  # stored before
    ("HTTPS://APP.Example.com", "https://app.example.com", True),
    ("https://*.bücher.de", "https://shop.xn--bcher-kva.de", True),
    ("https://straße.de", "https://xn--strae-oqa.de", True),  # as browsers map it (UTS #46)
    ("https://xn--bcher-kva.de", "https://bücher.de", False),  # a browser sends ASCII
    # Addresses.
    ("http://127.0.0.1:3000", "http://127.0.0.1:3000", True),
    ("http://[::1]:3000", "http://[0:0::1]:3000", True),
    ("https://*.0.0.1", "https://127.0.0.1", False),  # not an entry: never matches
    # Opaque origins.
    ("https://app.example.com", "null", False),
    ("*", "null", True),
])
def test_origin_allowed(entry: str, origin: str, allowed: bool) -> None:
    assert origin_allowed(origin, [entry]) is allowed


def test_no_entries_or_no_origin_allow_all() -> None:
    assert origin_allowed("https://evil.com", [])
    assert origin_allowed(None, ["https://app.example.com"])


@pytest.mark.parametrize("entry", [
    "https://*.example.com/path", "https://user@x.com", "https://a.com:99999",
    "https://a.com:0", "https://a*.example.com", "https://*.*.example.com", "https://*",
    "ftp://x.com", "https://", "https://a.com?x", "https://a.com#x", "https://a.com//",
    "https://*.1.2.3", "https://1.2.3.999", "http://[::1%eth0]", "http://[zz::1]",
    "https://exa mple.com", "https://a..com", "//a.com", "a.com", "https://-\u0301.com",
    "https://" + "a" * 64 + ".com", "https://" + "a." * 127 + "com",
])
def test_an_entry_that_is_not_an_origin_is_refused_by_name(entry: str) -> None:
    with pytest.raises(InvalidParameter) as raised:
        validate_origins(["https://ok.example.com", entry])
    assert raised.value.detail == {"field": "allowedOrigins", "value": entry}
    assert repr(entry) in raised.value.message


@pytest.mark.parametrize(("entry", "stored"), [
    ("https://Bücher.DE/", "https://xn--bcher-kva.de"),
    ("HTTPS://A.com:443", "https://a.com"),
    ("http://a.com:80/", "http://a.com"),
    ("https://a.com:8443", "https://a.com:8443"),
    ("https://*.Example.com.", "https://*.example.com"),
    ("http://[0:0::1]:8080", "http://[::1]:8080"),
    ("http://my_app.localhost:3000", "http://my_app.localhost:3000"),
    ("*", "*"),
])
def test_entries_are_stored_in_normal_form(entry: str, stored: str) -> None:
    assert validate_origins([entry]) == [stored]


def test_a_project_with_a_bad_entry_is_a_400_naming_it(api: httpx.Client) -> None:
    bad = "https://*.example.com/app"
    response = api.post("/v1/projects", json={
        "name": "web", "allowedOrigins": ["https://ok.example.com", bad]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_parameter"
    assert error["detail"] == {"field": "allowedOrigins", "value": bad}
    assert bad in error["message"]
    response = api.post("/v1/projects", json={"name": "web",
                                              "allowedOrigins": ["https://Bücher.de/"]})
    assert response.status_code == 201, response.text
    assert response.json()["allowedOrigins"] == ["https://xn--bcher-kva.de"]


def test_box_id_is_read_from_the_parsed_host_only() -> None:
    pattern = box_pattern("{box}.box.example.com")
    assert box_from_origin("https://b1.box.example.com", pattern) == "b1"
    assert box_from_origin("https://B1.box.example.com.", pattern) == "b1"
    assert box_from_origin("https://evil.com@b1.box.example.com", pattern) is None
    assert box_from_origin("https://b1.box.example.com/x", pattern) is None


# Properties.

_label = st.from_regex(r"[a-z0-9]([a-z0-9_-]{0,8}[a-z0-9])?", fullmatch=True)
_name = st.lists(_label, min_size=1, max_size=3).filter(
    lambda labels: not labels[-1].isdigit()).map(".".join)
_scheme = st.sampled_from(["http", "https"])
_port = st.one_of(st.none(), st.integers(1, 65535))


def _serialize(scheme: str, host: str, port: int | None) -> str:
    """As a browser writes the Origin header: no default port."""
    default = {"http": 80, "https": 443}[scheme]
    return f"{scheme}://{host}" + ("" if port in (None, default) else f":{port}")


@PROPERTY
@given(scheme=_scheme, host=_name, port=_port, other_port=_port,
       upper=st.booleans(), dot=st.booleans(), slash=st.booleans())
def test_an_origin_is_allowed_by_its_own_entry_in_any_spelling(
        scheme: str, host: str, port: int | None, other_port: int | None,
        upper: bool, dot: bool, slash: bool) -> None:
    origin = _serialize(scheme, host, port)
    entry = f"{scheme}://{host}{'.' if dot else ''}" + ("" if port is None else f":{port}")
    entry = (entry.upper() if upper else entry) + ("/" if slash else "")
    stored = validate_origins([entry])
    assert stored == [origin]
    assert validate_origins(stored) == stored  # the normal form is a fixed point
    assert origin_allowed(origin, [entry]) and origin_allowed(origin, stored)
    other_scheme = "http" if scheme == "https" else "https"
    assert not origin_allowed(_serialize(other_scheme, host, port), stored)
    default = {"http": 80, "https": 443}[scheme]
    if (other_port or default) != (port or default):
        assert not origin_allowed(_serialize(scheme, host, other_port), stored)


@PROPERTY
@given(scheme=_scheme, base=_name, sub=st.lists(_label, min_size=1, max_size=3).map(".".join),
       port=_port)
def test_a_wildcard_allows_exactly_the_subdomains(
        scheme: str, base: str, sub: str, port: int | None) -> None:
    entry = f"{scheme}://*.{base}" + ("" if port is None else f":{port}")
    assert origin_allowed(_serialize(scheme, f"{sub}.{base}", port), [entry])
    assert not origin_allowed(_serialize(scheme, base, port), [entry])
    assert not origin_allowed(_serialize(scheme, f"{sub}{base}", port), [entry])


_PIECES = ["https://", "http://", "evil.com", "example.com", ".example.com", "app.example.org",
           "a", ".", "..", "@", "/", "?", "#", ":", "443", "8443", "\\", "%2e", "*", " ", "\t",
           "[", "]", "::1", "ü", "xn--", "-", "_", "\r\n", "\x00", "。"]
_ALLOWED = ["https://*.example.com", "https://app.example.org"]
_ONLY = re.compile(r"https://(([a-z0-9_-]+\.)+example\.com|app\.example\.org)\.?(:0*443)?",
                   re.IGNORECASE)


@PROPERTY
@given(st.one_of(st.lists(st.sampled_from(_PIECES), max_size=8).map("".join),
                 st.text(max_size=40).map(lambda t: "https://" + t)))
def test_text_around_a_host_never_passes_for_it(origin: str) -> None:
    if origin_allowed(origin, _ALLOWED):
        assert origin == "" or _ONLY.fullmatch(origin), origin  # "": no Origin, not a browser


@PROPERTY
@given(st.one_of(st.text(max_size=60),
                 st.lists(st.sampled_from(_PIECES), max_size=8).map("".join)))
def test_validation_either_refuses_an_entry_or_stores_a_normal_form(entry: str) -> None:
    try:
        stored = validate_origins([entry])
    except InvalidParameter as exc:
        assert exc.detail == {"field": "allowedOrigins", "value": entry}
        return
    assert stored[0].isascii() and stored[0] == stored[0].lower()
    assert validate_origins(stored) == stored
