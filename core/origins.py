"""Web origins, parsed: the ``Origin`` header and a project's ``allowedOrigins`` entries.

Both become (scheme, host, port) before they are compared, so text around a host cannot
pass for it: ``https://evil.com/.example.com`` is not a subdomain of ``example.com``,
and neither are ``https://x.example.com@evil.com`` or ``https://evil.com?.example.com``.
Hosts are lowercase ASCII (internationalized names as punycode, as browsers send them),
without a trailing dot; ports are explicit (``https://a.com`` is port 443).

An entry is ``scheme://host[:port]`` (one trailing ``/`` allowed) or ``*`` (any origin);
``scheme://*.host[:port]`` matches every subdomain of ``host``, at any depth, on that
scheme and port, but not ``host`` itself. The ``Origin`` header is held to its exact
serialization: ASCII, no path, no userinfo, no wildcard.
"""

from __future__ import annotations

import ipaddress
import re

import idna
import msgspec

ANY = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SHAPE = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://"
    r"(?P<host>\[[^\]]*\]|[^:/?#@\[\]\\]+)"
    r"(?::(?P<port>[0-9]{1,5}))?"
    r"(?P<slash>/?)",
)
_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
_MAX_HOST = 253  # DNS, without the trailing dot


class Origin(msgspec.Struct, frozen=True):
    scheme: str
    host: str  # lowercase ASCII without trailing dot; IPv6 in brackets
    port: int
    wildcard: bool = False  # host is a parent domain: matches its subdomains only

    def matches(self, origin: Origin) -> bool:
        if (self.scheme, self.port) != (origin.scheme, origin.port):
            return False
        if self.wildcard:
            return origin.host.endswith("." + self.host)
        return self.host == origin.host

    def text(self) -> str:
        """The normal form: ``https://app.example.com``, ``http://*.example.com:8080``."""
        port = "" if _DEFAULT_PORTS[self.scheme] == self.port else f":{self.port}"
        return f"{self.scheme}://{'*.' if self.wildcard else ''}{self.host}{port}"


def parse_origin(header: str) -> Origin | None:
    """The ``Origin`` header as sent by a browser, or None (``null``, malformed, forged)."""
    if not header.isascii():
        return None
    match = _SHAPE.fullmatch(header)
    if match is None or match["slash"]:
        return None
    return _origin(match, wildcard_allowed=False)


def parse_entry(entry: str) -> Origin | None:
    """An ``allowedOrigins`` entry other than ``*``, or None if it is not one."""
    match = _SHAPE.fullmatch(entry.strip())
    return _origin(match, wildcard_allowed=True) if match else None


def _origin(match: re.Match[str], *, wildcard_allowed: bool) -> Origin | None:
    scheme = match["scheme"].lower()
    if scheme not in _DEFAULT_PORTS:
        return None
    host, wildcard = match["host"], False
    if host.startswith("*."):
        if not wildcard_allowed:
            return None
        host, wildcard = host[2:], True
    host = _host(host)
    if host is None or (wildcard and not _is_domain(host)):
        return None
    port = _DEFAULT_PORTS[scheme] if match["port"] is None else int(match["port"])
    if not 0 < port < 65536:
        return None
    return Origin(scheme, host, port, wildcard)


def _host(host: str) -> str | None:
    if host.startswith("["):
        if "%" in host:  # a zone id ("%eth0") is not part of an origin
            return None
        try:
            address = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
        return f"[{address.compressed}]"
    if host.endswith("."):  # the same DNS name as without it
        host = host[:-1]
    if not host.isascii():
        try:  # UTS #46 without transitional mapping, as browsers serialize hosts
            host = idna.encode(host, uts46=True, transitional=False).decode("ascii")
        except idna.IDNAError:
            return None
    host = host.lower()
    labels = host.split(".")
    if len(host) > _MAX_HOST or not all(_LABEL.fullmatch(label) for label in labels):
        return None
    if labels[-1].isdigit():  # a name ending in a number is an IPv4 address to a browser
        try:
            return str(ipaddress.IPv4Address(host))
        except ValueError:
            return None
    return host


def _is_domain(host: str) -> bool:
    return not host.startswith("[") and not host.rsplit(".", 1)[-1].isdigit()
