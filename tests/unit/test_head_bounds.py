"""A request head is measured before it is parsed: its size, its lines and its field count, on
what has come so far, so a head still arriving is refused as soon as it is past a bound, and a
head within them is never refused for the bytes around it (a body, the next request, a blank
line begun)."""

from __future__ import annotations

from engine.server.head_bounds import head_fault

START = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"


def fields(n: int, size: int = 12) -> bytes:
    """``n`` field lines of ``size`` bytes with their CRLF."""
    return b"".join(b"X-%05d: " % i + b"a" * (size - 11) + b"\r\n" for i in range(n))


def test_a_head_within_its_bounds_passes_whole_or_in_part_with_what_follows_it():
    head = START + fields(2) + b"\r\n"  # Host and 2: 3 fields, 58 bytes, lines of 23 at most
    assert len(head) - 2 == 58
    for cut in range(len(head) + 1):  # every prefix: a head still arriving
        assert head_fault(head[:cut], 58, 23, 3) is None, head[:cut]
    assert head_fault(head + b"x" * 1000, 58, 23, 3) is None  # a body after it is not the head's
    assert head_fault(head.replace(b"\r\n", b"\n"), 58, 23, 3) is None  # bare LF ends too


def test_each_bound_is_refused_past_it_with_its_status():
    assert head_fault(START + fields(2) + b"\r\n", 1000, 100, 3) is None
    fault = head_fault(START + fields(3), 1000, 100, 3)  # still arriving: refused already
    assert (fault.status, fault.message) == (431, "more than 3 header fields; send fewer")
    fault = head_fault(START + fields(1, 26) + b"\r\n", 1000, 23, 5)
    assert fault.status == 431 and "a header field line exceeds 23 bytes" in fault.message
    fault = head_fault(b"GET /" + b"a" * 20 + b" HTTP/1.1", 1000, 23, 5)  # no line end yet
    assert fault.status == 414 and "request line exceeds 23 bytes" in fault.message
    fault = head_fault(START + fields(30), 100, 1000, 1000)
    assert fault.status == 431 and "request head exceeds 100 bytes" in fault.message


def test_the_size_is_the_heads_up_to_its_blank_line():
    head = START + fields(4, 10)
    size = len(head)
    assert head_fault(head + b"\r\n" + b"x" * 5000, size, 100, 100) is None
    assert head_fault(head + b"\r\n", size - 1, 100, 100).status == 431


def test_a_head_fed_a_byte_at_a_time_meets_the_same_fate_as_at_once():
    from engine.server.head_bounds import HeadMeter

    heads = [START + fields(n, size) + b"\r\n" + b"body" for n in (0, 2, 3, 5) for size in (12, 30)]
    heads.append(b"GET /" + b"a" * 30 + b" HTTP/1.1\r\n\r\n")
    seen = set()
    for head in heads:
        for most in (50, 80):  # 50: the size's fault before the count's
            whole = head_fault(head, most, 24, 3)
            meter = HeadMeter(most, 24, 3)
            faults = [f for i in range(len(head)) if (f := meter.feed(head[i : i + 1]))]
            assert (faults[0] if faults else None) == whole, head
            seen.add(" ".join(whole.message.split(" ")[:2]) if whole else None)
    assert seen == {None, "request head", "request line", "more than", "a header"}
