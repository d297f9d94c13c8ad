"""Unit tests of the mig-parted v1 reader (module_utils/_mig_config.py): parsing, profile names, selecting GPUs by
devices and device-filter, every refusal's sentence, and NVIDIA's published MIG configs for the A100 40GB, A100
80GB, H100 80GB and H200, each giving the layout mig-parted documents for the product and fitting it."""

from __future__ import annotations

import copy

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._mig_config import (
    MigConfigError,
    compute_instance_sizes,
    entry_matches,
    load_file,
    parse_config,
    parse_pci_id,
    parse_profile,
    pci_id_text,
    previous_config,
    select,
)
from ansible_collections.gpuops.k8s.plugins.module_utils._mig_plan import LayoutRefused, check_fit, gpu_instances
from ansible_collections.gpuops.k8s.tests.unit.plugins.module_utils.mig_products import (
    A100_40GB,
    A100_80GB,
    H100_80GB,
    H200,
    gpu,
    product,
)

SOURCE = "The config option"


def doc(*entries, name="cfg"):
    return {"version": "v1", "mig-configs": {name: list(entries)}}


def entry(**fields):
    """An entry (MIG mode on for all GPUs, no devices) with ``fields``; ``mig_devices=None`` leaves the key out."""
    found = {"devices": "all", "mig-enabled": True, "mig-devices": {}}
    found.update((key.replace("_", "-"), value) for key, value in fields.items())
    return {key: value for key, value in found.items() if value is not None}


def refusal(document, name="cfg"):
    with pytest.raises(MigConfigError) as raised:
        parse_config(document, name, SOURCE)
    return str(raised.value)


# ---------------------------------------------------------------------------------------------
# Profile names and PCI IDs


@pytest.mark.parametrize(
    ("name", "parts", "gpu_instance"),
    [
        ("1g.10gb", (1, 1, 10, ""), "1g.10gb"),
        ("7g.141gb", (7, 7, 141, ""), "7g.141gb"),
        ("1g.10gb+me", (1, 1, 10, "+me"), "1g.10gb+me"),
        ("1g.24gb+me.all", (1, 1, 24, "+me.all"), "1g.24gb+me.all"),
        ("1g.24gb-me", (1, 1, 24, "-me"), "1g.24gb-me"),
        ("1c.3g.40gb", (1, 3, 40, ""), "3g.40gb"),
        ("2c.7g.80gb", (2, 7, 80, ""), "7g.80gb"),
    ],
)
def test_profile_names_are_taken_apart_as_nvidias_libraries_name_them(name, parts, gpu_instance):
    profile = parse_profile(name)
    assert (profile.c, profile.g, profile.gb, profile.suffix) == parts
    assert profile.gpu_instance == gpu_instance
    assert str(profile) == name
    assert profile.whole is (parts[0] == parts[1])


@pytest.mark.parametrize(
    "name",
    [
        "",
        "1g",
        "1g.10",
        "g.10gb",
        "1g.10gb+",
        "1g.10gb+me+me",
        "1g.10gb+me,me",
        "0g.5gb",
        "1g.0gb",
        "1g.10gb+1x",
        7,
        None,
    ],
)
def test_what_is_no_profile_name(name):
    assert parse_profile(name) is None


def test_compute_instance_sizes_follow_the_gpu_instance():
    assert [compute_instance_sizes(g) for g in (1, 2, 3, 4, 7)] == [(1,), (1, 2), (1, 2, 3), (1, 2, 4), (1, 2, 3, 4, 7)]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("0x233010DE", (0x233010DE, None)),
        ("0x233010de", (0x233010DE, None)),
        ("0x20B210DE:0x147E10DE", (0x20B210DE, 0x147E10DE)),
        ("590418142", (590418142, None)),
        ("0x", None),
        ("H100", None),
        ("0x1:0x2:0x3", None),
        ("0x1FFFFFFFF", None),
        (0x233010DE, None),
    ],
)
def test_device_filter_ids(text, parsed):
    assert parse_pci_id(text) == parsed


def test_device_ids_are_written_as_mig_parted_writes_them():
    assert pci_id_text(0x233010DE) == "0x233010DE"
    assert pci_id_text(0x1EB810DE) == "0x1EB810DE"


# ---------------------------------------------------------------------------------------------
# Parsing


