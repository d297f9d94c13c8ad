"""The end-to-end lab: a real Kubernetes control plane on 127.0.0.1 and GPU nodes as podman containers.

``tests/e2e/lab.py`` is its command line (:mod:`gpuops_lab.cli`); :mod:`gpuops_lab.config` says what
each lab instance is called and where it listens, the other modules make and remove those things.
"""

from __future__ import annotations


class LabError(Exception):
    """A failure to report as one ``[lab] error: ...`` sentence (no traceback); ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code
