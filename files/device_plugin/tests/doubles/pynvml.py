"""`pynvml` for daemon subprocesses in tests: the PynvmlDouble (tests/pynvml_double.py), set up from
the environment. PYNVML_DOUBLE_SPEC: the simulated spec it answers from; PYNVML_DOUBLE_FAIL_FILE:
while this file exists, nvmlInit fails as if the driver library were missing."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pynvml_double import PynvmlDouble

_fail_file = os.environ.get("PYNVML_DOUBLE_FAIL_FILE", "")
_double: PynvmlDouble | None = None


def __getattr__(name: str) -> object:
    # Built on first use, not at import: the daemon's GPU facts import pynvml while its spec reader,
    # which the double reads its spec with, is still being imported.
    global _double
    if _double is None:
        _double = PynvmlDouble.from_spec(
            os.environ["PYNVML_DOUBLE_SPEC"], init_fails=lambda: bool(_fail_file) and os.path.exists(_fail_file)
        )
    return getattr(_double, name)