def test_an_entry_is_read_with_its_defaults():
    entries = parse_config(
        doc(
            entry(devices=[0, 2], device_filter=["0x233010DE", "0x20B210DE:0x147E10DE"], mig_devices={"1g.10gb": 7}),
            entry(mig_enabled=False, mig_devices=None),
            entry(device_filter="", mig_devices={"1g.10gb": 0, "3g.40gb": 1, "1c.3g.40gb": 2}),
        ),
        "cfg",
        SOURCE,
    )
    assert entries == [
        {
            "number": 0,
            "devices": [0, 2],
            "filters": [(0x233010DE, None), (0x20B210DE, 0x147E10DE)],
            "mig_enabled": True,
            "mig_devices": {"1g.10gb": 7},
        },
        {"number": 1, "devices": "all", "filters": [], "mig_enabled": False, "mig_devices": {}},
        {
            "number": 2,
            "devices": "all",
            "filters": [],
            "mig_enabled": True,
            "mig_devices": {"3g.40gb": 1, "1c.3g.40gb": 2},
        },
    ]


def test_every_config_is_read_and_an_empty_one_names_no_gpu():
    document = doc(entry(mig_devices={"1g.10gb": 7}))
    # Another product's profile in another config is fine: only the format is checked there.
    document["mig-configs"]["other"] = [entry(mig_devices={"1g.5gb": 7})]
    document["mig-configs"]["previous"] = []
    assert parse_config(document, "cfg", SOURCE)[0]["mig_devices"] == {"1g.10gb": 7}
    assert parse_config(document, "previous", SOURCE) == []


@pytest.mark.parametrize(
    ("sibling", "sentence"),
    [
        (3, "The config option, MIG config y is not a list of entries."),
        ([{"devices": "some"}], "The config option, MIG config y, entry 0 has no mig-enabled."),
        (
            [entry(mig_devices={"1g.10": 1})],
            "The config option, MIG config y, entry 0 has '1g.10' in mig-devices, which is not a MIG profile name "
            "such as 1g.10gb, 1g.10gb+me or 1c.3g.40gb.",
        ),
    ],
)
def test_a_malformed_config_beside_the_chosen_one_is_refused_as_mig_parted_refuses_the_file(sibling, sentence):
    document = doc(entry(mig_devices={"1g.10gb": 7}))
    document["mig-configs"]["y"] = sibling
    assert refusal(document) == sentence
    # The chosen config's own faults are named first.
    document["mig-configs"]["cfg"] = 3
    assert refusal(document) == "The config option, MIG config cfg is not a list of entries."


@pytest.mark.parametrize(
    ("document", "sentence"),
    [
        (
            ["version"],
            "The config option is not a mig-parted config: it must be a mapping with version and mig-configs.",
        ),
        (
            {"version": "v1", "mig-configs": {"cfg": []}, "configs": {}},
            "The config option has the unknown key(s) configs; a mig-parted config has version and mig-configs.",
        ),
        ({"version": "v2", "mig-configs": {"cfg": []}}, "The config option has version 'v2'; only v1 is understood."),
        ({"mig-configs": {"cfg": []}}, "The config option has version None; only v1 is understood."),
        ({"version": "v1"}, "The config option has no mig-configs mapping of config names to lists of entries."),
        (
            {"version": "v1", "mig-configs": {}},
            "The config option has no mig-configs mapping of config names to lists of entries.",
        ),
        (
            {"version": "v1", "mig-configs": {"b": [], "a": []}},
            "The config option has no MIG config named cfg (it has a, b).",
        ),
        (
            {"version": "v1", "mig-configs": {"cfg": {"devices": "all"}}},
            "The config option, MIG config cfg is not a list of entries.",
        ),
    ],
)
def test_a_document_that_is_no_mig_parted_config_is_refused_with_one_sentence(document, sentence):
    assert refusal(document) == sentence


E0 = "The config option, MIG config cfg, entry 0"


