#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later


DOCUMENTATION = r"""
---
module: nvidia_mig
short_description: Partition NVIDIA GPUs with MIG as a mig-parted config declares
version_added: 0.1.0
description:
  - Makes the MIG layout of the node's GPUs what a named config of NVIDIA's mig-parted format (version C(v1))
    declares; the config is given inline (O(config)) or as a file on the node (O(config_file)).
  - Each entry of the config names GPUs by C(devices) (C(all) or a list of NVML indexes) and optionally by
    C(device-filter) (PCI IDs such as C(0x233010DE)), and says whether MIG mode is on (C(mig-enabled)) and which
    MIG devices to have (C(mig-devices), profile names such as C(1g.10gb), C(1g.10gb+me) or C(1c.3g.40gb) mapped
    to counts). A GPU that no entry names is left alone; a GPU that two entries name is refused. C(devices) lists
    NVML indexes (RV(gpus) shows each GPU's index with its UUID); mig-parted counts GPUs in PCI bus order from
    sysfs, which NVML's order normally is.
  - A GPU without MIG that an entry names by C(devices) C(all) is skipped, as mig-parted skips it, so that
    C(all-balanced) partitions the H100s of a node that also has a T4 or an L4; RV(skipped_gpus) and the diff
    list it. Named by index in an entry with C(mig-enabled) true, such a GPU is refused with one sentence
    (mig-parted refuses it too). A GPU that reports a MIG mode but refuses to set it shows it has no MIG only
    in a real run; check mode then predicts a change for it.
  - The layout a GPU has is its MIG mode and the count of each profile among its MIG devices, as NVML reports
    them. A GPU whose mode and counts already match is not touched; where they placed is not compared.
  - A GPU whose counts differ loses all its compute and GPU instances, which are then created anew, largest
    first, each GPU instance at the placement the check below found for it
    (C(nvmlDeviceCreateGpuInstanceWithPlacement)), so that the driver's own placement policy cannot make a layout
    that fits fail half-way. Its MIG mode is set through NVML when it differs (instances are destroyed first
    when MIG mode goes off).
  - A mode change takes effect when the driver can reset the GPU, which it cannot while another process has
    the GPU open (a device plugin, a monitoring agent). Such a GPU is listed in RV(reset_required) and gets
    its instances in a later run, after the caller reset it (C(nvidia-smi --gpu-reset)) or rebooted the node.
  - Before anything is destroyed, the wanted layout of each GPU is checked against the GPU-instance profiles
    NVML lists for the product (names, instance counts, memory, compute slices and placements). A layout that
    cannot exist is refused with one sentence that names the GPU and the profile, and nothing is written.
    NVML lists profiles only while MIG mode is on; for a product none of whose GPUs has MIG on, the module
    turns MIG on for the first of them that the config wants in MIG mode, then checks, and turns it off again
    when it refuses.
  - When a change fails part-way, every GPU the run touched is put back to the layout it had (O(rollback)) and
    the task fails with one sentence naming the GPU, the profile and NVML's error.
author:
  - gpuops.k8s maintainers (@gpuops)
options:
  config:
    description:
      - The mig-parted config document (C(version) C(v1) and C(mig-configs)), inline.
      - Exactly one of O(config) and O(config_file) is required.
    type: dict
  config_file:
    description:
      - Path, on the node, of a YAML file holding a mig-parted config document.
      - Exactly one of O(config) and O(config_file) is required. Needs PyYAML on the node.
    type: path
  config_name:
    description:
      - The name, under C(mig-configs), of the config to apply.
    type: str
    required: true
  rollback:
    description:
      - When applying fails part-way, put every GPU this run touched back to the layout it had before failing
        the task; RV(rolled_back) lists them.
      - With V(false), the GPUs are left as the failure left them.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: Reads the GPUs and reports what would change, writing nothing.
  diff_mode:
    support: full
    description:
      - Returns, per GPU that changes, its layout (MIG mode and profile counts) before and after, and a line per
        GPU that C(devices) C(all) names with MIG on wanted but that has no MIG (skipped).
  platform:
    platforms: posix
    support: full
    description: Linux hosts with the NVIDIA driver loaded.
requirements:
  - The C(pynvml) Python module (package C(nvidia-ml-py)) on the node.
  - PyYAML on the node, only for O(config_file).
notes:
  - Idempotent; a second run with the same config reports no change, unless a GPU still waits for a reset.
  - MIG devices of the changed GPUs get new UUIDs. Drain the workloads that use those GPUs first (the role
    C(gpuops.k8s.nvidia_mig) does).
  - A compute-instance form (C(1c.3g.40gb)) shares a GPU instance of its profile with the other compute
    instances of that profile while they fit, largest first, so that as few GPU instances as possible are made.
    mig-parted reuses only the GPU instance it made last and retries other orderings until one fits.
  - Where the driver offers variants of a compute-instance profile with the same slices (C(1_SLICE) and
    C(1_SLICE_REV1), C(7_SLICE) and C(7_SLICE_NVL)), the first NVML lists, the plain one, is created, as
    mig-parted takes the first profile whose name matches.
  - Every config of the document must be well formed, as mig-parted validates the whole file; whether the
    profiles exist is checked only for the chosen config.
  - Unlike mig-parted, a GPU index in C(devices) that the node does not have is refused rather than ignored.
seealso:
  - name: NVIDIA mig-parted
    description: The config format.
    link: https://github.com/NVIDIA/mig-parted
  - name: NVIDIA MIG user guide
    description: MIG profiles, placements and mode changes.
    link: https://docs.nvidia.com/datacenter/tesla/mig-user-guide/
"""

