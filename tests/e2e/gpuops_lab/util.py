"""Progress lines, subprocesses and polling, the way every lab command reports them."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import LabError


def log(message: str) -> None:
    """A ``[lab] ...`` progress line on stderr."""
    print(f"[lab] {message}", file=sys.stderr, flush=True)


def run(argv: Sequence[str | Path], *, what: str | None = None, **kwargs) -> subprocess.CompletedProcess[str]:
    """Run a command (stdout captured, stderr to the terminal unless given); a failure is a LabError."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    argv = [str(a) for a in argv]
    try:
        done = subprocess.run(argv, text=True, check=False, **kwargs)
    except FileNotFoundError as error:
        raise LabError(f"{argv[0]} is not installed ({error.strerror})") from error
    if done.returncode != 0:
        raise LabError(f"{what or ' '.join(argv[:3])} failed (exit {done.returncode})")
    return done


def succeeds(argv: Sequence[str | Path], **kwargs) -> bool:
    """Whether a command exits 0 (its output discarded)."""
    try:
        return (
            subprocess.run(
                [str(a) for a in argv],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
                **kwargs,
            ).returncode
            == 0
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


def output(argv: Sequence[str | Path], **kwargs) -> str | None:
    """A command's stdout, or None when it fails."""
    try:
        done = subprocess.run(
            [str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False, **kwargs
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def wait_for(what: str, timeout: int, ready: Callable[[], bool], logs: Path) -> None:
    """Poll ``ready`` once a second until it holds; log how long that took, or fail after ``timeout`` s."""
    start = time.monotonic()
    while not ready():
        if time.monotonic() - start > timeout:
            raise LabError(f"timed out after {timeout}s waiting for {what} (logs: {logs})")
        time.sleep(1)
    log(f"{what} after {int(time.monotonic() - start)}s")