@pytest.mark.parametrize(
    ("bad_entry", "sentence"),
    [
        ("all", f"{E0} is not a mapping with devices, mig-enabled and mig-devices."),
        (
            entry(mig_device={}),
            f"{E0} has the unknown key(s) mig-device; an entry has devices, device-filter, mig-enabled, mig-devices.",
        ),
        ({"mig-enabled": False}, f"{E0} has no devices."),
        ({"devices": "all"}, f"{E0} has no mig-enabled."),
        (entry(mig_enabled="yes"), f"{E0} has mig-enabled 'yes', which is not true or false."),
        (entry(devices="some"), f"{E0} has devices 'some'; it must be all or a list of GPU indexes."),
        (entry(devices=[]), f"{E0} has devices []; it must be all or a list of GPU indexes."),
        (entry(devices=[0, -1]), f"{E0} has devices [0, -1]; it must be all or a list of GPU indexes."),
        (entry(devices=[True]), f"{E0} has devices [True]; it must be all or a list of GPU indexes."),
        (entry(devices=[1, 1]), f"{E0} names a GPU index twice in devices [1, 1]."),
        (
            entry(device_filter=["0x233010DE", "H100"]),
            f"{E0} has device-filter 'H100', which is not a PCI ID such as 0x233010DE (device 0x2330, vendor 0x10DE).",
        ),
        (
            entry(mig_devices=None),
            f"{E0} has mig-enabled true but no mig-devices ({{}} for MIG mode without devices).",
        ),
        (entry(mig_devices=["1g.10gb"]), f"{E0} has mig-devices ['1g.10gb']; it must map MIG profile names to counts."),
        (
            entry(mig_devices={"1g.10": 7}),
            f"{E0} has '1g.10' in mig-devices, which is not a MIG profile name such as 1g.10gb, 1g.10gb+me or "
            "1c.3g.40gb.",
        ),
        (
            entry(mig_devices={"1g.10gb": -1}),
            f"{E0} has the count -1 for 1g.10gb, which is not a whole number of 0 or more.",
        ),
        (
            entry(mig_devices={"1g.10gb": True}),
            f"{E0} has the count True for 1g.10gb, which is not a whole number of 0 or more.",
        ),
        (
            entry(mig_devices={"1g.10gb": "7"}),
            f"{E0} has the count '7' for 1g.10gb, which is not a whole number of 0 or more.",
        ),
        (
            entry(mig_devices={"3c.4g.40gb": 1}),
            f"{E0} has 3c.4g.40gb in mig-devices, but a 4g GPU instance holds compute instances of 1c, 2c, 4c only.",
        ),
        (
            entry(mig_devices={"4c.3g.40gb": 1}),
            f"{E0} has 4c.3g.40gb in mig-devices, but a 3g GPU instance holds compute instances of 1c, 2c, 3c only.",
        ),
        (
            entry(mig_devices={"1g.10gb": 0}),
            f"{E0} has a count of 0 for every profile in mig-devices ({{}} for none).",
        ),
        (
            entry(mig_enabled=False, mig_devices={"1g.10gb": 1}),
            f"{E0} lists mig-devices while mig-enabled is false.",
        ),
    ],
)
def test_a_bad_entry_is_refused_with_one_sentence_naming_the_config_and_the_entry(bad_entry, sentence):
    assert refusal(doc(bad_entry)) == sentence


def test_the_entry_number_is_the_position_in_the_config():
    sentence = refusal(doc(entry(), entry(devices="none")))
    assert sentence.startswith("The config option, MIG config cfg, entry 1 has devices 'none'")


def test_a_config_file_is_read_and_its_errors_name_the_file_and_the_line(tmp_path):
    good = tmp_path / "config.yaml"
    good.write_text("version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n")
    assert load_file(str(good))["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nmig-configs:\n  all: [\n")
    with pytest.raises(MigConfigError) as raised:
        load_file(str(bad))
    assert str(raised.value).startswith(f"MIG config file {bad} is not valid YAML at line 4, column 1 (")
    with pytest.raises(MigConfigError) as raised:
        load_file(str(tmp_path / "absent.yaml"))
    assert (
        str(raised.value) == f"MIG config file {tmp_path / 'absent.yaml'} cannot be read (No such file or directory)."
    )


# ---------------------------------------------------------------------------------------------
# Selecting GPUs