EXAMPLES = r"""
- name: Seven 1g.10gb MIG devices on every H100 80GB of the node
  gpuops.k8s.nvidia_mig:
    config_name: all-1g.10gb
    config:
      version: v1
      mig-configs:
        all-1g.10gb:
          - devices: all
            device-filter: "0x233010DE"
            mig-enabled: true
            mig-devices:
              1g.10gb: 7
  register: mig

- name: Reset the GPUs whose MIG mode change waits for it
  ansible.builtin.command:
    argv: [nvidia-smi, --gpu-reset, -i, "{{ item }}"]
  loop: "{{ mig.reset_required }}"
  changed_when: true

- name: Apply a named config of a mig-parted file on the node
  gpuops.k8s.nvidia_mig:
    config_file: /etc/nvidia-mig-manager/config.yaml
    config_name: all-balanced

- name: Put the GPUs back as they were before the first task
  gpuops.k8s.nvidia_mig:
    config: "{{ mig.previous_config }}"
    config_name: previous
"""

RETURN = r"""
gpus:
  description: The GPUs the chosen config names, in NVML index order.
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
    device_id:
      description: The PCI device and vendor ID as a C(device-filter) names it.
      type: str
      sample: "0x233010DE"
    before:
      description:
        - The layout before the run. C(mig_enabled) is the MIG mode in effect, C(mig_pending) whether a mode
          change waits for a GPU reset, C(devices) the count of each profile among the GPU's MIG devices.
      type: dict
      sample: {mig_enabled: false, mig_pending: false, devices: {}}
    after:
      description:
        - The layout after the run, read back from NVML; in check mode, the layout the run would make.
      type: dict
      sample: {mig_enabled: true, mig_pending: false, devices: {1g.10gb: 7}}
    changed:
      description: Whether the GPU's layout changed (would change, in check mode).
      type: bool
      sample: true
    reset_required:
      description: Whether a MIG mode change waits for a GPU reset; the GPU's MIG devices are made in a later run.
      type: bool
      sample: false
changed_gpus:
  description: UUIDs of the GPUs whose layout changed (would change, in check mode).
  returned: always
  type: list
  elements: str
  sample: [GPU-6f1c0a3e-0000-4000-8000-000000000001]
reset_required:
  description:
    - UUIDs of the GPUs whose MIG mode change waits for a GPU reset. Reset them (or reboot) and run again.
  returned: always
  type: list
  elements: str
  sample: []
previous_config:
  description:
    - A mig-parted config document with one config, C(previous), that names each GPU of RV(changed_gpus) by index
      with the MIG mode and devices it had before the run. Applying it puts those GPUs back.
  returned: always
  type: dict
  sample:
    version: v1
    mig-configs:
      previous:
        - devices: [0]
          mig-enabled: false
skipped_gpus:
  description:
    - The GPUs without MIG that an entry names by C(devices) C(all), left as they are (as mig-parted skips them),
      in NVML index order; C(entry) is the entry's position in the config, C(reason) says why.
  returned: always
  type: list
  elements: dict
  sample:
    - index: 1
      uuid: GPU-7e570000-0000-4000-8000-0000000000f4
      name: Tesla T4
      device_id: "0x1EB810DE"
      entry: 0
      reason: the product has no MIG (NVML reports no MIG mode for it)
rolled_back:
  description:
    - UUIDs of the GPUs put back to the layout they had, after a change failed part-way. Empty when nothing
      failed or O(rollback) is false.
  returned: always
  type: list
  elements: str
  sample: []
"""

