"""Unit tests of the MIG planner (module_utils/_mig_plan.py): GPU instances for profile counts (compute instances
sharing them), the creation order, every reason a layout does not fit a product, the counts a layout reads as,
and its text in a diff. Also the profile name NVML's older profile struct leaves to be derived
(module_utils/_mig_layout.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._mig_layout import _profile_name
from ansible_collections.gpuops.k8s.plugins.module_utils._mig_plan import (
    GpuInstanceProfile,
    LayoutRefused,
    PlannedInstance,
    check_fit,
    counts,
    gpu_instances,
    layout_text,
    make_product,
)
from ansible_collections.gpuops.k8s.plugins.module_utils._simulated_spec import MIG_PRODUCTS
from ansible_collections.gpuops.k8s.tests.unit.plugins.module_utils.mig_products import (
    A100_40GB,
    H100_80GB,
    H200,
    PRODUCTS,
    product,
)


def test_plain_profiles_are_one_gpu_instance_each_largest_first():
    assert gpu_instances({"1g.10gb": 2, "3g.40gb": 1, "2g.20gb": 1}) == [
        PlannedInstance("3g.40gb", (3,)),
        PlannedInstance("2g.20gb", (2,)),
        PlannedInstance("1g.10gb", (1,)),
        PlannedInstance("1g.10gb", (1,)),
    ]
    # Of two 1-slice profiles the one with more memory first (it has fewer placements).
    assert [i.profile for i in gpu_instances({"1g.10gb": 1, "1g.20gb": 1, "1g.10gb+me": 1})] == [
        "1g.20gb",
        "1g.10gb",
        "1g.10gb+me",
    ]


def test_compute_instances_of_one_profile_share_gpu_instances_while_they_fit():
    assert gpu_instances({"1c.3g.40gb": 1, "2c.3g.40gb": 1, "4g.40gb": 1}) == [
        PlannedInstance("4g.40gb", (4,)),
        PlannedInstance("3g.40gb", (2, 1)),
    ]
    assert gpu_instances({"1c.3g.40gb": 4}) == [
        PlannedInstance("3g.40gb", (1, 1, 1)),
        PlannedInstance("3g.40gb", (1,)),
    ]
    # Two 2c fill a 4g (at 0 and 2); a third needs another.
    assert gpu_instances({"2c.4g.40gb": 3}) == [PlannedInstance("4g.40gb", (2, 2)), PlannedInstance("4g.40gb", (2,))]
    # In a 7g a 3c takes 0-2, a 2c starts on a multiple of 2 (4-5), a 1c takes 3: one GPU instance.
    assert gpu_instances({"3c.7g.80gb": 1, "2c.7g.80gb": 1, "1c.7g.80gb": 1}) == [PlannedInstance("7g.80gb", (3, 2, 1))]
    # A 4c and a 3c fill a 7g (0-3, 4-6): a 1c needs another.
    assert gpu_instances({"4c.7g.80gb": 1, "3c.7g.80gb": 1, "1c.7g.80gb": 1}) == [
        PlannedInstance("7g.80gb", (4, 3)),
        PlannedInstance("7g.80gb", (1,)),
    ]
    # A plain 3g.40gb is a GPU instance of its own beside the shared one.
    assert gpu_instances({"3g.40gb": 1, "1c.3g.40gb": 2}) == [
        PlannedInstance("3g.40gb", (3,)),
        PlannedInstance("3g.40gb", (1, 1)),
    ]


def test_nothing_wanted_is_no_instance():
    assert gpu_instances({}) == []


@pytest.mark.parametrize(
    ("devices", "placements"),
    [
        ({"1g.10gb": 7}, [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]),
        ({"3g.40gb": 2}, [(0, 4), (4, 4)]),
        ({"4g.40gb": 1, "3g.40gb": 1}, [(0, 4), (4, 4)]),
        # all-balanced: with the 3g.40gb at 0 the 2g.20gb takes 4-5 and only one 1g.10gb fits; so the 3g goes to 4.
        ({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, [(4, 4), (0, 2), (2, 1), (3, 1)]),
        ({"2g.20gb": 3, "1g.20gb": 1}, [(0, 2), (2, 2), (4, 2), (6, 2)]),
    ],
)
def test_a_layout_that_fits_gets_a_placement_for_each_gpu_instance(devices, placements):
    assert check_fit(product(H100_80GB), gpu_instances(devices)) == placements


def refusal(name, devices):
    with pytest.raises(LayoutRefused) as raised:
        check_fit(product(name), gpu_instances(devices))
    return raised.value.profile, str(raised.value)


def test_a_profile_the_product_does_not_offer():
    assert refusal(H100_80GB, {"1g.5gb": 7}) == (
        "1g.5gb",
        "the product offers no MIG profile 1g.5gb (it offers 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, "
        "4g.40gb, 7g.80gb)",
    )


@pytest.mark.parametrize(
    ("devices", "profile", "allowed", "needed"),
    [
        ({"1g.10gb": 8}, "1g.10gb", 7, 8),
        ({"4g.40gb": 2}, "4g.40gb", 1, 2),
        ({"1g.10gb+me": 2}, "1g.10gb+me", 1, 2),
        ({"1g.20gb": 5}, "1g.20gb", 4, 5),
    ],
)
def test_more_instances_than_the_product_allows(devices, profile, allowed, needed):
    assert refusal(H100_80GB, devices) == (
        profile,
        f"it allows at most {allowed} GPU instance(s) of profile {profile} and the layout needs {needed}",
    )


def test_more_compute_slices_than_the_gpu_has():
    assert refusal(H100_80GB, {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}) == (
        "1g.10gb",
        "the layout needs 8 compute slices and the GPU has 7",
    )


def test_more_memory_than_the_gpu_has():
    assert refusal(H100_80GB, {"3g.40gb": 2, "1g.10gb": 1}) == (
        "1g.10gb",
        "the layout needs 90880 MiB and the GPU has 81559 MiB",
    )


def test_compute_instances_their_gpu_instance_cannot_hold():
    # Planned by hand: the planner itself never puts them together.
    with pytest.raises(LayoutRefused) as raised:
        check_fit(product(H100_80GB), [PlannedInstance("3g.40gb", (2, 2))])
    assert str(raised.value) == "a 3g.40gb GPU instance cannot hold compute instances of 2c + 2c"


WHOLE = GpuInstanceProfile(4, 0, "7g.80gb", 7, 1, 80000, ((0, 8),))


def test_placements_that_cannot_all_be_had_at_once():
    """A product whose counts, slices and memory allow a layout its placements do not: a 4-slice profile only at
    the start and a 2-slice one only at 2, so the two overlap."""
    tight = make_product(
        [
            WHOLE,
            GpuInstanceProfile(3, 5, "4g.40gb", 4, 1, 40000, ((0, 4),)),
            GpuInstanceProfile(1, 14, "2g.20gb", 2, 1, 20000, ((2, 2),)),
        ],
        81000,
    )
    with pytest.raises(LayoutRefused) as raised:
        check_fit(tight, gpu_instances({"4g.40gb": 1, "2g.20gb": 1}))
    assert raised.value.profile == "2g.20gb"
    assert str(raised.value) == (
        "no placement is left for a 2g.20gb beside the others (4g.40gb, 2g.20gb cannot all be placed at once)"
    )


def test_the_placement_search_backtracks():
    """Taking the first placement of each would fail: the 1-slice profile must leave slice 0 to the 2-slice one."""
    shifting = make_product(
        [
            WHOLE,
            GpuInstanceProfile(1, 14, "2g.20gb", 2, 1, 20000, ((0, 2),)),
            GpuInstanceProfile(9, 15, "1g.20gb", 1, 2, 20000, ((0, 2), (2, 2))),
        ],
        81000,
    )
    assert check_fit(shifting, [PlannedInstance("1g.20gb", (1,)), PlannedInstance("2g.20gb", (2,))]) == [
        (2, 2),
        (0, 2),
    ]


def test_counts_name_each_compute_instance_by_its_share_of_its_gpu_instance():
    instances = [
        ("3g.40gb", (2, 1), 3),
        ("3g.40gb", (3,), 3),
        ("1g.10gb", (1,), 1),
        ("1g.10gb", (1,), 1),
        ("4g.40gb", (), 4),
    ]
    assert counts(instances) == {"1g.10gb": 2, "1c.3g.40gb": 1, "2c.3g.40gb": 1, "3g.40gb": 1}
    # The same layout planned reads as the counts it was planned from.
    wanted = {"1c.3g.40gb": 1, "2c.3g.40gb": 1, "4g.40gb": 1}
    planned = gpu_instances(wanted)
    assert counts((i.profile, i.compute, int(i.profile[0])) for i in planned) == wanted


def test_a_layout_as_a_diff_shows_it():
    assert layout_text({"mig_enabled": False, "mig_pending": False, "devices": {}}) == "mig-enabled: false\n"
    assert layout_text({"mig_enabled": False, "mig_pending": True, "devices": {}}) == (
        "mig-enabled: false\nmig-enabled after a GPU reset: true\n"
    )
    assert (
        layout_text({"mig_enabled": True, "mig_pending": False, "devices": {}})
        == "mig-enabled: true\nmig-devices: {}\n"
    )
    assert layout_text({"mig_enabled": True, "mig_pending": False, "devices": {"1g.10gb": 2, "3g.40gb": 1}}) == (
        "mig-enabled: true\nmig-devices:\n  1g.10gb: 2\n  3g.40gb: 1\n"
    )


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_without_a_name_from_nvml_a_profile_is_named_from_its_memory_as_nvidias_tools_name_it(name):
    """An older driver's profile struct has no name; the one derived from the memory share is NVIDIA's."""
    memory = PRODUCTS[name][1]
    for row in MIG_PRODUCTS[name]:
        info = SimpleNamespace(memorySizeMB=row[5], sliceCount=row[3])
        assert _profile_name(info, row[0], memory) == row[2]
    named = SimpleNamespace(name=b"MIG 1g.10gb", memorySizeMB=1, sliceCount=1)
    assert _profile_name(named, 0, memory) == "1g.10gb"


def test_the_products_are_what_their_names_say():
    assert sorted(product(A100_40GB).profiles)[:2] == ["1g.10gb", "1g.5gb"]
    assert (product(H200).compute_slices, product(H200).memory_mib) == (7, 143771)


def test_of_two_profiles_with_one_name_the_first_nvml_lists_is_kept():
    """mig-parted takes the first profile, in NVML's order, whose name matches."""
    plain = GpuInstanceProfile(0, 19, "1g.10gb", 1, 7, 9984, ((0, 1),))
    later = GpuInstanceProfile(9, 99, "1g.10gb", 1, 7, 9984, ((0, 1),))
    assert make_product([plain, later], 81559).profiles["1g.10gb"].id == 19