def test_devices_and_device_filter_select_gpus_and_the_others_are_left_alone():
    entries = parse_config(
        doc(
            entry(device_filter="0x233010DE", devices=[0, 1], mig_devices={"1g.10gb": 7}),
            entry(device_filter=["0x20B010DE", "0x20B210DE"], mig_devices={"3g.40gb": 2}),
        ),
        "cfg",
        SOURCE,
    )
    gpus = [gpu(0, H100_80GB), gpu(1, H100_80GB), gpu(2, H100_80GB), gpu(3, A100_80GB), gpu(4, 0x1EB810DE)]
    chosen = select(entries, gpus, "MIG config cfg")
    assert [(g["index"], e["number"]) for g, e in chosen] == [(0, 0), (1, 0), (3, 1)]


def test_a_subsystem_id_narrows_a_filter():
    filtered = parse_config(doc(entry(device_filter="0x20B210DE:0x147E10DE")), "cfg", SOURCE)[0]
    assert entry_matches(filtered, 0, 0x20B210DE, 0x147E10DE)
    assert not entry_matches(filtered, 0, 0x20B210DE, 0x134F10DE)
    assert not entry_matches(filtered, 0, 0x20B010DE, 0x147E10DE)


def test_a_gpu_two_entries_name_is_refused():
    entries = parse_config(doc(entry(devices=[0, 1]), entry(devices=[1, 2])), "cfg", SOURCE)
    with pytest.raises(MigConfigError) as raised:
        select(entries, [gpu(i, H100_80GB) for i in range(3)], "MIG config cfg")
    assert str(raised.value) == (
        "MIG config cfg: GPU 1 (GPU-00000000-0000-4000-8000-000000000001) is named by entries 0 and 1; "
        "each GPU may be named by one entry only."
    )


def test_an_index_the_host_does_not_have_is_refused():
    entries = parse_config(doc(entry(devices=[0, 8, 9])), "cfg", SOURCE)
    with pytest.raises(MigConfigError) as raised:
        select(entries, [gpu(i, H100_80GB) for i in range(8)], "MIG config cfg")
    assert str(raised.value) == (
        "MIG config cfg, entry 0 names GPU index(es) [8, 9], which this host does not have (it has 8 GPU(s))."
    )


def test_the_previous_config_names_each_gpu_by_index_with_its_layout_and_reads_back():
    gpus = [
        {"index": 2, "before": {"mig_enabled": True, "mig_pending": False, "devices": {"1g.10gb": 7}}},
        {"index": 5, "before": {"mig_enabled": False, "mig_pending": True, "devices": {}}},
    ]
    document = previous_config(gpus)
    assert document == {
        "version": "v1",
        "mig-configs": {
            "previous": [
                {"devices": [2], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
                {"devices": [5], "mig-enabled": False},
            ]
        },
    }
    assert [e["mig_devices"] for e in parse_config(document, "previous", SOURCE)] == [{"1g.10gb": 7}, {}]


# ---------------------------------------------------------------------------------------------
# NVIDIA's published configs (mig-parted's example config and the default config the GPU Operator's MIG manager
# ships), restated: per config, its entries as (device filter, mig-enabled, mig-devices).

FILTER_80GB = [
    "0x233010DE",
    "0x233110DE",
    "0x232210DE",
    "0x20B210DE",
    "0x20B510DE",
    "0x20F310DE",
    "0x20F510DE",
    "0x232410DE",
]
FILTER_40GB = ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]
FILTER_H200 = ["0x233510DE", "0x233B10DE"]


def _all(devices, device_filter=None):
    found = {"devices": "all", "mig-enabled": devices is not None, "mig-devices": devices or {}}
    if device_filter is not None:
        found["device-filter"] = device_filter
    return found


