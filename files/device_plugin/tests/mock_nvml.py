"""The lab's mock libnvidia-ml.so.1 in this test process: the real pynvml (nvidia-ml-py) bound to it.

The library (tests/mock_nvml/ at the top of the repository, built by scripts/build-mock-nvml.sh) is a
TEST DOUBLE of NVIDIA's driver library: NVML's C ABI answering from a state file. A watcher process
(tests/mock_nvml/nvml_state.py --watch) rewrites that state from the simulated-GPU spec whenever the
spec changes, as the lab does for its nodes; so a test edits the spec and the library follows."""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
import time
from typing import Any, Optional

from harness import REPO

LIBRARY = "libnvidia-ml.so.1"
STATE_VARIABLE = "GPUOPS_MOCK_NVML_STATE"
STATE_WRITER = os.path.join(REPO, "tests", "mock_nvml", "nvml_state.py")


@functools.cache
def library_dir() -> str:
    """The directory holding the built library (built once, cached by content in $GPUOPS_CACHE)."""
    done = subprocess.run(
        [os.path.join(REPO, "scripts", "build-mock-nvml.sh")], stdout=subprocess.PIPE, text=True, check=True
    )
    return done.stdout.strip()


@functools.cache
def real_pynvml() -> Any:
    """The real pynvml module, bound to the mock library: loaded by path first, so that pynvml's own
    dlopen of libnvidia-ml.so.1 finds it by its soname."""
    ctypes.CDLL(os.path.join(library_dir(), LIBRARY), mode=ctypes.RTLD_GLOBAL)
    import pynvml

    assert "pynvml_double" not in getattr(pynvml, "__file__", ""), "the real pynvml is expected here"
    return pynvml


class MockNvml:
    """The state of the library follows ``spec``: written now, and again whenever the spec changes."""

    def __init__(self, spec: str, state: str) -> None:
        self.spec, self.state = spec, state
        self._previous: Optional[str] = os.environ.get(STATE_VARIABLE)
        self._watcher = subprocess.Popen([sys.executable, STATE_WRITER, "--watch", spec, state])
        deadline = time.monotonic() + 10
        while not os.path.exists(state):
            assert self._watcher.poll() is None, "the state writer exited"
            assert time.monotonic() < deadline, "the state writer wrote no state"
            time.sleep(0.01)
        os.environ[STATE_VARIABLE] = state
        self.pynvml = real_pynvml()

    def env(self) -> dict[str, str]:
        """What a daemon process needs to load this library and read this state (and its MIG layout,
        kept beside the state: docs/mock-nvml.md)."""
        return {"LD_LIBRARY_PATH": library_dir(), STATE_VARIABLE: self.state}

    def reset_gpu(self, uuid: str, force: bool = False) -> int:
        """What `nvidia-smi --gpu-reset` does to the GPU's MIG state (the library's test hook; a pending MIG
        mode becomes current, GPU instances are gone); ``force`` as a reboot does, whoever has NVML open.
        Returns the NVML code."""
        lib = ctypes.CDLL(os.path.join(library_dir(), LIBRARY))
        lib.gpuopsMockNvmlResetGpu.argtypes = [ctypes.c_char_p, ctypes.c_uint]
        return int(lib.gpuopsMockNvmlResetGpu(uuid.encode(), int(force)))

    def close(self) -> None:
        self._watcher.kill()
        self._watcher.wait()
        if self._previous is None:
            os.environ.pop(STATE_VARIABLE, None)
        else:
            os.environ[STATE_VARIABLE] = self._previous