import contextlib
import copy

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuops.k8s.plugins.module_utils import _mig_config
from ansible_collections.gpuops.k8s.plugins.module_utils._gpu_discovery import installed_pynvml, nvml_message
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import run_or_fail
from ansible_collections.gpuops.k8s.plugins.module_utils._mig_config import MigConfigError
from ansible_collections.gpuops.k8s.plugins.module_utils._mig_layout import (
    ApplyFailed,
    Nvml,
    NvmlCallFailed,
    create,
    destroy_all,
    read_gpus,
    read_product,
    refresh,
    restore,
    set_mode,
)
from ansible_collections.gpuops.k8s.plugins.module_utils._mig_plan import (
    LayoutRefused,
    check_fit,
    gpu_instances,
    layout_text,
)

# The pynvml module, or None without nvidia-ml-py; tests put an NVML double here.
pynvml = installed_pynvml()


# Why a GPU without MIG named by index is refused where devices: all skips it.
BY_INDEX = ", and an entry that names it by index cannot skip it as devices: all does"


class Refused(Exception):
    """The config cannot be applied; one sentence."""


class Target:
    """A GPU the config names: what it is, what it should become, and what happened to it."""

    def __init__(self, gpu, entry):
        self.gpu = gpu
        self.before = copy.copy(gpu)
        self.wanted = {"mig_enabled": entry["mig_enabled"], "mig_pending": False, "devices": entry["mig_devices"]}
        self.entry = entry
        self.planned = gpu_instances(entry["mig_devices"]) if entry["mig_enabled"] else []
        self.reset_required = False

    @property
    def differs(self):
        """Whether the GPU's MIG mode (in effect or pending) or its MIG devices are not what the config wants."""
        gpu, enabled = self.gpu, self.wanted["mig_enabled"]
        if not gpu.supported:
            return False
        return gpu.current != enabled or gpu.pending != enabled or self.devices_differ

    @property
    def devices_differ(self):
        """Whether MIG is on and its instances are not the wanted ones (a GPU instance without a compute instance
        counts as a difference: it takes slices and is no MIG device)."""
        gpu = self.gpu
        return gpu.current and (gpu.layout()["devices"] != self.wanted["devices"] or gpu.has_bare_instances())

    @property
    def product_key(self):
        return (self.gpu.name, self.gpu.device_id, self.gpu.memory_mib)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            config=dict(type="dict"),
            config_file=dict(type="path"),
            config_name=dict(type="str", required=True),
            rollback=dict(type="bool", default=True),
        ),
        mutually_exclusive=[("config", "config_file")],
        required_one_of=[("config", "config_file")],
        supports_check_mode=True,
    )
    run_or_fail(module, "nvidia_mig", run_module)


