"""gpuops.k8s.nvidia_gpu_info run end to end by the real `ansible` command, as a play would run it.

The collection is mirrored by scripts/collection-tree.sh and found through ANSIBLE_COLLECTIONS_PATH; the
module runs on localhost with the Python that runs ansible (which has pynvml and PyYAML). Without a GPU,
NVML itself is the real peer of the fallback test: the real pynvml fails to load libnvidia-ml and the
module reads this host's real /sys.
"""

from __future__ import annotations

import ctypes.util
import glob
import json
import os
import subprocess
import sys

import pytest
from adhoc import ansible_environment, run_module

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SPECS = sorted(glob.glob(os.path.join(REPO, "tests", "fixtures", "simulated", "*.yaml")))
INVALID = os.path.join(REPO, "tests", "unit", "fixtures", "simulated-invalid", "peer-not-in-file.yaml")


@pytest.fixture(scope="module")
def ansible_env(tmp_path_factory):
    return ansible_environment(str(tmp_path_factory.mktemp("ansible-tmp")))


def run_adhoc(env, module_args, *extra):
    return run_module(env, "gpuops.k8s.nvidia_gpu_info", module_args, *extra)


SPEC_RUNS = [(spec, False) for spec in SPECS] + [(spec, True) for spec in SPECS if spec.endswith("h100x8.yaml")]


def _run_id(value):
    return os.path.basename(value) if isinstance(value, str) else ("check" if value else "run")


@pytest.mark.parametrize(("spec", "check"), SPEC_RUNS, ids=_run_id)
def test_simulated_spec_end_to_end(ansible_env, spec, check):
    rc, result, stats = run_adhoc(ansible_env, f"simulate_from={spec}", *(["--check"] if check else []))
    assert rc == 0, result
    assert result["changed"] is False
    assert stats["changed"] == 0
    assert result["source"] == "simulated"
    assert result["gpu_count"] == len(result["gpus"]) > 0
    assert all(gpu["uuid"].startswith("GPU-") for gpu in result["gpus"])


def test_invalid_spec_end_to_end(ansible_env):
    rc, result, stats = run_adhoc(ansible_env, f"simulate_from={INVALID}")
    assert rc != 0
    assert stats["failures"] == 1
    assert result["msg"].startswith(f"Simulated-GPU spec {INVALID}, GPU 0 (")
    assert "not a GPU in this file" in result["msg"]
    assert "Traceback" not in json.dumps(result)


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_real_nvml_and_real_sysfs_end_to_end(ansible_env, check):
    rc, result, stats = run_adhoc(ansible_env, "sysfs_root=/sys", *(["--check"] if check else []))
    assert rc == 0, result
    assert stats["changed"] == 0
    if ctypes.util.find_library("nvidia-ml") is None:
        # No NVIDIA driver library here: the real pynvml fails to load it and the module falls back.
        assert result["source"] == "sysfs"
        assert result["nvml_available"] is False
        assert "NVML Shared Library Not Found" in result["nvml_unavailable_reason"]
        assert result["gpus"] == []
        assert result["gpu_count"] == len(result["pci_devices"])
    else:
        assert result["source"] == "nvml"
        assert result["nvml_available"] is True
        assert result["gpu_count"] == len(result["gpus"])


@pytest.fixture(scope="module")
def mock_nvml_dir():
    """The lab's mock libnvidia-ml.so.1 (tests/mock_nvml; a TEST DOUBLE of the driver's library)."""
    built = subprocess.run(
        [os.path.join(REPO, "scripts", "build-mock-nvml.sh")], stdout=subprocess.PIPE, text=True, check=True
    )
    return built.stdout.strip()


@pytest.mark.parametrize("spec", SPECS, ids=_run_id)
def test_nvml_through_the_real_bindings_equals_the_spec(ansible_env, mock_nvml_dir, tmp_path, spec):
    """The module's NVML path: the real pynvml loads the mock library by its soname and reads the GPUs the
    spec describes; every fact equals what simulate_from reports, but xid (NVML reports XIDs as events)."""
    state = tmp_path / "nvml.state"
    subprocess.run([sys.executable, os.path.join(REPO, "tests", "mock_nvml", "nvml_state.py"), spec, state], check=True)
    env = dict(ansible_env, LD_LIBRARY_PATH=mock_nvml_dir, GPUOPS_MOCK_NVML_STATE=str(state))
    rc, result, stats = run_adhoc(env, f"sysfs_root={tmp_path}", "--check")
    assert rc == 0, result
    assert stats["changed"] == 0
    assert result["source"] == "nvml" and result["nvml_available"] is True
    _rc, simulated, _stats = run_adhoc(ansible_env, f"simulate_from={spec}")
    assert (result["driver_version"], result["cuda_driver_version"]) == (
        simulated["driver_version"],
        simulated["cuda_driver_version"],
    )
    assert result["gpu_count"] == simulated["gpu_count"]
    for got, want in zip(result["gpus"], simulated["gpus"]):
        assert {k: v for k, v in got.items() if k != "xid"} == {k: v for k, v in want.items() if k != "xid"}


