"""The CPU a benchmark ran on: its model, core count and vector flags. This machine kind's CPU
varies (AVX-512 one day, AVX2 only the next), so every benchmark prints this with its table.
The scripts here import it beside them; the description itself is the library's, the one
`engine bench --table` prints."""

from __future__ import annotations

from measure.method import describe_cpu as describe

__all__ = ["describe"]
