"""A guard: no NVML path of the project is exercised only against the Python double of pynvml.

Every NVML function the project's code names (the daemon, the DRA driver, and the collection's
modules and module_utils) must be reached through the real nvidia-ml-py bindings on the mock
libnvidia-ml.so.1 (mock_nvml.py): the project's own paths run here with the library's call trace on,
and each function's C symbol must be in that trace. And the Python double may be used only by the
test files named below, each with the reason the library cannot serve it."""

from __future__ import annotations

import copy
import ctypes
import os
import re
import time
from typing import Any

from gpu_device_plugin import dcgm
from gpu_device_plugin._shared import gpu_discovery
from gpu_device_plugin.discovery import NvmlBackend
from gpu_device_plugin.health import NvmlEventWatcher
from harness import FIXTURES, H100, REPO, fixture, write_spec
from mock_nvml import LIBRARY, MockNvml, library_dir

SOURCES = [
    os.path.join(REPO, "plugins", "modules"),
    os.path.join(REPO, "plugins", "module_utils"),
    os.path.join(REPO, "files", "device_plugin", "src", "gpu_device_plugin"),
]
# Names the code calls only where the bindings lack the newer function (older nvidia-ml-py releases).
FALLBACKS = {
    "nvmlDeviceGetPciInfo": "nvmlDeviceGetPciInfo_v3",
    "nvmlSystemGetCudaDriverVersion": "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetAttributes": "nvmlDeviceGetAttributes_v2",
}
# Test files that may use a Python double of pynvml, and why: this tier's (tests/pynvml_double.py,
# tests/doubles/pynvml.py) and the module's unit tier's (tests/unit/plugins/modules/nvml_test_double.py).
DOUBLE_ALLOWED = {
    "tests/unit/plugins/modules/test_nvidia_gpu_info.py": "an older pynvml (bytes, no _v2/_v3 functions), "
    "NVSwitch links and NVML errors mid-discovery: shapes of other bindings and hardware the library does not "
    "play; the module's own path runs through the library in tests/integration/test_nvidia_gpu_info_adhoc.py",
    "tests/unit/plugins/modules/test_nvml_test_double.py": "checks that double against the installed nvidia-ml-py",
    "tests/unit/plugins/modules/nvml_test_double.py": "the unit tier's double itself",
    "test_health.py": "the double's own behaviour next to the spec-driven health tests; every NVML path it "
    "drives also runs through the library in test_nvml_library.py",
    "test_one_source.py": "the collection's and the daemon's readers compared on one spec; the library's "
    "facts are compared with the spec in test_nvml_library.py",
    "mock_nvml.py": "asserts the real pynvml is loaded, not the double",
    "test_dcgm_held.py": "NVML held inside a reading, to show that scrapes and Allocate never wait for it: the "
    "library answers every call at once; the reading path runs through the library in test_dcgm.py",
    "test_faults.py": "XID 154 with a recovery action NVML reports: the library answers no field values (its "
    "call runs through the library here); the faults shown from the library's XIDs are test_faults.py's others",
    "tests/unit/plugins/modules/test_gpu_faults.py": "the kernel log's bus mapped to a GPU through the module's "
    "NVML discovery, whose calls run through the library in test_nvml_library.py",
}
_NAME = re.compile(r"\bnvml[A-Z][A-Za-z0-9_]*")
_POINTER = re.compile(r'_nvmlGetFunctionPointer\("([A-Za-z0-9_]+)"\)')


def referenced_functions(pynvml) -> set[str]:
    """The pynvml functions the project's code names (constants such as nvmlEventTypeXid... are left out)."""
    names: set[str] = set()
    for root in SOURCES:
        for directory, _dirs, files in os.walk(root):
            for name in files:
                if name.endswith(".py") and "_pb2" not in name:
                    with open(os.path.join(directory, name), encoding="utf-8") as handle:
                        names.update(_NAME.findall(handle.read()))
    return {name for name in names if callable(getattr(pynvml, name, None))}


def c_symbols(pynvml, function: str) -> set[str]:
    """The library symbols a pynvml function resolves, itself or through the pynvml functions it calls
    (nvmlInit -> nvmlInitWithFlags, nvmlComputeInstanceGetInfo -> nvmlComputeInstanceGetInfo_v2, ...)."""
    import inspect

    source = inspect.getsource(getattr(pynvml, function))
    found = set(_POINTER.findall(source))
    if not found:
        for called in set(_NAME.findall(source)) - {function}:
            if callable(getattr(pynvml, called, None)):
                found |= c_symbols(pynvml, called)
    return found