NVIDIA_CONFIGS = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [_all({})],
        "all-1g.5gb": [_all({"1g.5gb": 7})],
        "all-1g.5gb.me": [_all({"1g.5gb+me": 1})],
        "all-2g.10gb": [_all({"2g.10gb": 3})],
        "all-3g.20gb": [_all({"3g.20gb": 2})],
        "all-4g.20gb": [_all({"4g.20gb": 1})],
        "all-7g.40gb": [_all({"7g.40gb": 1})],
        "all-1g.10gb": [_all({"1g.10gb": 7}, FILTER_80GB), _all({"1g.10gb": 4}, FILTER_40GB)],
        "all-1g.10gb.me": [_all({"1g.10gb+me": 1})],
        "all-1g.20gb": [_all({"1g.20gb": 4})],
        "all-2g.20gb": [_all({"2g.20gb": 3})],
        "all-3g.40gb": [_all({"3g.40gb": 2})],
        "all-4g.40gb": [_all({"4g.40gb": 1})],
        "all-7g.80gb": [_all({"7g.80gb": 1})],
        "all-1g.18gb": [_all({"1g.18gb": 7})],
        "all-1g.18gb.me": [_all({"1g.18gb+me": 1})],
        "all-1g.35gb": [_all({"1g.35gb": 4}, ["0x233510DE"])],
        "all-2g.35gb": [_all({"2g.35gb": 3})],
        "all-3g.71gb": [_all({"3g.71gb": 2})],
        "all-4g.71gb": [_all({"4g.71gb": 1})],
        "all-7g.141gb": [_all({"7g.141gb": 1})],
        "all-balanced": [
            _all({"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}, FILTER_H200),
            _all({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, FILTER_80GB),
            _all({"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}, FILTER_40GB),
        ],
    },
}

# What mig-parted makes of each config on each product: (config, product, MIG devices); None for MIG mode off.
BALANCED_40GB = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
BALANCED_80GB = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
PUBLISHED_LAYOUTS = [
    *((config, name, None) for config in ["all-disabled"] for name in (A100_40GB, A100_80GB, H100_80GB, H200)),
    *((config, name, {}) for config in ["all-enabled"] for name in (A100_40GB, A100_80GB, H100_80GB, H200)),
    ("all-1g.5gb", A100_40GB, {"1g.5gb": 7}),
    ("all-1g.5gb.me", A100_40GB, {"1g.5gb+me": 1}),
    ("all-1g.10gb", A100_40GB, {"1g.10gb": 4}),
    ("all-2g.10gb", A100_40GB, {"2g.10gb": 3}),
    ("all-3g.20gb", A100_40GB, {"3g.20gb": 2}),
    ("all-4g.20gb", A100_40GB, {"4g.20gb": 1}),
    ("all-7g.40gb", A100_40GB, {"7g.40gb": 1}),
    ("all-balanced", A100_40GB, BALANCED_40GB),
    *(
        (config, name, devices)
        for name in (A100_80GB, H100_80GB)
        for config, devices in [
            ("all-1g.10gb", {"1g.10gb": 7}),
            ("all-1g.10gb.me", {"1g.10gb+me": 1}),
            ("all-1g.20gb", {"1g.20gb": 4}),
            ("all-2g.20gb", {"2g.20gb": 3}),
            ("all-3g.40gb", {"3g.40gb": 2}),
            ("all-4g.40gb", {"4g.40gb": 1}),
            ("all-7g.80gb", {"7g.80gb": 1}),
            ("all-balanced", BALANCED_80GB),
        ]
    ),
    ("all-1g.18gb", H200, {"1g.18gb": 7}),
    ("all-1g.18gb.me", H200, {"1g.18gb+me": 1}),
    ("all-1g.35gb", H200, {"1g.35gb": 4}),
    ("all-2g.35gb", H200, {"2g.35gb": 3}),
    ("all-3g.71gb", H200, {"3g.71gb": 2}),
    ("all-4g.71gb", H200, {"4g.71gb": 1}),
    ("all-7g.141gb", H200, {"7g.141gb": 1}),
    ("all-balanced", H200, {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
]
SHORT = {A100_40GB: "a100-40gb", A100_80GB: "a100-80gb", H100_80GB: "h100-80gb", H200: "h200"}


def _layout(config, name):
    """The MIG devices config ``config`` wants on a GPU of product ``name`` (None: MIG off; absent: left alone),
    after checking that they fit the product."""
    entries = parse_config(copy.deepcopy(NVIDIA_CONFIGS), config, "NVIDIA's configs")
    chosen = select(entries, [gpu(0, name)], f"MIG config {config}")
    if not chosen:
        return "left alone"
    wanted = chosen[0][1]
    if not wanted["mig_enabled"]:
        return None
    check_fit(product(name), gpu_instances(wanted["mig_devices"]))
    return wanted["mig_devices"]


@pytest.mark.parametrize(
    ("config", "name", "devices"),
    PUBLISHED_LAYOUTS,
    ids=[f"{config}-{SHORT[name]}" for config, name, _d in PUBLISHED_LAYOUTS],
)
def test_each_published_config_gives_the_layout_mig_parted_documents(config, name, devices):
    assert _layout(config, name) == devices


@pytest.mark.parametrize(
    ("config", "name"),
    [
        ("all-1g.10gb", H200),  # filtered to the 80GB and 40GB products
        ("all-1g.35gb", H100_80GB),  # filtered to the H200 141GB
    ],
)
def test_a_published_config_filtered_to_other_products_leaves_the_gpu_alone(config, name):
    assert _layout(config, name) == "left alone"


@pytest.mark.parametrize(
    ("config", "name", "profile"),
    [
        ("all-1g.5gb", H100_80GB, "1g.5gb"),
        ("all-1g.20gb", A100_40GB, "1g.20gb"),
        ("all-3g.40gb", A100_40GB, "3g.40gb"),
        ("all-7g.141gb", H100_80GB, "7g.141gb"),
        ("all-1g.18gb", A100_80GB, "1g.18gb"),
    ],
)
def test_a_published_config_for_another_product_is_refused_naming_the_profile(config, name, profile):
    with pytest.raises(LayoutRefused) as raised:
        _layout(config, name)
    assert raised.value.profile == profile
    assert str(raised.value).startswith(f"the product offers no MIG profile {profile} (it offers ")


def test_mig_parteds_example_config_for_a_dgx_a100():
    """examples/config.yaml of mig-parted: custom-config on the eight A100 40GB GPUs of a DGX A100."""
    document = copy.deepcopy(NVIDIA_CONFIGS)
    document["mig-configs"]["custom-config"] = [
        {"devices": [0, 1, 2, 3], "mig-enabled": False},
        {"devices": [4], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}},
        {"devices": [5], "mig-enabled": True, "mig-devices": {"2g.10gb": 3}},
        {"devices": [6], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}},
        {"devices": [7], "mig-enabled": True, "mig-devices": BALANCED_40GB},
    ]
    entries = parse_config(document, "custom-config", "examples/config.yaml")
    chosen = select(entries, [gpu(i, A100_40GB) for i in range(8)], "MIG config custom-config")
    wanted = [(g["index"], e["mig_enabled"], e["mig_devices"]) for g, e in chosen]
    assert wanted == [(i, False, {}) for i in range(4)] + [
        (4, True, {"1g.5gb": 7}),
        (5, True, {"2g.10gb": 3}),
        (6, True, {"3g.20gb": 2}),
        (7, True, BALANCED_40GB),
    ]
    for _index, _enabled, devices in wanted[4:]:
        check_fit(product(A100_40GB), gpu_instances(devices))


def test_mig_parteds_example_config_for_a_dgx_station_a100_80gb():
    """examples/dgx-station-80gb-config.yaml: four A100 80GB and a display GPU (0x1FB0) at index 3, which only
    the entry with its device filter names."""
    document = {
        "version": "v1",
        "mig-configs": {
            "balanced-k8s-dgx-station-80": [
                {"device-filter": "0x20B210DE", "devices": [0], "mig-enabled": False, "mig-devices": {}},
                {"device-filter": "0x20B210DE", "devices": [1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
                {
                    "device-filter": "0x20B210DE",
                    "devices": [2],
                    "mig-enabled": True,
                    "mig-devices": {"2g.20gb": 3, "1g.10gb": 1},
                },
                {"device-filter": "0x20B210DE", "devices": [4], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
                {"device-filter": "0x1FB010DE", "devices": [3], "mig-enabled": False, "mig-devices": {}},
            ]
        },
    }
    entries = parse_config(document, "balanced-k8s-dgx-station-80", "examples/dgx-station-80gb-config.yaml")
    gpus = [gpu(0, A100_80GB), gpu(1, A100_80GB), gpu(2, A100_80GB), gpu(3, 0x1FB010DE), gpu(4, A100_80GB)]
    chosen = select(entries, gpus, "MIG config balanced-k8s-dgx-station-80")
    assert [(g["index"], e["number"]) for g, e in chosen] == [(0, 0), (1, 1), (2, 2), (3, 4), (4, 3)]
    placements = check_fit(product(A100_80GB), gpu_instances({"2g.20gb": 3, "1g.10gb": 1}))
    assert placements == [(0, 2), (2, 2), (4, 2), (6, 1)]
