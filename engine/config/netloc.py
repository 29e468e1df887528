"""A Host header's and an Origin header's parts as HTTP carries them (RFC 9110 7.2, RFC 6454
7), parsed strictly and normalized: two spellings of one server compare equal (``LocalHost.``
and ``localhost``, ``[::ffff:127.0.0.1]`` and ``127.0.0.1``), and a value that is not a host (a
user name before an ``@``, a path, an IPv6 address out of its brackets) is no host at all."""

from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple

DEFAULT_PORTS = {"http": 80, "https": 443}
_NAME = re.compile(r"[a-z0-9\-._~!$&'()*+,;=%]+")  # RFC 3986 reg-name, lowercased
_SCHEME = re.compile(r"[a-z][a-z0-9+.\-]*")


class Authority(NamedTuple):
    """A host (a lowercase name without its trailing dot, or an IP address as ``ipaddress``
    writes it, an IPv4-mapped IPv6 one as IPv4) and its port (None: none given)."""

    host: str
    port: int | None


class Origin(NamedTuple):
    """An origin: its scheme, host (as ``Authority``'s) and port (the scheme's default when
    none was given; None for a scheme without one)."""

    scheme: str
    host: str
    port: int | None

    def serialized(self) -> str:
        """As a browser sends it: the default port left out, an IPv6 host in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if self.port in (None, DEFAULT_PORTS.get(self.scheme)) else f":{self.port}"
        return f"{self.scheme}://{host}{port}"


def ip_text(text: str) -> str | None:
    """``text`` as an IP address normalized (IPv4 for an IPv4-mapped IPv6), or None."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8 and ::1 (``host`` as ``Authority`` holds it)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(text: str) -> str | None:
    """A host alone (no port) normalized: an IP address (an IPv6 one bare or in brackets) or a
    name; None when it is neither."""
    text = text.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1]
        return ip_text(inner) if ":" in inner else None
    if ":" in text:
        return ip_text(text)
    name = text[:-1] if text.endswith(".") else text
    return (ip_text(name) or name) if _NAME.fullmatch(name) else None


def parse_host(value: str) -> Authority | None:
    """A Host header (``NAME``, ``NAME:PORT``, ``[IPv6]:PORT``...) or None when malformed. An
    IPv6 address must be in brackets there: out of them, its last group reads as a port."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        host, rest = value[: end + 1], value[end + 1 :]
    else:
        host, colon, port = value.partition(":")
        rest = colon + port
    name = host_name(host) if host else None
    if name is None or not (rest == "" or rest.startswith(":")):
        return None
    port = rest[1:]
    if port == "":
        return Authority(name, None)
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) <= 65535):
        return None
    return Authority(name, int(port))


def parse_origin(value: str) -> Origin | None:
    """An Origin header (``scheme://host[:port]``, nothing after) or None: ``null`` (a
    sandboxed page, a file) and anything with a path or a user name are no origin."""
    scheme, sep, rest = value.strip().lower().partition("://")
    if not sep or not _SCHEME.fullmatch(scheme) or "@" in rest:
        return None
    where = parse_host(rest)
    if where is None:
        return None
    port = where.port if where.port is not None else DEFAULT_PORTS.get(scheme)
    return Origin(scheme, where.host, port)
