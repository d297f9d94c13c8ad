#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later


DOCUMENTATION = r"""
---
module: nvidia_gpu_info
short_description: Discover NVIDIA GPUs through NVML, or on the PCI bus before a driver exists
version_added: 0.1.0
description:
  - Reports the NVIDIA GPUs of the target host. It never changes anything.
  - When the NVIDIA driver is loaded and the C(pynvml) Python module (package C(nvidia-ml-py)) is
    installed, the GPUs are read through NVML, with exactly one NVML initialisation and one shutdown
    per call.
  - When NVML cannot be used (no driver loaded, no C(libnvidia-ml), no C(pynvml)), the module does
    not fail. It returns RV(nvml_available=false), a sentence saying why, and the NVIDIA
    devices it finds on the PCI bus in sysfs, so a play can decide whether to install a driver.
  - The PCI devices (GPUs and NVSwitches) are read from sysfs in every case, so a play can also
    decide whether Fabric Manager is needed.
  - With O(simulate_from), the module reports the fake GPUs of a simulated-GPU spec instead. That is
    for labs and CI only, never for production.
author:
  - gpuops.k8s maintainers (@gpuops)
options:
  sysfs_root:
    description:
      - The directory where sysfs is mounted.
      - The PCI devices are read from C(<sysfs_root>/bus/pci/devices).
      - Point it at a tree of your own to test plays on machines without NVIDIA hardware.
    type: path
    default: /sys
  simulate_from:
    description:
      - Path, on the target, of a simulated-GPU spec (the format of C(docs/simulated-gpus.md), which the
        collection's device plugin also reads). When set, NVML and sysfs are not consulted at all.
      - B(Labs and CI only; never use it in production.) Nothing in the spec is checked against hardware.
      - An invalid spec (unknown key, duplicate UUID or PCI bus ID, an NVLink peer that is not in the
        file, MIG devices unless C(mig_mode) is C(enabled), ...) fails the task with one sentence naming
        the file and the GPU.
      - A spec whose C(kernel_module_version) is not its C(driver_version) describes a driver/library mismatch,
        and the result is then what NVML's failed C(nvmlInit) gives (RV(source) is C(sysfs), no GPUs, the reason
        in RV(nvml_unavailable_reason)).
      - Needs PyYAML on the target.
    type: path
extends_documentation_fragment:
  - gpuops.k8s.read_only
attributes:
  platform:
    platforms: posix
    support: full
    description: Linux hosts. NVML is read through C(pynvml); the fallback reads Linux sysfs.
requirements:
  - The C(pynvml) Python module (package C(nvidia-ml-py)) on the target, for the NVML facts. Without it
    the module falls back to sysfs.
  - PyYAML on the target, only for O(simulate_from).
notes:
  - A GPU whose NVML calls fail after NVML was initialised (for example a GPU that fell off the bus)
    fails the task with one sentence naming the GPU index, the NVML call and NVML's message.
  - PCI bus IDs are returned in the sysfs form C(0000:18:00.0) (lower case, four-digit domain), also when
    NVML reports the eight-digit form.
seealso:
  - name: NVIDIA Management Library (NVML)
    description: The library the facts come from.
    link: https://docs.nvidia.com/deploy/nvml-api/
"""

EXAMPLES = r"""
- name: Discover the GPUs of the node
  gpuops.k8s.nvidia_gpu_info:
  register: gpu_info

- name: Install the driver only where GPUs are present and NVML does not answer yet
  ansible.builtin.debug:
    msg: "{{ gpu_info.pci_devices | length }} GPU(s) found, driver needed: {{ not gpu_info.nvml_available }}"
  when: gpu_info.pci_devices | length > 0

- name: The fabric services the node's NVLink fabric needs
  ansible.builtin.set_fact:
    needs_fabric_manager: "{{ 'fabricmanager' in gpu_info.nvlink_fabric.services }}"

- name: Read a sysfs tree of your own (tests and labs)
  gpuops.k8s.nvidia_gpu_info:
    sysfs_root: /srv/lab/fake-sys
  register: lab_gpus

- name: Labs only, never production - report the fake GPUs of a simulated-GPU spec
  gpuops.k8s.nvidia_gpu_info:
    simulate_from: /etc/gpuops/simulated-gpus.yaml
  register: simulated_gpus
"""