def test_nvml_without_a_driver_falls_back_to_sysfs_with_the_reason(ansible_env, mock_nvml_dir, tmp_path):
    env = dict(ansible_env, LD_LIBRARY_PATH=mock_nvml_dir, GPUOPS_MOCK_NVML_STATE=str(tmp_path / "absent"))
    rc, result, _stats = run_adhoc(env, f"sysfs_root={tmp_path}")
    assert rc == 0, result
    assert result["source"] == "sysfs" and result["nvml_available"] is False
    assert result["nvml_unavailable_reason"] == (
        "NVML could not be initialised (Driver Not Loaded), so the GPUs were read from the PCI bus in sysfs."
    )


def test_nvml_with_another_kernel_module_is_a_driver_library_mismatch(ansible_env, mock_nvml_dir, tmp_path):
    """A spec whose kernel_module_version is not its driver_version: the mock library's nvmlInit answers
    NVML_ERROR_LIB_RM_VERSION_MISMATCH (18) through the real pynvml, and the module says so."""
    spec = tmp_path / "mismatch.yaml"
    with open(SPECS[0]) as source:
        spec.write_text(source.read() + "\nkernel_module_version: 1.0.0\n")
    state = tmp_path / "nvml.state"
    subprocess.run([sys.executable, os.path.join(REPO, "tests", "mock_nvml", "nvml_state.py"), spec, state], check=True)
    env = dict(ansible_env, LD_LIBRARY_PATH=mock_nvml_dir, GPUOPS_MOCK_NVML_STATE=str(state))
    rc, result, _stats = run_adhoc(env, f"sysfs_root={tmp_path}")
    assert rc == 0, result
    assert result["source"] == "sysfs" and result["nvml_available"] is False
    assert result["nvml_unavailable_reason"].startswith(
        "NVML could not be initialised (RM has detected an NVML/RM version mismatch: Driver/library version mismatch,"
    )
    _rc, simulated, _stats = run_adhoc(ansible_env, f"simulate_from={spec}")
    assert simulated["nvml_unavailable_reason"] == result["nvml_unavailable_reason"]


# A MIG manager's work, in a process of its own: GPU 2 of h100x8 in MIG mode, partitioned as mig-parted's
# all-balanced (3g.40gb, 2g.20gb, two 1g.10gb), through the real pynvml on the library.
PARTITION = """
import pynvml as nvml
nvml.nvmlInit()
gpu = nvml.nvmlDeviceGetHandleByIndex(2)
assert nvml.nvmlDeviceSetMigMode(gpu, nvml.NVML_DEVICE_MIG_ENABLE) == nvml.NVML_SUCCESS
for profile_id in (9, 14, 19, 19):
    instance = nvml.nvmlDeviceCreateGpuInstance(gpu, profile_id)
    slices = nvml.nvmlDeviceGetGpuInstanceProfileInfoById(gpu, profile_id).sliceCount
    nvml.nvmlGpuInstanceCreateComputeInstance(instance, {1: 0, 2: 1, 3: 2}[slices])
nvml.nvmlShutdown()
"""


def test_nvml_reports_the_mig_layout_another_process_made(ansible_env, mock_nvml_dir, tmp_path):
    """MIG devices are the driver's state: the module, a process of its own, reads what another process
    created through NVML (the library keeps the layout beside its state, docs/mock-nvml.md)."""
    spec = os.path.join(REPO, "tests", "fixtures", "simulated", "h100x8.yaml")
    state = tmp_path / "nvml.state"
    subprocess.run([sys.executable, os.path.join(REPO, "tests", "mock_nvml", "nvml_state.py"), spec, state], check=True)
    env = dict(ansible_env, LD_LIBRARY_PATH=mock_nvml_dir, GPUOPS_MOCK_NVML_STATE=str(state))
    subprocess.run([sys.executable, "-c", PARTITION], env=env, check=True, timeout=60)
    rc, result, stats = run_adhoc(env, f"sysfs_root={tmp_path}", "--check")
    assert rc == 0, result
    assert stats["changed"] == 0
    assert [gpu["mig_mode"] for gpu in result["gpus"]] == ["disabled"] * 2 + ["enabled"] + ["disabled"] * 5
    assert [(mig["profile"], mig["memory_mib"]) for mig in result["gpus"][2]["mig_devices"]] == [
        ("3g.40gb", 40448),
        ("2g.20gb", 20096),
        ("1g.10gb", 9984),
        ("1g.10gb", 9984),
    ]
    assert all(mig["uuid"].startswith("MIG-") for mig in result["gpus"][2]["mig_devices"])
