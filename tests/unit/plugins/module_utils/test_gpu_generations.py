"""Unit tests of the architecture family of a PCI device ID (module_utils/_gpu_generations.py), with real device IDs
of the PCI ID database and of NVIDIA's open-gpu-kernel-modules README (docs/gpu-generations.md)."""

from __future__ import annotations

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils import _gpu_generations as gg

# (device ID as sysfs writes it, product, family): one or more per family, the ends of blocks included.
REAL_DEVICE_IDS = [
    ("0x102d", "Tesla K80", "kepler"),
    ("0x13bd", "Tesla M10", "maxwell"),
    ("0x13f2", "Tesla M60", "maxwell"),
    ("0x17fd", "Tesla M40", "maxwell"),
    ("0x15f8", "Tesla P100 PCIe 16GB", "pascal"),
    ("0x15f9", "Tesla P100 SXM2 16GB", "pascal"),
    ("0x1b38", "Tesla P40", "pascal"),
    ("0x1bb3", "Tesla P4", "pascal"),
    ("0x1d01", "GeForce GT 1030", "pascal"),
    ("0x1d81", "TITAN V", "volta"),
    ("0x1db1", "Tesla V100 SXM2 16GB", "volta"),
    ("0x1db4", "Tesla V100 PCIe 16GB", "volta"),
    ("0x1df6", "Tesla V100S PCIe 32GB", "volta"),
    ("0x1e02", "TITAN RTX", "turing"),
    ("0x1eb8", "Tesla T4", "turing"),
    ("0x2182", "GeForce GTX 1660 Ti", "turing"),
    ("0x20b0", "A100-SXM4-40GB", "ampere"),
    ("0x20f1", "A100-PCIE-40GB", "ampere"),
    ("0x2236", "A10", "ampere"),
    ("0x25b6", "A2 / A16", "ampere"),
    ("0x26b9", "L40S", "ada-lovelace"),
    ("0x27b8", "L4", "ada-lovelace"),
    ("0x28f8", "RTX 2000 Ada Generation Embedded", "ada-lovelace"),
    ("0x2330", "H100 80GB HBM3", "hopper"),
    ("0x2335", "H200", "hopper"),
    ("0x2342", "GH200 120GB", "hopper"),
    ("0x2901", "B200", "blackwell"),
    ("0x2941", "GB200", "blackwell"),
    ("0x2b85", "GeForce RTX 5090", "blackwell"),
    ("0x2bb5", "RTX PRO 6000 Blackwell Server Edition", "blackwell"),
    ("0x2e12", "GB10", "blackwell"),
    ("0x3182", "B300 SXM6 AC", "blackwell"),
    ("0x31c2", "GB300", "blackwell"),
]


@pytest.mark.parametrize(("device_id", "product", "family"), REAL_DEVICE_IDS)
def test_real_device_ids_belong_to_their_family(device_id, product, family):
    assert gg.gpu_family(device_id) == family, product


@pytest.mark.parametrize(
    "device_id",
    [
        "0x06c0",  # GF100, Fermi: older than the table
        "0x3000",  # GR100, reserved: newer than the table
        "0x2a00",  # between two Blackwell blocks
        "0x2f95",  # Vera CPU, not a GPU
        None,
        "",
        "0x",
        "0xzzzz",
        "0x123456",
        True,
        -1,
        3.5,
    ],
)
def test_unknown_or_malformed_device_ids_are_undefined(device_id):
    assert gg.gpu_family(device_id) == gg.UNDEFINED


@pytest.mark.parametrize("device_id", ["0x1EB8", "1eb8", " 0x1eb8\n", 0x1EB8])
def test_device_id_spellings(device_id):
    assert gg.gpu_family(device_id) == "turing"


def test_blocks_are_ordered_and_disjoint():
    previous_last = -1
    for first, last, family in gg.DEVICE_ID_BLOCKS:
        assert previous_last < first <= last <= 0xFFFF
        assert family in gg.FAMILIES
        previous_last = last


@pytest.mark.parametrize(
    ("family", "runs_open"),
    [
        ("kepler", False),
        ("maxwell", False),
        ("pascal", False),
        ("volta", False),
        ("turing", True),
        ("ampere", True),
        ("ada-lovelace", True),
        ("hopper", True),
        ("blackwell", True),
        ("undefined", None),
        ("rubin", None),
    ],
)
def test_open_kernel_modules_drive_turing_and_later(family, runs_open):
    assert gg.runs_open_modules(family) is runs_open


@pytest.mark.parametrize(
    ("device_id", "product", "branch"),
    [
        ("0x2342", "GH200 120GB / 480GB", 535),
        ("0x2348", "GH200 144G HBM3e", 565),
        ("0x2901", "B200", 570),
        ("0x31c2", "GB300", 570),
        ("0x2330", "H100 80GB HBM3", None),
        ("0x2335", "H200", None),
        ("0x20b0", "A100-SXM4-40GB", None),
        ("0x1db4", "Tesla V100 PCIe 16GB", None),
        ("0x3000", "GR100, reserved", None),
        ("0xzzzz", "malformed", None),
        (None, "none", None),
    ],
)
def test_gpus_that_run_only_the_open_modules_and_their_first_branch(device_id, product, branch):
    assert gg.open_modules_branch(device_id) == branch, product


def test_grace_hopper_stays_a_hopper_gpu():
    """GH200's GPU is a Hopper GPU (GPU Feature Discovery's family); only its kernel modules differ."""
    for device_id in gg.GRACE_HOPPER_OPEN_MODULES_BRANCHES:
        assert gg.gpu_family(device_id) == "hopper"
