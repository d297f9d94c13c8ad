"""The NVLink fabric a node is part of, and the fabric services it needs, from its PCI devices.

- Third and earlier NVSwitch generations (HGX A100, HGX H100/H200) are NVIDIA PCI functions of the host, bound to
  the nvidia module's NVSwitch driver: the host runs Fabric Manager, of the driver's own version.
- HGX B200/B300 (NVLink 5): the host runs Fabric Manager and the NVLink Subnet Manager (NVLSM). The nvidia
  module's NVSwitch driver knows no device ID of these switches, so the GPUs' device IDs tell the board.
- GB200/GB300 NVL racks: the NVLink switches sit in switch trays outside the host, which run the fabric; the
  host runs IMEX and no Fabric Manager.

The device IDs and the sources they were read from are in docs/nvlink-fabric.md. Runs on the target
(gpuops.k8s.nvidia_gpu_info): Python 3.9+, standard library only.
"""

from ansible_collections.gpuops.k8s.plugins.module_utils._gpu_generations import in_blocks, parse_device_id

# The nvidia module's NVSwitch driver (open-gpu-kernel-modules, src/common/nvswitch/kernel/nvswitch.c): LR10 is
# the second generation (HGX A100), LS10 the third (HGX H100/H200).
NVSWITCH_GENERATIONS = (
    (0x1AE8, 0x1AE8, 2),
    (0x1AF0, 0x1AFF, 2),
    (0x22A0, 0x22AF, 3),
)

# GPUs of an HGX board with NVLink 5 switches (B200, B300) and of an NVL rack (GB200, GB300), by device ID.
HGX_NVLINK5_GPU_IDS = frozenset((0x2901, 0x2909, 0x3182))
NVL_RACK_GPU_IDS = frozenset((0x2941, 0x31C2, 0x31C3))

# The fabric services in the order they start: NVLSM before Fabric Manager needs it, IMEX last.
SERVICES = ("nvlsm", "fabricmanager", "imex")
SHAPE_SERVICES = {
    "none": (),
    "nvswitch": ("fabricmanager",),
    "nvlink5-hgx": ("nvlsm", "fabricmanager"),
    "nvlink5-rack": ("imex",),
}


def nvswitch_generation(device_id):
    """The NVSwitch generation of an NVSwitch PCI function's device ID; None when unknown or malformed."""
    return in_blocks(device_id, NVSWITCH_GENERATIONS, None)


def fabric_shape(pci_devices, nvswitch_devices):
    """The node's NVLink fabric: nvlink5-rack, nvlink5-hgx, nvswitch or none (see the module's docstring)."""
    ids = {parse_device_id(device.get("device_id")) for device in pci_devices or []}
    if ids & NVL_RACK_GPU_IDS:
        return "nvlink5-rack"
    if ids & HGX_NVLINK5_GPU_IDS:
        return "nvlink5-hgx"
    if nvswitch_devices:
        return "nvswitch"
    return "none"


def nvlink_fabric(pci_devices, nvswitch_devices):
    """The node's fabric shape and the services it needs, as gpuops.k8s.nvidia_gpu_info returns them."""
    shape = fabric_shape(pci_devices, nvswitch_devices)
    return {"shape": shape, "services": list(SHAPE_SERVICES[shape])}


def with_generation(nvswitch_devices):
    """The NVSwitch PCI functions, each with the generation its device ID belongs to."""
    return [dict(device, generation=nvswitch_generation(device.get("device_id"))) for device in nvswitch_devices]
