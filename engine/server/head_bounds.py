"""What a request's head (its request line and header fields) may hold, measured on its bytes as
they come, before they are parsed: h11 parses a head of any size it is handed in one read (its
own bound, 16 KiB, holds only while a head is incomplete, and answers 400), so a head of 128 KB
or of 10,000 fields was parsed and served.

The bounds are nginx's defaults (``large_client_header_buffers 4 8k``: a request line or a field
line of at most 8 KiB, 32 KiB in all) and Apache's count (``LimitRequestFields 100``). An OpenAI
client sends about 10 fields of a few hundred bytes; a bearer token (a JWT) fits a line. Past
them: 431 Request Header Fields Too Large (RFC 6585 5), 414 URI Too Long for the request line
(RFC 9110 15.5.15), and the connection closes.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_HEAD_BYTES = 32 * 1024  # the request line and the field lines, with their line ends
MAX_LINE_BYTES = 8 * 1024  # one line, without its line end
MAX_HEADER_FIELDS = 100


@dataclass(frozen=True, slots=True)
class HeadFault:
    """Why a head is refused: the status and what the client is told."""

    status: int
    message: str


class HeadMeter:
    """One request head's measure, fed its bytes as they come (what follows the head, a body or
    the next request, is not read). It keeps the head so far, at most a few bytes past the
    bound, and reads each byte once: a head sent a byte at a time costs what one read would."""

    def __init__(
        self,
        max_bytes: int = MAX_HEAD_BYTES,
        max_line: int = MAX_LINE_BYTES,
        max_fields: int = MAX_HEADER_FIELDS,
    ) -> None:
        self.max_bytes, self.max_line, self.max_fields = max_bytes, max_line, max_fields
        self._head = bytearray()
        self._at = 0  # where the line being read begins
        self._lines = 0  # lines ended: the request line, then fields
        self.done = False  # its blank line has come

    def feed(self, data: bytes) -> HeadFault | None:
        """The head's fault once ``data`` has come (refused as soon as it is past a bound,
        whole or not), or None."""
        if self.done:
            return None
        self._head += data[: self.max_bytes + 3 - len(self._head)]  # enough to see past it
        while (end := self._head.find(b"\n", self._at)) >= 0:
            line = _content(self._head[self._at : end])
            if not line and self._lines:  # the blank line: the head is whole
                self.done = True
                return self._size_fault(self._at)
            if fault := self._line_fault(len(line), self._lines == 0):
                return fault
            self._lines, self._at = self._lines + 1, end + 1
            if self._lines - 1 > self.max_fields:
                return HeadFault(431, f"more than {self.max_fields} header fields; send fewer")
        rest = len(_content(self._head[self._at :]))  # a line still coming (a CR of its end aside)
        return self._line_fault(rest, self._lines == 0) or self._size_fault(self._at + rest)

    def _line_fault(self, size: int, request_line: bool) -> HeadFault | None:
        if size <= self.max_line:
            return None
        if request_line:
            return HeadFault(414, f"request line exceeds {self.max_line} bytes; send a shorter URL")
        return HeadFault(431, f"a header field line exceeds {self.max_line} bytes; send it shorter")

    def _size_fault(self, size: int) -> HeadFault | None:
        if size <= self.max_bytes:
            return None
        return HeadFault(
            431,
            f"request head exceeds {self.max_bytes} bytes (its request line and header fields); "
            "send fewer or shorter header fields",
        )


def _content(line: bytearray) -> bytearray:
    """A line without the CR of its end (h11 takes a bare LF too)."""
    return line[:-1] if line.endswith(b"\r") else line


def head_fault(
    buffer: bytes,
    max_bytes: int = MAX_HEAD_BYTES,
    max_line: int = MAX_LINE_BYTES,
    max_fields: int = MAX_HEADER_FIELDS,
) -> HeadFault | None:
    """The fault of the head at the start of ``buffer`` (whole, or as much as has come)."""
    return HeadMeter(max_bytes, max_line, max_fields).feed(buffer)
