"""Host and Origin values parsed strictly and normalized: the spellings of one server compare
equal, and what is not a host (a user name, a path, an IPv6 address out of brackets, a port
out of range) is None."""

from __future__ import annotations

import pytest

from engine.config.netloc import Authority, Origin, host_name, is_loopback, parse_host, parse_origin


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("localhost", ("localhost", None)),
        ("LocalHost:8000", ("localhost", 8000)),
        ("localhost.", ("localhost", None)),
        ("localhost:", ("localhost", None)),  # RFC 3986: an empty port is no port
        ("127.0.0.1:8000", ("127.0.0.1", 8000)),
        ("[::1]", ("::1", None)),
        ("[::1]:8000", ("::1", 8000)),
        ("[0:0:0:0:0:0:0:1]:80", ("::1", 80)),
        ("[::FFFF:127.0.0.1]:1", ("127.0.0.1", 1)),  # IPv4-mapped: the IPv4 address
        ("llm.example:65535", ("llm.example", 65535)),
        (" gpu1 ", ("gpu1", None)),
    ],
)
def test_a_host_header_is_its_normalized_host_and_port(value, want):
    assert parse_host(value) == Authority(*want)


@pytest.mark.parametrize(
    "value",
    [
        "",
        ":80",
        "::1",
        "::1:80",
        "[::1",
        "[::1]x",
        "[::1]:x",
        "[zz]",
        "[127.0.0.1]",
        "a:b",
        "a:8000:1",
        "a:99999",
        "a:123456",
        "a:-1",
        "a:+1",
        "x@y",
        "user@localhost",
        "evil.example@127.0.0.1",
        "a b",
        "a/b",
        "localhost/",
        "[::1]/x",
        "a:٣",
    ],
)
def test_what_is_not_a_host_is_none(value):
    assert parse_host(value) is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("::ffff:10.0.0.5", "10.0.0.5"),
        ("0.0.0.0", "0.0.0.0"),
        ("Gpu1.Corp.", "gpu1.corp"),
        ("testserver", "testserver"),
        ("a b", None),
        ("[x]", None),
    ],
)
def test_a_host_alone_normalizes_a_bare_ipv6_address_as_a_socket_writes_it(text, want):
    assert host_name(text) == want


@pytest.mark.parametrize(
    ("host", "want"),
    [
        ("127.0.0.1", True),
        ("127.255.0.9", True),
        ("::1", True),
        ("localhost", False),
        ("128.0.0.1", False),
        ("::2", False),
        ("10.0.0.1", False),
    ],
)
def test_loopback_is_127_slash_8_and_colon_colon_1(host, want):
    assert is_loopback(host) is want


@pytest.mark.parametrize(
    ("value", "want", "serialized"),
    [
        ("http://localhost:3000", ("http", "localhost", 3000), "http://localhost:3000"),
        ("HTTPS://App.Example", ("https", "app.example", 443), "https://app.example"),
        ("https://app.example:443", ("https", "app.example", 443), "https://app.example"),
        ("http://app.example:80", ("http", "app.example", 80), "http://app.example"),
        ("http://[::1]:8000", ("http", "::1", 8000), "http://[::1]:8000"),
        (
            "chrome-extension://abcdef",
            ("chrome-extension", "abcdef", None),
            "chrome-extension://abcdef",
        ),
    ],
)
def test_an_origin_is_its_scheme_host_and_port_written_as_a_browser_writes_it(
    value, want, serialized
):
    got = parse_origin(value)
    assert got == Origin(*want)
    assert got.serialized() == serialized


@pytest.mark.parametrize(
    "value",
    [
        "null",
        "",
        "localhost:3000",
        "http://",
        "http://a/",
        "http://a/path",
        "http://u@a",
        "http://a:x",
        "1http://a",
        "http//a",
        "http://[::1",
        "file:///etc/passwd",
    ],
)
def test_what_is_not_an_origin_is_none(value):
    assert parse_origin(value) is None
