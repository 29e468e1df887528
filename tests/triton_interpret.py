"""Import this before anything imports triton: it selects Triton's interpreter for the process.

Triton decides between interpreter and compiler when its own library and our kernels are
decorated, and looks at ``TRITON_INTERPRET`` again on later launches, so the variable has to be
set before the first ``import triton`` and stay set. Nothing else in the suite imports triton, so
the only behaviour it changes is the Triton kernels': they run on CPU tensors. ``setdefault``: an
explicit ``TRITON_INTERPRET=0`` (a GPU machine running the compiled kernels) is respected, and the
tests that need the interpreter then skip.
"""

from __future__ import annotations

import importlib.util
import os
import sys

if importlib.util.find_spec("triton") is not None and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def interpreted_kernels():
    """The kernels module when it runs under the interpreter in this process, else None."""
    if importlib.util.find_spec("triton") is None:
        return None
    from kernels import triton_kernels

    return triton_kernels if triton_kernels.INTERPRETED else None
