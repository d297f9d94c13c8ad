"""Keeps NvmlTestDouble honest: every doubled function has the parameters of the installed pynvml."""

from __future__ import annotations

import inspect

import pynvml as real_pynvml
import pytest
from ansible_collections.gpuops.k8s.tests.unit.plugins.modules.nvml_test_double import (
    DOUBLED_FUNCTIONS,
    DoubleGpu,
    NvmlTestDouble,
)


def test_the_double_covers_the_functions_the_module_calls():
    assert "nvmlInit" in DOUBLED_FUNCTIONS
    assert "nvmlDeviceGetNvLinkRemotePciInfo" in DOUBLED_FUNCTIONS
    assert len(DOUBLED_FUNCTIONS) >= 20


@pytest.mark.parametrize("name", DOUBLED_FUNCTIONS)
def test_doubled_function_matches_the_real_signature(name):
    real = inspect.signature(getattr(real_pynvml, name))
    double = inspect.signature(getattr(NvmlTestDouble([]), name))
    assert list(double.parameters) == list(real.parameters)
    for parameter in real.parameters.values():
        assert double.parameters[parameter.name].default == parameter.default


def test_errors_are_the_real_pynvml_classes():
    nvml = NvmlTestDouble([DoubleGpu(uuid="GPU-1", numa_node=None)])
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(real_pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNumaNodeId(handle)
    assert nvml.NVMLError is real_pynvml.NVMLError


def test_calls_before_init_fail_as_in_nvml():
    nvml = NvmlTestDouble([DoubleGpu(uuid="GPU-1")])
    with pytest.raises(real_pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_structs_are_the_real_ctypes_structs():
    nvml = NvmlTestDouble([DoubleGpu(uuid="GPU-1", bus_id="00000000:18:00.0", memory_mib=2)])
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    pci = nvml.nvmlDeviceGetPciInfo_v3(handle)
    assert isinstance(pci, real_pynvml.nvmlPciInfo_t)
    assert pci.busId == "00000000:18:00.0"
    assert nvml.nvmlDeviceGetMemoryInfo(handle).total == 2 * 1024 * 1024
