# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""MIG layouts as plans: which GPU instances (each with its compute instances) a GPU needs for the profile
counts a config wants, whether they fit the product, and in which order to create them.

Pure Python, no NVML: the product's GPU-instance profiles (slices, instance count, memory, placements) are what
NVML answered for the GPU (module_utils/_mig_layout.py asks), so any product the driver supports is planned the
same way and "does not fit" is known before anything on the GPU is destroyed.
"""

from __future__ import annotations

from collections import namedtuple

from ansible_collections.gpuops.k8s.plugins.module_utils._mig_config import compute_instance_sizes, parse_profile

# One GPU-instance profile as NVML describes it: NVML_GPU_INSTANCE_PROFILE_* index, NVIDIA's profile ID, name
# (1g.10gb), compute slices, how many instances the GPU allows, memory MiB, and the placements as
# (first memory slice, memory slices).
GpuInstanceProfile = namedtuple("GpuInstanceProfile", "index id name slices instances memory_mib placements")
# A product's MIG: its profiles by name, its compute slices, and its memory in MiB.
Product = namedtuple("Product", "profiles compute_slices memory_mib")
# A GPU instance to have: its profile name and the sizes of its compute instances, in slices, largest first.
PlannedInstance = namedtuple("PlannedInstance", "profile compute")


class LayoutRefused(Exception):
    """The layout cannot be made on this product; the message is the reason, naming the profile (the caller
    puts it in a sentence that names the GPU and the config)."""

    def __init__(self, profile, reason):
        super().__init__(reason)
        self.profile = profile


def make_product(profiles, memory_mib):
    """A Product from GpuInstanceProfile rows (as NVML lists them, by index) and the GPU's memory. Of two
    profiles with one name the first is kept, as mig-parted takes the first profile whose name matches."""
    by_name = {}
    for profile in profiles:
        by_name.setdefault(profile.name, profile)
    compute_slices = max((profile.slices for profile in profiles), default=0)
    return Product(by_name, compute_slices, memory_mib)


def gpu_instances(devices):
    """The GPU instances, each with its compute instances, that the profile counts ``devices`` need.

    A plain profile (``3g.40gb``) is a GPU instance with one compute instance that takes all of it. Compute-
    instance forms of one GPU-instance profile (``1c.3g.40gb``, ``2c.3g.40gb``) share GPU instances of that
    profile: largest first, each goes into the first one with room for it, so that as few GPU instances as
    possible are made. (mig-parted puts a compute instance into the GPU instance it made last, when that has
    the same profile and room, else into a new one, and tries other orderings of the devices until one fits.)"""
    plain = []
    partial = {}
    for name, count in devices.items():
        profile = parse_profile(name)
        if profile.whole:
            plain += [PlannedInstance(profile.gpu_instance, (profile.g,))] * count
        else:
            partial.setdefault(profile.gpu_instance, []).extend([profile.c] * count)
    planned = list(plain)
    for gi_name, sizes in sorted(partial.items()):
        slices = parse_profile(gi_name).g
        open_instances = []  # per GPU instance: the compute slices taken, as (start, size)
        for size in sorted(sizes, reverse=True):
            for taken in open_instances:
                start = _compute_start(taken, size, slices)
                if start is not None:
                    taken.append((start, size))
                    break
            else:
                open_instances.append([(0, size)])
        for taken in open_instances:
            planned.append(PlannedInstance(gi_name, tuple(sorted((size for _s, size in taken), reverse=True))))
    return creation_order(planned)


def _compute_start(taken, size, slices):
    """The first start of a compute instance of ``size`` slices beside ``taken`` in a GPU instance of ``slices``:
    a multiple of the power of two at or above its size (NVML's compute-instance placements), or None."""
    align = 1 << (size - 1).bit_length()
    for start in range(0, slices - size + 1, align):
        if all(start + size <= other or other + length <= start for other, length in taken):
            return start
    return None


def creation_order(planned):
    """Largest GPU instances first (by the slices in the name, then the memory), so that they get their
    placements before the small ones fragment the GPU."""

    def key(instance):
        profile = parse_profile(instance.profile)
        return (-profile.g, -profile.gb, instance.profile, -sum(instance.compute), [-size for size in instance.compute])

    return sorted(planned, key=key)


def check_fit(product, planned):
    """Raise LayoutRefused when the planned GPU instances cannot all exist on the product at once: a profile it
    does not offer, more instances of a profile than it allows, compute instances their GPU instance cannot
    hold, more compute slices or memory than the GPU has, or no way to place them all without overlap. Returns
    the placements found, (first memory slice, memory slices) per planned instance."""
    needed = {}
    for instance in planned:
        needed[instance.profile] = needed.get(instance.profile, 0) + 1
    for name, count in needed.items():
        profile = product.profiles.get(name)
        if profile is None:
            offered = ", ".join(sorted(product.profiles, key=_profile_sort_key)) or "none"
            raise LayoutRefused(name, f"the product offers no MIG profile {name} (it offers {offered})")
        if count > profile.instances:
            raise LayoutRefused(
                name,
                f"it allows at most {profile.instances} GPU instance(s) of profile {name} and the layout needs {count}",
            )
    slices = memory = 0
    for instance in planned:
        profile = product.profiles[instance.profile]
        if sum(instance.compute) > profile.slices or any(
            size not in compute_instance_sizes(profile.slices) for size in instance.compute
        ):
            sizes = " + ".join(f"{size}c" for size in instance.compute)
            raise LayoutRefused(
                instance.profile, f"a {instance.profile} GPU instance cannot hold compute instances of {sizes}"
            )
        slices += profile.slices
        memory += profile.memory_mib
        if slices > product.compute_slices:
            total = sum(product.profiles[other.profile].slices for other in planned)
            raise LayoutRefused(
                instance.profile,
                f"the layout needs {total} compute slices and the GPU has {product.compute_slices}",
            )
        if memory > product.memory_mib:
            total = sum(product.profiles[other.profile].memory_mib for other in planned)
            raise LayoutRefused(
                instance.profile, f"the layout needs {total} MiB and the GPU has {product.memory_mib} MiB"
            )
    placements, deepest = _place(product, planned, 0, [])
    if placements is None:
        blamed = planned[deepest].profile
        listed = ", ".join(instance.profile for instance in planned)
        raise LayoutRefused(
            blamed,
            f"no placement is left for a {blamed} beside the others ({listed} cannot all be placed at once)",
        )
    return placements


def _place(product, planned, position, used):
    """Depth-first search for a placement of each planned instance from ``position`` on, beside ``used``
    ((start, size) of memory slices). Returns (placements, deepest position reached)."""
    if position == len(planned):
        return [], position
    deepest = position
    for start, size in product.profiles[planned[position].profile].placements:
        if all(start + size <= other or other + length <= start for other, length in used):
            found, reached = _place(product, planned, position + 1, [*used, (start, size)])
            if found is not None:
                return [(start, size), *found], reached
            deepest = max(deepest, reached)
    return None, deepest


def _profile_sort_key(name):
    profile = parse_profile(name)
    return (profile.g, profile.gb, name) if profile else (0, 0, name)


def counts(instances):
    """Profile counts (what a config's mig-devices says) of GPU instances given as (profile name, compute sizes,
    slices of the GPU instance): a compute instance as large as its GPU instance counts under the GPU-instance
    profile, a smaller one under its ``<c>c.`` form."""
    result = {}
    for name, compute, slices in instances:
        for size in compute:
            key = name if size == slices else f"{size}c.{name}"
            result[key] = result.get(key, 0) + 1
    return dict(sorted(result.items(), key=lambda item: _profile_sort_key(item[0])))


def layout_text(layout):
    """One GPU's layout (mig_enabled, mig_pending, devices) as the lines a diff shows."""
    lines = ["mig-enabled: {}".format("true" if layout["mig_enabled"] else "false")]
    if layout["mig_pending"]:
        lines.append("mig-enabled after a GPU reset: {}".format("false" if layout["mig_enabled"] else "true"))
    if layout["mig_enabled"]:
        if layout["devices"]:
            lines.append("mig-devices:")
            lines += [f"  {name}: {count}" for name, count in layout["devices"].items()]
        else:
            lines.append("mig-devices: {}")
    return "\n".join(lines) + "\n"
