"""MIG products for the unit tests of the nvidia_mig module's helpers: per product, its PCI device ID, memory and
GPU-instance profiles as NVML lists them (the mig-enabled GPU answers of nvmlDeviceGetGpuInstanceProfileInfo and
nvmlDeviceGetGpuInstancePossiblePlacements), made into the Product the planner takes.

The profile facts are the ones the lab's mock NVML library serves (MIG_PRODUCTS in module_utils/_simulated_spec.py,
from NVIDIA's MIG user guide and `nvidia-smi mig -lgip` / `-lgipp` listings), so the unit tests plan against the
same products the integration tests partition."""

from __future__ import annotations

from ansible_collections.gpuops.k8s.plugins.module_utils._mig_plan import GpuInstanceProfile, make_product
from ansible_collections.gpuops.k8s.plugins.module_utils._simulated_spec import MIG_PRODUCTS

A100_40GB = "NVIDIA A100-SXM4-40GB"
A100_80GB = "NVIDIA A100-SXM4-80GB"
H100_80GB = "NVIDIA H100 80GB HBM3"
H100_NVL = "NVIDIA H100 NVL"
H200 = "NVIDIA H200"

# name: (PCI device ID as NVML packs it, device << 16 | vendor; memory MiB as NVML reports it)
PRODUCTS = {
    A100_40GB: (0x20B010DE, 40960),
    A100_80GB: (0x20B210DE, 81920),
    H100_80GB: (0x233010DE, 81559),
    H100_NVL: (0x232110DE, 95830),
    H200: (0x233510DE, 143771),
}


def profiles(name):
    """The GpuInstanceProfile rows of a product."""
    return [
        GpuInstanceProfile(row[0], row[1], row[2], row[3], row[4], row[5], tuple((start, row[12]) for start in row[13]))
        for row in MIG_PRODUCTS[name]
    ]


def product(name):
    return make_product(profiles(name), PRODUCTS[name][1])


def gpu(index, name, uuid=None):
    """A GPU as _mig_config.select takes it."""
    device_id = PRODUCTS[name][0] if name in PRODUCTS else name
    return {
        "index": index,
        "uuid": uuid or f"GPU-00000000-0000-4000-8000-{index:012d}",
        "device_id": device_id,
        "subsystem_id": device_id,
    }