def collection_module_utils(name: str):
    """A module of the collection's plugins/module_utils (the nvidia_mig module's _mig_layout, its NVML layer, and
    _mig_plan), imported from the tree without Ansible: its package is made here, pointing at that directory."""
    import importlib
    import sys
    import types

    parts = ["ansible_collections", "gpuops", "k8s", "plugins", "module_utils"]
    for depth in range(1, len(parts) + 1):
        package_name = ".".join(parts[:depth])
        if package_name not in sys.modules:
            package = types.ModuleType(package_name)
            package.__path__ = [os.path.join(REPO, *parts[3:depth])] if depth > 3 else []
            sys.modules[package_name] = package
    return importlib.import_module(f"ansible_collections.gpuops.k8s.plugins.module_utils.{name}")


class WithoutPlacement:
    """The pynvml given, as one without nvmlDeviceCreateGpuInstanceWithPlacement (older than the function)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    def __getattr__(self, name: str) -> Any:
        if name == "nvmlDeviceCreateGpuInstanceWithPlacement":
            raise AttributeError(name)
        return getattr(self._nvml, name)


def run_the_mig_paths(library: MockNvml) -> None:
    """The nvidia_mig module's writes on one H100, as its runs make them: MIG on, two GPU instances with their
    compute instances, everything destroyed, the layout put back at its placements, MIG off."""
    layout = collection_module_utils("_mig_layout")
    plan = collection_module_utils("_mig_plan")
    nvml = library.pynvml
    nvml.nvmlInit()
    try:
        api = layout.Nvml(nvml)
        gpu = layout.read_gpus(api)[0]
        assert layout.set_mode(api, gpu, True)
        layout.refresh(api, gpu)
        planned = plan.gpu_instances({"3g.40gb": 1, "1c.3g.40gb": 3})
        layout.create(api, gpu, planned, plan.check_fit(gpu.product, planned))
        layout.refresh(api, gpu)
        before = copy.copy(gpu)  # as the module keeps it: the read replaces the lists, never edits them
        assert gpu.layout()["devices"] == {"3g.40gb": 1, "1c.3g.40gb": 3}
        layout.destroy_all(api, gpu)
        assert layout.restore(api, gpu, before)
        layout.refresh(api, gpu)
        assert gpu.layout()["devices"] == {"3g.40gb": 1, "1c.3g.40gb": 3}
        assert [gi.placement for gi in gpu.instances] == [gi.placement for gi in before.instances]
        layout.destroy_all(api, gpu)
        # A pynvml too old to create at a placement: the driver places the instances.
        layout.create(layout.Nvml(WithoutPlacement(nvml)), gpu, planned, plan.check_fit(gpu.product, planned))
        layout.refresh(api, gpu)
        assert gpu.layout()["devices"] == {"3g.40gb": 1, "1c.3g.40gb": 3}
        layout.destroy_all(api, gpu)
        assert layout.set_mode(api, gpu, False)
    finally:
        nvml.nvmlShutdown()


def run_the_project_paths(library: MockNvml, tmp_path) -> None:
    """Discovery (the module's and the daemon's), a reading of dcgm-exporter's fields, and the XID watcher, with an
    XID and a lost GPU."""
    nvml = library.pynvml
    gpu_discovery.nvml_discover(nvml, str(tmp_path))
    backend = NvmlBackend(nvml)
    backend.init()
    try:
        sampler = dcgm.Sampler(nvml, backend.snapshot, hostname="guard")
        # Two readings (GPM's metrics are between two samples), then the samples freed.
        sampler.read()
        sampler.read()
        assert b"DCGM_FI_DEV_GPU_TEMP" in sampler.render() and b"DCGM_FI_PROF_GR_ENGINE_ACTIVE" in sampler.render()
        sampler.stop()
    finally:
        backend.stop()
    nvml.nvmlInit()
    seen: list[str] = []
    watcher = NvmlEventWatcher(nvml, list(H100), lambda uuid, xid: seen.append(uuid), seen.append, wait_ms=50)
    watcher.start()
    try:
        time.sleep(0.2)
        spec = fixture("h100x8.yaml")
        spec["gpus"][3]["xid"] = 79
        write_spec(library.spec, spec)
        deadline = time.monotonic() + 3
        while H100[3] not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        spec["gpus"][5]["lost"] = True
        write_spec(library.spec, spec)
        while H100[5] not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        # XID 154: the watcher asks NVML for the GPU's recovery action.
        spec["gpus"][4]["xid"] = 154
        write_spec(library.spec, spec)
        while H100[4] not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watcher.stop()
        watcher.join(3)
        nvml.nvmlShutdown()
    assert H100[3] in seen and H100[4] in seen and H100[5] in seen and watcher.failed is None


def run_the_mig_device_readings(library: MockNvml) -> None:
    """The dcgm metrics of MIG devices on Hopper GPUs: GPM samples of each MIG device's GPU instance."""
    backend = NvmlBackend(library.pynvml)
    backend.init()
    try:
        sampler = dcgm.Sampler(library.pynvml, backend.snapshot, hostname="guard")
        sampler.read()
        sampler.read()
        assert re.search(rb'DCGM_FI_PROF_GR_ENGINE_ACTIVE\{[^}]*GPU_I_ID="', sampler.render())
        sampler.stop()
    finally:
        backend.stop()


