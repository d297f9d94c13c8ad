# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The architecture family of an NVIDIA GPU from its PCI device ID, before any driver is installed.

NVIDIA gives each chip a block of PCI device IDs, so a device ID tells the chip, and the chip the family. The
blocks below, and the sources they were read from, are in docs/gpu-generations.md. The family names are those
gpuops.k8s.nvidia_gpu_info gives a GPU from its compute capability (GPU Feature Discovery's), and C(undefined)
for a device ID outside every block.

Runs on the target (gpuops.k8s.nvidia_gpu_info): Python 3.9+, standard library only.
"""

UNDEFINED = "undefined"

# Inclusive (first, last, family) blocks of PCI device IDs, by chip.
DEVICE_ID_BLOCKS = (
    (0x0FC0, 0x103F, "kepler"),  # GK107, GK110, GK180, GK210
    (0x1180, 0x11FF, "kepler"),  # GK104, GK106
    (0x1280, 0x12FF, "kepler"),  # GK208, GK110
    (0x1340, 0x143F, "maxwell"),  # GM107, GM108, GM204, GM206
    (0x15C0, 0x15FF, "pascal"),  # GP100
    (0x1600, 0x167F, "maxwell"),  # GM204 (mobile, GRID M60)
    (0x1720, 0x172F, "pascal"),  # GP100
    (0x1740, 0x17FF, "maxwell"),  # GM107, GM108, GM200
    (0x1B00, 0x1D7F, "pascal"),  # GP102, GP104, GP106, GP107, GP108
    (0x1D80, 0x1DFF, "volta"),  # GV100
    (0x1E00, 0x1FFF, "turing"),  # TU102, TU104, TU106, TU117
    (0x2080, 0x20FF, "ampere"),  # GA100
    (0x2180, 0x21FF, "turing"),  # TU116
    (0x2200, 0x228F, "ampere"),  # GA102, and audio functions of GA10x
    (0x2300, 0x23FF, "hopper"),  # GH100
    (0x2400, 0x25FF, "ampere"),  # GA103, GA104, GA106, GA107
    (0x2680, 0x28FF, "ada-lovelace"),  # AD102, AD103, AD104, AD106, AD107
    (0x2900, 0x29FF, "blackwell"),  # GB100, GB102
    (0x2B00, 0x2F8F, "blackwell"),  # GB202, GB203, GB205, GB206, GB207, GB10
    (0x3180, 0x323F, "blackwell"),  # GB110, GB112
    (0x3340, 0x337F, "blackwell"),  # GB120
)

# Families in the order NVIDIA introduced them; the open kernel modules drive Turing and later.
FAMILIES = ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada-lovelace", "hopper", "blackwell")
OPEN_MODULES_FAMILIES = frozenset(FAMILIES[FAMILIES.index("turing") :])

# GPUs that run only the open kernel modules, with the first driver branch whose open modules drive them: every
# Blackwell GPU from 570, and the Hopper GPUs of Grace Hopper superchips (GH200) by device ID, each from the first
# branch whose open modules list it (docs/gpu-generations.md).
BLACKWELL_OPEN_MODULES_BRANCH = 570
GRACE_HOPPER_OPEN_MODULES_BRANCHES = {
    0x2342: 535,  # GH200 120GB, GH200 480GB
    0x2348: 565,  # GH200 144G HBM3e
}


def parse_device_id(device_id):
    """The integer of a PCI device ID given as sysfs writes it ("0x2330"), as a bare hex string, or as an int;
    None for anything else."""
    if isinstance(device_id, bool):
        return None
    if isinstance(device_id, int):
        return device_id if 0 <= device_id <= 0xFFFF else None
    if not isinstance(device_id, str):
        return None
    text = device_id.strip().lower()
    if text.startswith("0x"):
        text = text[2:]
    if not 1 <= len(text) <= 4:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def in_blocks(device_id, blocks, default):
    """What the inclusive (first, last, value) block holding a PCI device ID gives; DEFAULT when none holds it or the
    ID is malformed."""
    number = parse_device_id(device_id)
    if number is None:
        return default
    return next((value for first, last, value in blocks if first <= number <= last), default)


def gpu_family(device_id):
    """The architecture family of an NVIDIA GPU's PCI device ID; UNDEFINED when unknown or malformed."""
    return in_blocks(device_id, DEVICE_ID_BLOCKS, UNDEFINED)


def runs_open_modules(family):
    """Whether NVIDIA's open kernel modules can drive a GPU of this family (Turing and later); None when the
    family is not known."""
    if family not in FAMILIES:
        return None
    return family in OPEN_MODULES_FAMILIES


def open_modules_branch(device_id):
    """For a GPU that runs only the open kernel modules (Blackwell, Grace Hopper GH200), the first driver branch
    whose open modules drive its PCI device ID; None for any other GPU, and for an unknown or malformed ID."""
    if gpu_family(device_id) == "blackwell":
        return BLACKWELL_OPEN_MODULES_BRANCH
    return GRACE_HOPPER_OPEN_MODULES_BRANCHES.get(parse_device_id(device_id))