RETURN = r"""
source:
  description: Where the facts come from.
  returned: always
  type: str
  choices: [nvml, sysfs, simulated]
  sample: nvml
nvml_available:
  description:
    - Whether NVML answered. False without a loaded driver or without C(pynvml), and with O(simulate_from).
  returned: always
  type: bool
  sample: true
nvml_unavailable_reason:
  description: One sentence saying why NVML was not used.
  returned: when RV(nvml_available) is false
  type: str
  sample: NVML could not be initialised (Driver Not Loaded), so the GPUs were read from the PCI bus in sysfs.
driver_version:
  description: The NVIDIA driver version; null when NVML did not answer.
  returned: always
  type: str
  sample: 580.95.05
cuda_driver_version:
  description: The highest CUDA version the driver supports, as C(MAJOR.MINOR); null when NVML did not answer.
  returned: always
  type: str
  sample: "13.0"
gpu_count:
  description:
    - The number of GPUs found. With NVML or O(simulate_from), the length of RV(gpus); with the sysfs
      fallback, the number of NVIDIA GPU functions on the PCI bus.
  returned: always
  type: int
  sample: 8
gpus:
  description: The GPUs NVML (or the simulated spec) reports, in NVML index order. Empty with the sysfs fallback.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: The NVML index.
      type: int
      sample: 0
    uuid:
      description: The GPU UUID.
      type: str
      sample: GPU-6f1c0a3e-0000-4000-8000-000000000001
    name:
      description: The product name.
      type: str
      sample: NVIDIA H100 80GB HBM3
    pci_bus_id:
      description: The PCI bus ID, in the sysfs form.
      type: str
      sample: "0000:18:00.0"
    memory_total_mib:
      description: The total framebuffer memory in MiB.
      type: int
      sample: 81559
    compute_capability:
      description: The CUDA compute capability, C(MAJOR.MINOR).
      type: str
      sample: "9.0"
    architecture:
      description:
        - The architecture family the compute capability belongs to (C(volta), C(turing), C(ampere), C(ada-lovelace),
          C(hopper), C(blackwell), ...); C(undefined) for a compute capability the collection does not know.
      type: str
      sample: hopper
    brand:
      description:
        - The brand NVML gives the GPU (C(nvmlDeviceGetBrand)), named as NVIDIA's go-nvlib names it (C(Tesla),
          C(Nvidia), C(Quadro), C(GeForce), ...; C(Unknown) for a brand it does not name); null when NVML does not
          answer. NVIDIA's DRA driver publishes it as the C(brand) attribute.
        - With O(simulate_from), C(Tesla) for a product named Tesla, else C(Nvidia), as the lab's mock NVML library
          answers.
      type: str
      sample: Nvidia
    numa_node:
      description:
        - The NUMA node of the GPU; null when unknown. Taken from sysfs when NVML does not support the query.
      type: int
      sample: 0
    persistence_mode:
      description: Whether persistence mode is on; null when NVML does not support the query.
      type: bool
      sample: true
    mig_mode:
      description: The current MIG mode.
      type: str
      choices: [enabled, disabled, unsupported]
      sample: disabled
    mig_devices:
      description: The MIG devices of the GPU; empty unless RV(gpus[].mig_mode) is C(enabled).
      type: list
      elements: dict
      contains:
        index:
          description: The position of the MIG device among its GPU's MIG devices.
          type: int
          sample: 0
        uuid:
          description: The MIG device UUID.
          type: str
          sample: MIG-8a2b0000-0000-4000-8000-000000000001
        profile:
          description: The MIG profile.
          type: str
          sample: 1g.10gb
        memory_mib:
          description: The memory of the MIG device in MiB.
          type: int
          sample: 9984
        multiprocessors:
          description:
            - The streaming multiprocessors of the MIG device (its compute instance), from NVML's device attributes
              (C(nvmlDeviceGetAttributes_v2)), as GPU Feature Discovery reads them; null when NVML does not answer.
            - With a simulated-GPU spec, what the lab's mock NVML library answers for the profile on that product
              (null for a product or profile it does not model); the same holds for the attributes below.
          type: int
          sample: 16
        gpu_instance_slices:
          description: The compute slices of the MIG device's GPU instance; null when NVML does not answer.
          type: int
          sample: 1
        compute_instance_slices:
          description: The compute slices of the MIG device's compute instance; null when NVML does not answer.
          type: int
          sample: 1
        copy_engines:
          description: The copy engines the MIG device's GPU instance has; null when NVML does not answer.
          type: int
          sample: 1
        decoders:
          description: The video decoders the MIG device's GPU instance has; null when NVML does not answer.
          type: int
          sample: 1
        encoders:
          description: The video encoders the MIG device's GPU instance has; null when NVML does not answer.
          type: int
          sample: 0
        jpeg_engines:
          description: The JPEG engines the MIG device's GPU instance has; null when NVML does not answer.
          type: int
          sample: 1
        ofa_engines:
          description: The optical flow accelerators the MIG device's GPU instance has; null when NVML does not answer.
          type: int
          sample: 0
        gpu_instance_profile_id:
          description:
            - NVIDIA's ID of the MIG device's GPU-instance profile (C(nvmlGpuInstanceGetInfo)), e.g. C(19) for
              C(1g.10gb) on an H100; null when NVML does not answer. NVIDIA's DRA driver names MIG devices by it.
          type: int
          sample: 19
        placement_start:
          description: The first memory slice the MIG device's GPU instance holds; null when NVML does not answer.
          type: int
          sample: 0
        placement_size:
          description: The memory slices the MIG device's GPU instance holds; null when NVML does not answer.
          type: int
          sample: 1
    minor_number:
      description: The minor number of the device node C(/dev/nvidia<minor>); null when NVML does not support the query.
      type: int
      sample: 0
    nvlink_peers:
      description:
        - UUIDs of the GPUs joined to this one by an active NVLink, directly or through NVSwitches, in index order.
      type: list
      elements: str
      sample: [GPU-6f1c0a3e-0000-4000-8000-000000000002]
    pcie_switch:
      description:
        - The PCIe switch tree the GPU shares with other GPUs; null when it shares none. With NVML, the groups
          of GPUs whose closest common ancestor is a PCIe switch, named C(sw0), C(sw1), ... in index order;
          with O(simulate_from), as named in the spec.
      type: str
      sample: sw0
    pcie_root:
      description:
        - The PCIe root complex the GPU hangs off (C(pci0000:17)), where its link in C(/sys/bus/pci/devices) leads, as
          Kubernetes reads its standard C(resource.kubernetes.io/pcieRoot) device attribute; null when sysfs does not
          know the GPU (always with O(simulate_from)).
      type: str
      sample: pci0000:17
    xid:
      description:
        - A standing XID error the simulated spec gives the GPU; always null with NVML, where XIDs arrive
          later as events that the device plugin's health checks watch.
      type: int
      sample: null
    lost:
      description: Whether the simulated spec says the GPU fell off the bus; always false with NVML.
      type: bool
      sample: false
pci_devices:
  description:
    - NVIDIA GPU functions (vendor C(0x10de), class C(0x0300xx) or C(0x0302xx)) on the PCI bus in sysfs.
    - With O(simulate_from), one entry per simulated GPU.
  returned: always
  type: list
  elements: dict
  contains:
    bus_id:
      description: The PCI bus ID.
      type: str
      sample: "0000:18:00.0"
    vendor_id:
      description: The PCI vendor ID.
      type: str
      sample: "0x10de"
    device_id:
      description: The PCI device ID; with O(simulate_from), the spec's C(pci_device_id) (null where it gives none).
      type: str
      sample: "0x2330"
    architecture:
      description:
        - The architecture family the PCI device ID belongs to (C(kepler), C(maxwell), C(pascal), C(volta), C(turing),
          C(ampere), C(ada-lovelace), C(hopper), C(blackwell)), with the names of RV(gpus[].architecture); C(undefined)
          for a device ID the collection does not know. It is known before any driver is installed, so a play can
          choose the kernel modules (NVIDIA's open modules drive Turing and later GPUs only).
        - With O(simulate_from), the architecture the simulated GPU's compute capability belongs to.
        - The device ID blocks of each family, and their sources, are in the collection's C(docs/gpu-generations.md).
      type: str
      sample: hopper
    open_modules_branch:
      description:
        - For a GPU that runs only NVIDIA's open kernel modules, the first driver branch whose open modules drive
          its device ID (C(570) for Blackwell GPUs; C(535) or C(565) for the Grace Hopper GH200's, which are
          C(hopper)); null for every other GPU, and for a device ID the collection does not know.
        - The device IDs and their sources are in the collection's C(docs/gpu-generations.md).
      type: int
      sample: 565
    class:
      description: The PCI class code.
      type: str
      sample: "0x030200"
    numa_node:
      description: The NUMA node; null when unknown (sysfs says -1).
      type: int
      sample: 0
    driver:
      description: The kernel driver bound to the device; null when none is.
      type: str
      sample: nvidia
nvswitch_devices:
  description:
    - NVIDIA NVSwitch functions (vendor C(0x10de), class C(0x0680xx)) on the PCI bus in sysfs, with the keys of
      RV(pci_devices) but C(architecture) and C(open_modules_branch), and C(generation). With O(simulate_from), the
      spec's C(nvswitches).
  returned: always
  type: list
  elements: dict
  sample: []
  contains:
    generation:
      description:
        - The NVSwitch generation of the device ID (C(2) for HGX A100's, C(3) for HGX H100/H200's); null for a
          device ID the collection does not know. The device IDs and their sources are in the collection's
          C(docs/nvlink-fabric.md).
      type: int
      sample: 3
nvlink_fabric:
  description:
    - The NVLink fabric the node is part of, from RV(pci_devices) and RV(nvswitch_devices), and the fabric services
      it needs (C(docs/nvlink-fabric.md)).
  returned: always
  type: dict
  sample: {shape: nvswitch, services: [fabricmanager]}
  contains:
    shape:
      description:
        - C(nvswitch) (NVSwitch PCI functions on the host, HGX A100/H100/H200), C(nvlink5-hgx) (HGX B200/B300
          GPUs), C(nvlink5-rack) (GB200/GB300 NVL GPUs, switch trays outside the host) or C(none).
      type: str
    services:
      description:
        - The fabric services the shape needs on the host, of C(nvlsm) (NVLink Subnet Manager),
          C(fabricmanager) (Fabric Manager) and C(imex) (IMEX), in the order they start.
      type: list
      elements: str
host_pci:
  description:
    - With O(simulate_from), what the PCI bus in sysfs really holds, under the keys C(pci_devices),
      C(nvswitch_devices) and C(nvlink_fabric) (as RV(pci_devices), RV(nvswitch_devices) and RV(nvlink_fabric)
      would be without O(simulate_from)), so
      that a role deciding whether to install a driver reads the real machine from the same run.
  returned: with O(simulate_from)
  type: dict
  sample: {pci_devices: [], nvswitch_devices: [], nvlink_fabric: {shape: none, services: []}}
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuops.k8s.plugins.module_utils import _simulated_spec
from ansible_collections.gpuops.k8s.plugins.module_utils._gpu_generations import gpu_family, open_modules_branch
from ansible_collections.gpuops.k8s.plugins.module_utils._nvlink_fabric import nvlink_fabric, with_generation
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import run_or_fail
from ansible_collections.gpuops.k8s.plugins.module_utils._gpu_discovery import (
    DiscoveryError,
    NvmlUnavailable,
    LIB_RM_VERSION_MISMATCH_HINT,
    LIB_RM_VERSION_MISMATCH_NVML_WORDS,
    installed_pynvml,
    facts_from_spec,
    nvml_discover,
    scan_pci,
    unavailable_reason,
)

# The pynvml module, or None without nvidia-ml-py; unit tests put an NVML test double here.
pynvml = installed_pynvml()

NO_PYNVML_REASON = (
    "The pynvml Python module (package nvidia-ml-py) is not installed on the target, "
    "so the GPUs were read from the PCI bus in sysfs."
)
SIMULATED_REASON = "simulate_from is set, so NVML was not queried and the GPUs come from the simulated-GPU spec."


def _with_architecture(pci_devices):
    """The PCI GPU functions, each with the architecture family its device ID belongs to, and the first driver
    branch whose open kernel modules drive it where it runs only those."""
    return [
        dict(
            device,
            architecture=gpu_family(device["device_id"]),
            open_modules_branch=open_modules_branch(device["device_id"]),
        )
        for device in pci_devices
    ]


def _simulated(path, sysfs_root):
    parsed = _simulated_spec.load_spec(path)
    spec = facts_from_spec(parsed)
    host_pci, host_nvswitch = scan_pci(sysfs_root)
    device_ids = {gpu["pci_bus_id"]: gpu["pci_device_id"] for gpu in parsed["gpus"]}
    pci_devices = [
        {
            "bus_id": gpu["pci_bus_id"],
            "vendor_id": "0x10de",
            "device_id": device_ids[gpu["pci_bus_id"]],
            "class": "0x030200",
            "numa_node": gpu["numa_node"],
            "driver": "nvidia",
            "architecture": gpu["architecture"],
            "open_modules_branch": open_modules_branch(device_ids[gpu["pci_bus_id"]]),
        }
        for gpu in spec["gpus"]
    ]
    # As the sysfs scan finds an NVSwitch: class 0x068000, bound to the nvidia module's NVSwitch driver.
    nvswitch_devices = with_generation(
        [
            {
                "bus_id": switch["pci_bus_id"],
                "vendor_id": "0x10de",
                "device_id": switch["device_id"],
                "class": "0x068000",
                "numa_node": switch["numa_node"],
                "driver": "nvidia-nvswitch",
            }
            for switch in parsed.get("nvswitches", [])
        ]
    )
    host_pci = _with_architecture(host_pci)
    host_pci = dict(
        pci_devices=host_pci,
        nvswitch_devices=with_generation(host_nvswitch),
        nvlink_fabric=nvlink_fabric(host_pci, host_nvswitch),
    )
    if "kernel_module_version" in parsed:
        # The loaded module is not the library's version: NVML answers nothing, as on a node in that state.
        return dict(
            source="sysfs",
            nvml_available=False,
            nvml_unavailable_reason=unavailable_reason(
                LIB_RM_VERSION_MISMATCH_NVML_WORDS + LIB_RM_VERSION_MISMATCH_HINT
            ),
            driver_version=None,
            cuda_driver_version=None,
            gpus=[],
            gpu_count=len(pci_devices),
            pci_devices=pci_devices,
            nvswitch_devices=nvswitch_devices,
            nvlink_fabric=nvlink_fabric(pci_devices, nvswitch_devices),
            host_pci=host_pci,
        )
    return dict(
        source="simulated",
        nvml_available=False,
        nvml_unavailable_reason=SIMULATED_REASON,
        driver_version=spec["driver_version"],
        cuda_driver_version=spec["cuda_driver_version"],
        gpus=spec["gpus"],
        gpu_count=len(spec["gpus"]),
        pci_devices=pci_devices,
        nvswitch_devices=nvswitch_devices,
        nvlink_fabric=nvlink_fabric(pci_devices, nvswitch_devices),
        host_pci=host_pci,
    )


def discover(nvml, sysfs_root):
    """The facts from ``nvml`` (the pynvml module, a test double, or None) and the sysfs at ``sysfs_root``.

    Raises DiscoveryError with one sentence when discovery fails.
    """
    pci_devices, nvswitch_devices = scan_pci(sysfs_root)
    result = dict(
        pci_devices=_with_architecture(pci_devices),
        nvswitch_devices=with_generation(nvswitch_devices),
        nvlink_fabric=nvlink_fabric(pci_devices, nvswitch_devices),
    )
    if nvml is None:
        reason = NO_PYNVML_REASON
    else:
        try:
            facts = nvml_discover(nvml, sysfs_root)
        except NvmlUnavailable as exc:
            reason = str(exc)
        else:
            result.update(facts)
            result.update(source="nvml", nvml_available=True, gpu_count=len(facts["gpus"]))
            return result
    result.update(
        source="sysfs",
        nvml_available=False,
        nvml_unavailable_reason=reason,
        driver_version=None,
        cuda_driver_version=None,
        gpus=[],
        gpu_count=len(pci_devices),
    )
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            simulate_from=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    run_or_fail(module, "nvidia_gpu_info", run_module)


def run_module(module):
    simulate_from = module.params["simulate_from"]
    try:
        if simulate_from:
            if not _simulated_spec.HAS_YAML:
                module.fail_json(
                    msg=missing_required_lib("PyYAML"),
                    exception=str(_simulated_spec.YAML_IMPORT_ERROR),
                )
            result = _simulated(simulate_from, module.params["sysfs_root"])
        else:
            result = discover(pynvml, module.params["sysfs_root"])
    except (DiscoveryError, _simulated_spec.SpecError) as exc:
        module.fail_json(msg=str(exc))
    else:
        module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