def test_every_nvml_function_the_project_calls_runs_through_the_library(tmp_path, monkeypatch):
    trace = tmp_path / "trace"
    monkeypatch.setenv("GPUOPS_MOCK_NVML_TRACE", str(trace))
    spec = tmp_path / "gpus.yaml"
    write_spec(str(spec), fixture("h100x8.yaml"))
    library = MockNvml(str(spec), str(tmp_path / "state"))
    try:
        run_the_project_paths(library, tmp_path)
        mig = MockNvml(os.path.join(FIXTURES, "a100-mig.yaml"), str(tmp_path / "mig-state"))
        try:
            gpu_discovery.nvml_discover(mig.pynvml, str(tmp_path))
        finally:
            mig.close()
        hopper_mig = MockNvml(os.path.join(FIXTURES, "mig-demos.yaml"), str(tmp_path / "hopper-mig-state"))
        try:
            run_the_mig_device_readings(hopper_mig)
        finally:
            hopper_mig.close()
        spec_for_mig = tmp_path / "mig-gpus.yaml"
        write_spec(str(spec_for_mig), fixture("h100x8.yaml"))
        mig_writes = MockNvml(str(spec_for_mig), str(tmp_path / "mig-writes-state"))
        try:
            run_the_mig_paths(mig_writes)
        finally:
            mig_writes.close()
    finally:
        library.close()
    called = set(trace.read_text().split())
    pynvml = library.pynvml
    functions = referenced_functions(pynvml)
    assert "nvmlEventSetWait_v2" in functions and "nvmlDeviceGetMigDeviceHandleByIndex" in functions
    missing = {}
    for function in sorted(functions):
        if function in FALLBACKS and callable(getattr(pynvml, FALLBACKS[function], None)):
            continue
        symbols = c_symbols(pynvml, function)
        assert symbols, f"pynvml.{function} resolves no library symbol"
        if not symbols & called:
            missing[function] = sorted(symbols)
    assert not missing, f"NVML functions the project calls that no test ran through the library: {missing}"


def test_the_fallbacks_are_exported_for_older_bindings():
    lib = ctypes.CDLL(os.path.join(library_dir(), LIBRARY))
    for old in FALLBACKS:
        assert hasattr(lib, old), old


def test_only_the_named_test_files_use_the_python_double():
    here = os.path.dirname(os.path.abspath(__file__))
    users = set()
    for tree, label in ((here, lambda path: os.path.relpath(path, here)), (os.path.join(REPO, "tests"), None)):
        for directory, _dirs, files in os.walk(tree):
            for name in files:
                path = os.path.join(directory, name)
                if not name.endswith(".py") or (label is None and path.startswith(here)):
                    continue
                with open(path, encoding="utf-8") as handle:
                    if re.search(r"pynvml_double|PynvmlDouble|nvml_test_double|doubles[./]pynvml", handle.read()):
                        users.add(label(path) if label else os.path.relpath(path, REPO))
    users -= {"test_nvml_guard.py", "pynvml_double.py", "doubles/pynvml.py"}
    assert users == set(DOUBLE_ALLOWED), f"users of a pynvml double, and the files named here: {sorted(users)}"
