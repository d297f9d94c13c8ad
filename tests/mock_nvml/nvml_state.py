#!/usr/bin/env python
"""Write the mock NVML library's state from simulated-GPU specs (labs and CI only; docs/mock-nvml.md).

    nvml_state.py SPEC STATE                  write STATE once from SPEC
    nvml_state.py --watch SPEC STATE [...]    and again whenever a SPEC changes, until killed

The spec reader of the collection (plugins/module_utils/_simulated_spec.py) reads the spec and decides
what the library serves; the state is written atomically (a new file renamed over the old), and a spec
that breaks a rule leaves the last good state in place and says why on stderr.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "module_utils"))

import _simulated_spec


def state_text(spec_path: str | os.PathLike[str]) -> str:
    """The state for the spec at ``spec_path``; SpecError names what is wrong with it."""
    return _simulated_spec.mock_nvml_state_text(_simulated_spec.load_spec(str(spec_path)), str(spec_path))


def write_state(spec_path: str | os.PathLike[str], state_path: str | os.PathLike[str]) -> None:
    text = state_text(spec_path)
    target = Path(state_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".nvml-state.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def watch(pairs: list[tuple[str, str]], interval: float = 0.05) -> None:
    seen: dict[str, tuple[int, int, int] | None] = {}
    while True:
        for spec, state in pairs:
            stamp = _stamp(spec)
            if stamp is not None and stamp != seen.get(spec):
                seen[spec] = stamp
                try:
                    write_state(spec, state)
                except _simulated_spec.SpecError as exc:
                    print(f"nvml_state: {exc} The last state stays.", file=sys.stderr, flush=True)
        time.sleep(interval)


def main(argv: list[str]) -> int:
    watching = bool(argv) and argv[0] == "--watch"
    args = argv[1:] if watching else argv
    if not args or len(args) % 2 or (not watching and len(args) != 2):
        print(__doc__, file=sys.stderr)
        return 2
    pairs = list(zip(args[::2], args[1::2]))
    try:
        for spec, state in pairs:
            write_state(spec, state)
    except _simulated_spec.SpecError as exc:
        print(f"nvml_state: {exc}", file=sys.stderr)
        return 1
    if watching:
        watch(pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