def run_module(module):
    params = module.params
    if pynvml is None:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py (the pynvml module)"))
    if params["config_file"]:
        if not _mig_config.HAS_YAML:
            module.fail_json(msg=missing_required_lib("PyYAML"), exception=str(_mig_config.YAML_IMPORT_ERROR))
        source = f"MIG config file {params['config_file']}"
        try:
            document = _mig_config.load_file(params["config_file"])
        except MigConfigError as exc:
            module.fail_json(msg=str(exc))
    else:
        source, document = "The config option", params["config"]
    try:
        entries = _mig_config.parse_config(document, params["config_name"], source)
    except MigConfigError as exc:
        module.fail_json(msg=str(exc))

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        module.fail_json(
            msg=f"NVML could not be initialised ({nvml_message(exc)}), so no MIG layout can be read or made."
        )
    try:
        MigRun(module, Nvml(pynvml), entries, params["config_name"]).run()
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


class MigRun:
    def __init__(self, module, api, entries, config_name):
        self.module, self.api, self.entries, self.config_name = module, api, entries, config_name
        self.targets = []
        self.touched = []  # Targets this run wrote to, in order
        self.products = {}  # product key -> Product, from a GPU of that product with MIG mode on
        self.skipped = []  # Targets named by devices: all that have no MIG, left alone as mig-parted leaves them

    def run(self):
        try:
            gpus = read_gpus(self.api)
        except NvmlCallFailed as exc:
            self.module.fail_json(
                msg=f"Reading {exc.where or 'the GPUs'} through NVML failed ({exc.call}: {exc.message})."
            )
        label = f"MIG config {self.config_name}"
        facts = [
            {"index": g.index, "uuid": g.uuid, "device_id": g.device_id, "subsystem_id": g.subsystem_id} for g in gpus
        ]
        try:
            chosen = _mig_config.select(self.entries, facts, label)
        except MigConfigError as exc:
            self.module.fail_json(msg=str(exc))
        if gpus and not chosen:
            # A product the config's entries do not name (an H100 NVL, a B200 under a file that knows A100, H100
            # and H200) keeps its layout: said, as the node's GPUs may be what the config was meant for.
            products = ", ".join(sorted({f"{g.name} (0x{g.device_id:08X})" for g in gpus}))
            self.module.warn(
                f"{label} has no entry for any GPU of this host ({products}): no GPU's layout changes. Its entries "
                "name other products by device-filter; a config file of your own can name these."
            )
        self.targets = []
        for fact, entry in chosen:
            gpu = gpus[fact["index"]]
            if entry["devices"] == "all" and not gpu.supported:
                self.skip(Target(gpu, entry))
            else:
                self.targets.append(Target(gpu, entry))
        for gpu in gpus:
            if gpu.product is not None:
                self.products.setdefault((gpu.name, gpu.device_id, gpu.memory_mib), gpu.product)
        try:
            unknown = self.validate()
        except Refused as exc:
            self.module.fail_json(msg=str(exc), **self.result())
        if self.module.check_mode:
            for key in unknown:
                self.module.warn(
                    f"No {key[0]} of this host has MIG mode on, so NVML lists none of its MIG profiles and "
                    f"the layout of {label} was not checked against them; a real run checks it after turning MIG on."
                )
            self.module.exit_json(**self.result(predicted=True))
        try:
            self.apply(unknown)
        except (ApplyFailed, Refused, NvmlCallFailed) as exc:
            self.fail_after_writing(exc)
        self.module.exit_json(**self.result())

    # -- checks ---------------------------------------------------------------------------------

    def skip(self, target, why="NVML reports no MIG mode for it"):
        """Leave alone a GPU without MIG that an entry names by devices: all (mig-parted skips it too)."""
        target.skip_reason = why
        self.skipped.append(target)

    def refuse_sentence(self, target, refusal):
        gpu = target.gpu
        return (
            f"MIG config {self.config_name} (entry {target.entry['number']}) cannot be applied to GPU {gpu.index} "
            f"({gpu.uuid}, {gpu.name}): {refusal}."
        )

    def validate(self, only_key=None):
        """Check every GPU that changes against its product's profiles; raise Refused with one sentence for the
        first that cannot take its layout. Returns the product keys no GPU told NVML's profiles for."""
        unknown = []
        for target in self.targets:
            if only_key is not None and target.product_key != only_key:
                continue
            if target.wanted["mig_enabled"] and not target.gpu.supported:
                raise Refused(self.refuse_sentence(target, f"the product does not support MIG{BY_INDEX}"))
            if not (target.differs and target.wanted["mig_enabled"]):
                continue
            product = self.products.get(target.product_key)
            if product is None:
                if target.product_key not in unknown:
                    unknown.append(target.product_key)
                continue
            try:
                check_fit(product, target.planned)
            except LayoutRefused as exc:
                raise Refused(self.refuse_sentence(target, str(exc))) from None
        return unknown

    # -- changes --------------------------------------------------------------------------------

    def touch(self, target):
        if target not in self.touched:
            self.touched.append(target)

    def apply(self, unknown):
        for key in unknown:
            self.learn_product(key)
        for target in self.targets:
            if target.differs and not target.reset_required:
                self.apply_one(target)
        for target in self.touched:
            refresh(self.api, target.gpu)

    def learn_product(self, key):
        """Turn MIG on for the first GPU of the product that the config wants in MIG mode, read the profiles NVML
        then lists, and check every GPU of the product; MIG goes off again on that GPU when the check refuses."""
        target = next(t for t in self.targets if t.product_key == key and t.differs and t.wanted["mig_enabled"])
        self.touch(target)
        try:
            took_effect = set_mode(self.api, target.gpu, True)
        except ApplyFailed as exc:
            if not self.api.absent(exc.failure, "NOT_SUPPORTED"):
                raise
            # NVML reports a MIG mode for some GPUs without MIG; the refusal to set it changed nothing. Under
            # devices: all every GPU of the product is skipped; one named by index is refused.
            self.touched.remove(target)
            why = f"{exc.failure.call} answers Not Supported"
            by_index = [t for t in self.targets if t.product_key == key and t.entry["devices"] != "all"]
            wanting = [t for t in by_index if t.wanted["mig_enabled"]]
            if wanting:
                raise Refused(
                    self.refuse_sentence(wanting[0], f"the product does not support MIG ({why}){BY_INDEX}")
                ) from None
            for other in [t for t in self.targets if t.product_key == key and t not in by_index]:
                self.targets.remove(other)
                self.skip(other, f"setting its MIG mode failed without a change ({why})")
            return
        if not took_effect:
            target.reset_required = True
            return
        product = read_product(self.api, target.gpu)
        if product is None:
            raise Refused(self.refuse_sentence(target, "NVML lists no MIG profile for it even with MIG mode on"))
        self.products[key] = product
        self.validate(only_key=key)

    def apply_one(self, target):
        """Destroy the GPU's instances when they are not the wanted ones (or MIG goes off), set the MIG mode when it
        differs, and create the wanted instances, largest first, at the placements the plan found for them, when
        the mode took effect."""
        gpu, enabled = target.gpu, target.wanted["mig_enabled"]
        self.touch(target)
        if gpu.current and gpu.instances and (not enabled or target.devices_differ):
            destroy_all(self.api, gpu)
        if (gpu.current, gpu.pending) != (enabled, enabled) and not set_mode(self.api, gpu, enabled):
            target.reset_required = True
            return
        if enabled and target.devices_differ:
            destroy_all(self.api, gpu)
            try:
                placements = check_fit(gpu.product, target.planned)
            except LayoutRefused as exc:
                raise Refused(self.refuse_sentence(target, str(exc))) from None
            create(self.api, gpu, target.planned, placements)
            refresh(self.api, gpu)
            if target.differs:
                raise Refused(
                    f"after the change {gpu.label} has the MIG devices {gpu.layout()['devices']} instead of "
                    f"{target.wanted['devices']}"
                )

    def fail_after_writing(self, exc):
        """Put the touched GPUs back (unless rollback is false) and fail with one sentence."""
        if isinstance(exc, ApplyFailed):
            what = f"MIG config {self.config_name} could not be applied: {exc.sentence_part()}"
        elif isinstance(exc, NvmlCallFailed):
            what = f"MIG config {self.config_name} could not be applied: {exc.call} failed ({exc.message})"
        else:
            what = str(exc).rstrip(".")
            if not what.startswith("MIG config"):
                what = f"MIG config {self.config_name} could not be applied: {what}"
        rolled_back, problems = [], []
        if self.module.params["rollback"]:
            for target in reversed(self.touched):
                try:
                    if restore(self.api, target.gpu, target.before):
                        rolled_back.insert(0, target.gpu.uuid)
                    else:
                        problems.append(f"{target.gpu.label} waits for a GPU reset to get its MIG mode back")
                except ApplyFailed as failure:
                    problems.append(failure.sentence_part())
                except NvmlCallFailed as failure:
                    problems.append(f"{failure.call} failed ({failure.message})")
            for target in self.touched:
                with contextlib.suppress(NvmlCallFailed):
                    refresh(self.api, target.gpu)
            if problems:
                ending = ", and putting the GPUs back failed too: " + "; ".join(problems)
            else:
                ending = f", and the {len(rolled_back)} GPU(s) it had touched have the layout they had again"
        else:
            ending = ", and the GPUs it had touched were left as they are (rollback is false)"
        if not self.touched:
            ending = ""
        self.module.fail_json(msg=what + ending + ".", **dict(self.result(), rolled_back=rolled_back))

    # -- result ---------------------------------------------------------------------------------

    def result(self, predicted=False):
        gpus, diffs = [], []
        for target in self.targets:
            before = target.before.layout()
            if predicted:
                after = dict(target.wanted) if target.differs else before
                changed = target.differs
            else:
                after = target.gpu.layout()
                changed = after != before
            gpus.append(
                {
                    "index": target.gpu.index,
                    "uuid": target.gpu.uuid,
                    "name": target.gpu.name,
                    "device_id": _mig_config.pci_id_text(target.gpu.device_id),
                    "before": before,
                    "after": after,
                    "changed": changed,
                    "reset_required": target.reset_required or target.gpu.current != target.gpu.pending,
                }
            )
            if changed:
                header = f"{target.gpu.label} {target.gpu.name}"
                diffs.append(
                    {
                        "before_header": header,
                        "after_header": header,
                        "before": layout_text(before),
                        "after": layout_text(after),
                    }
                )
        skipped = []
        for target in self.skipped:
            gpu = target.gpu
            skipped.append(
                {
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "name": gpu.name,
                    "device_id": _mig_config.pci_id_text(gpu.device_id),
                    "entry": target.entry["number"],
                    "reason": f"the product has no MIG ({target.skip_reason})",
                }
            )
            if not target.wanted["mig_enabled"]:
                continue
            diffs.append(
                {
                    "prepared": f"{gpu.label} {gpu.name}: skipped, left as it is: entry {target.entry['number']} "
                    f"names it by devices: all and the product has no MIG ({target.skip_reason})\n"
                }
            )
        changed_gpus = [gpu for gpu in gpus if gpu["changed"]]
        result = {
            "changed": bool(changed_gpus),
            "gpus": gpus,
            "changed_gpus": [gpu["uuid"] for gpu in changed_gpus],
            "reset_required": [gpu["uuid"] for gpu in gpus if gpu["reset_required"]],
            "previous_config": _mig_config.previous_config(changed_gpus),
            "rolled_back": [],
            "skipped_gpus": skipped,
        }
        if self.module._diff:
            result["diff"] = diffs
        return result


if __name__ == "__main__":
    main()
