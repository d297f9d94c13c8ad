import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.gpu_labels import FilterModule, gpu_labels
from ansible_collections.gpuops.k8s.plugins.module_utils._node_labels import gpu_family, sanitize_label_value


def _info(name="NVIDIA H100 80GB HBM3", count=8, memory=81559, cc="9.0", driver="580.95.05", cuda="13.0"):
    gpu = {"index": 0, "name": name, "memory_total_mib": memory, "compute_capability": cc}
    return {"gpus": [dict(gpu, index=i) for i in range(count)], "driver_version": driver, "cuda_driver_version": cuda}


@pytest.mark.parametrize(
    "cc, family",
    [
        ("3.7", "kepler"),
        ("5.2", "maxwell"),
        ("6.0", "pascal"),
        ("7.0", "volta"),
        ("7.2", "volta"),
        ("7.5", "turing"),
        ("8.0", "ampere"),
        ("8.6", "ampere"),
        ("8.7", "ampere"),
        ("8.9", "ada-lovelace"),
        ("9.0", "hopper"),
        ("10.0", "blackwell"),
        ("10.3", "blackwell"),
        ("12.0", "blackwell"),
        ("12.1", "blackwell"),
        ("4.0", "undefined"),
        ("11.0", "undefined"),
    ],
)
def test_every_family(cc, family):
    assert gpu_family(cc) == family
    assert gpu_labels(_info(cc=cc))["nvidia.com/gpu.family"] == family


def test_h100_labels_are_gfd_names():
    labels = gpu_labels(_info())
    assert labels == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/cuda.driver-version.full": "580.95.05",
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.minor": "95",
        "nvidia.com/cuda.driver-version.revision": "05",
        "nvidia.com/cuda.driver.major": "580",
        "nvidia.com/cuda.driver.minor": "95",
        "nvidia.com/cuda.driver.rev": "05",
        "nvidia.com/cuda.runtime-version.full": "13.0",
        "nvidia.com/cuda.runtime-version.major": "13",
        "nvidia.com/cuda.runtime-version.minor": "0",
        "nvidia.com/cuda.runtime.major": "13",
        "nvidia.com/cuda.runtime.minor": "0",
    }


def test_two_part_driver_version_has_empty_revision():
    labels = gpu_labels(_info(driver="535.129"))
    assert labels["nvidia.com/cuda.driver-version.revision"] == ""
    assert labels["nvidia.com/cuda.driver.minor"] == "129"


@pytest.mark.parametrize(
    "raw, clean",
    [
        ("Tesla T4", "Tesla-T4"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("NVIDIA GeForce RTX 4090 (rev a1)", "NVIDIA-GeForce-RTX-4090--rev-a1"),
        ("  -weird/name!  ", "weird-name"),
        ("x" * 80, "x" * 63),
        ("a" * 62 + " b", "a" * 62),
        ("", ""),
    ],
)
def test_sanitizing(raw, clean):
    assert sanitize_label_value(raw) == clean
    assert len(sanitize_label_value(raw)) <= 63


@pytest.mark.parametrize(
    "name, product",
    [
        # GPU Feature Discovery's spelling: other characters dropped, each run of spaces one '-'.
        ("NVIDIA RTX A6000 / Ada", "NVIDIA-RTX-A6000-Ada"),
        ("NVIDIA GeForce RTX 4090 (rev a1)", "NVIDIA-GeForce-RTX-4090-rev-a1"),
        ("Tesla  T4 ", "Tesla-T4"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("Quadro RTX 8000, \u00e9dition", "Quadro-RTX-8000-dition"),
        # Still a valid label value where GFD's would not be: at most 63 characters, alphanumeric at the edges.
        ("x" * 80, "x" * 63),
        ("_GPU_", "GPU"),
    ],
)
def test_product_label_is_spelled_as_gfd_spells_it(name, product):
    assert gpu_labels(_info(name=name))["nvidia.com/gpu.product"] == product


TIME_SLICED = {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}


def test_time_sliced_gpus_are_shared_in_the_labels():
    labels = gpu_labels(_info(name="NVIDIA L4", count=2, cc="8.9"), sharing=TIME_SLICED)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    # The count stays the physical GPUs.
    assert labels["nvidia.com/gpu.count"] == "2"


def test_renamed_shared_gpus_keep_their_product_name():
    sharing = {"timeSlicing": dict(TIME_SLICED["timeSlicing"], renameByDefault=True)}
    labels = gpu_labels(_info(name="NVIDIA L4"), sharing=sharing)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert (labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.sharing-strategy"]) == ("4", "time-slicing")


@pytest.mark.parametrize(
    "sharing",
    [
        {},
        None,
        {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}},
        {"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}]}},
    ],
)
def test_gpus_that_are_not_time_sliced_have_one_replica(sharing):
    labels = gpu_labels(_info(), sharing=sharing)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert (labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.sharing-strategy"]) == ("1", "none")


def _gpu(index, name, mig_mode="disabled", memory=40960, cc="8.0"):
    return {"index": index, "name": name, "memory_total_mib": memory, "compute_capability": cc, "mig_mode": mig_mode}


def test_a_whole_gpu_is_described_before_one_in_mig_mode_and_the_count_is_of_its_model():
    info = {
        "gpus": [
            _gpu(0, "NVIDIA A100-SXM4-80GB", "enabled", 81920),
            _gpu(1, "NVIDIA A30", memory=24576),
            _gpu(2, "NVIDIA A30", memory=24576),
        ]
    }
    labels = gpu_labels(info, sharing=TIME_SLICED)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A30-SHARED"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.memory"] == "24576"


def test_a_model_only_in_mig_mode_is_not_shared():
    info = {"gpus": [_gpu(0, "NVIDIA A100-SXM4-40GB", "enabled"), _gpu(1, "NVIDIA A100-SXM4-40GB", "enabled")]}
    labels = gpu_labels(info, sharing=TIME_SLICED)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert (labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.sharing-strategy"]) == ("0", "none")
    # One whole GPU of the model is enough for the model to be shared, as in GFD.
    info["gpus"][1]["mig_mode"] = "disabled"
    assert gpu_labels(info, sharing=TIME_SLICED)["nvidia.com/gpu.replicas"] == "4"


@pytest.mark.parametrize(
    "sharing, message",
    [
        ("time-slicing", "must be the sharing section"),
        ({"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}, "has mps; only timeSlicing"),
        ({"timeSlicing": {"resources": "all"}}, "resources must be a list"),
        ({"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": "four"}]}}, r"resources\[0\]\.replicas"),
        ({"timeSlicing": {"renameByDefault": "yes", "resources": []}}, "renameByDefault must be true or false"),
    ],
)
def test_bad_sharing_fails_with_one_sentence(sharing, message):
    with pytest.raises(AnsibleFilterError, match=message):
        gpu_labels(_info(), sharing=sharing)


def test_user_labels_added_and_win():
    labels = gpu_labels(_info(), {"accelerator": "nvidia-h100", "nvidia.com/gpu.family": "custom", "team/x": True})
    assert labels["accelerator"] == "nvidia-h100"
    assert labels["nvidia.com/gpu.family"] == "custom"
    assert labels["team/x"] == "true"


def test_user_label_values_are_sanitized():
    assert gpu_labels(_info(), {"site": "rack 12 / row b"})["site"] == "rack-12---row-b"


@pytest.mark.parametrize("key", ["", "bad key", "-leading", "Upper.Case.Prefix/name", "a/" + "n" * 64, "x/y/z"])
def test_invalid_user_label_keys_fail_with_a_sentence(key):
    with pytest.raises(AnsibleFilterError, match="label key"):
        gpu_labels(_info(), {key: "v"})


def test_no_gpus_gives_only_user_labels():
    assert gpu_labels({"gpus": [], "driver_version": None}, {"accelerator": "none"}) == {"accelerator": "none"}


def test_missing_cuda_and_driver_versions_are_left_out():
    labels = gpu_labels(_info(driver=None, cuda=None))
    assert not [k for k in labels if k.startswith("nvidia.com/cuda.")]
    assert labels["nvidia.com/gpu.count"] == "8"


@pytest.mark.parametrize(
    "info, message",
    [
        ("not a dict", "must be the result"),
        (_info(cc="nine"), "compute_capability"),
        (_info(cc="9"), "two|2 dotted"),
        (_info(driver="r580"), "driver_version"),
        (_info(cuda="x.y"), "cuda_driver_version"),
        ({"gpus": [{"name": "x", "compute_capability": "9.0"}]}, "memory_total_mib"),
    ],
)
def test_bad_input_fails_with_one_sentence(info, message):
    with pytest.raises(AnsibleFilterError, match=message):
        gpu_labels(info)


def test_filter_is_registered():
    assert FilterModule().filters()["gpu_labels"] is gpu_labels


def _with_pci(classes, mig_modes=None):
    info = _info(count=len(classes))
    for position, gpu in enumerate(info["gpus"]):
        gpu["pci_bus_id"] = f"0000:{0x18 + position:02x}:00.0"
        if mig_modes is not None:
            gpu["mig_mode"] = mig_modes[position]
    info["pci_devices"] = [
        {"bus_id": gpu["pci_bus_id"], "class": pci_class} for gpu, pci_class in zip(info["gpus"], classes) if pci_class
    ]
    return info


@pytest.mark.parametrize(
    "classes, mode",
    [
        (["0x030200", "0x030200"], "compute"),
        (["0x030000"], "graphics"),
        (["0x030000", "0x030200"], "unknown"),  # GFD: not all GPUs of one class
        (["0x030001"], "unknown"),  # neither class exactly
        (["0x030200", None], "unknown"),  # a GPU sysfs did not show
    ],
)
def test_gpu_mode_follows_the_pci_class_of_every_gpu(classes, mode):
    assert gpu_labels(_with_pci(classes))["nvidia.com/gpu.mode"] == mode


def test_no_gpu_mode_from_facts_that_read_no_pci_device():
    # NVML's answer on a machine whose sysfs shows no NVIDIA device (a lab node): nothing says which mode, and
    # validate.yml, which reads NVML, must not want "unknown" where site.yml's facts said "compute".
    info = _with_pci(["0x030200"])
    info["pci_devices"] = []
    assert "nvidia.com/gpu.mode" not in gpu_labels(info)


@pytest.mark.parametrize(
    "modes, capable",
    [
        (["unsupported", "unsupported"], "false"),
        (["disabled", "unsupported"], "true"),
        (["enabled"], "true"),
    ],
)
def test_mig_capable_when_any_gpu_answers_for_its_mig_mode(modes, capable):
    assert gpu_labels(_with_pci(["0x030200"] * len(modes), modes))["nvidia.com/mig.capable"] == capable


def test_mig_capable_is_left_out_when_the_facts_do_not_say():
    assert "nvidia.com/mig.capable" not in gpu_labels(_info())


# MIG strategy labels, with the values GPU Feature Discovery v0.19.0 writes (internal/lm/mig-strategy.go and
# resource.go; tests/integration/test_gfd_labels_compared.py compares them with GFD itself on the mock library).
def _mig(uuid, profile, memory, sms=14, gi=1, ci=1, ce=1, dec=0, enc=0, jpeg=0, ofa=0):
    return {
        "uuid": uuid,
        "profile": profile,
        "memory_mib": memory,
        "multiprocessors": sms,
        "gpu_instance_slices": gi,
        "compute_instance_slices": ci,
        "copy_engines": ce,
        "decoders": dec,
        "encoders": enc,
        "jpeg_engines": jpeg,
        "ofa_engines": ofa,
    }


def _mig_gpu(index, devices, name="NVIDIA A100-SXM4-40GB", cc="8.0"):
    return dict(_gpu(index, name, "enabled", cc=cc), mig_devices=devices)


A100_MIXED = {
    "gpus": [
        _mig_gpu(0, [_mig("MIG-a", "3g.20gb", 19968, 42, 3, 3, 3, 2), _mig("MIG-b", "1g.5gb", 4864)]),
        _mig_gpu(1, [_mig("MIG-c", "1g.5gb", 4864), _mig("MIG-d", "1g.5gb+me", 4864, jpeg=1, ofa=1, dec=1)]),
        _gpu(2, "NVIDIA A100-SXM4-40GB"),
    ]
}


def _mig_labels(labels):
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig-") or k == "nvidia.com/mig.strategy"}


def test_no_mig_strategy_adds_no_mig_labels():
    for strategy in (None, "none"):
        assert _mig_labels(gpu_labels(A100_MIXED, mig_strategy=strategy)) == {}


def test_mixed_labels_each_mig_profile_as_gfd_does():
    labels = gpu_labels(A100_MIXED, mig_strategy="mixed")
    mig = _mig_labels(labels)
    assert mig["nvidia.com/mig.strategy"] == "mixed"
    assert {k: v for k, v in mig.items() if k.startswith("nvidia.com/mig-3g.20gb.")} == {
        "nvidia.com/mig-3g.20gb.count": "1",
        "nvidia.com/mig-3g.20gb.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb",
        "nvidia.com/mig-3g.20gb.replicas": "1",
        "nvidia.com/mig-3g.20gb.sharing-strategy": "none",
        "nvidia.com/mig-3g.20gb.memory": "19968",
        "nvidia.com/mig-3g.20gb.multiprocessors": "42",
        "nvidia.com/mig-3g.20gb.slices.gi": "3",
        "nvidia.com/mig-3g.20gb.slices.ci": "3",
        "nvidia.com/mig-3g.20gb.engines.copy": "3",
        "nvidia.com/mig-3g.20gb.engines.decoder": "2",
        "nvidia.com/mig-3g.20gb.engines.encoder": "0",
        "nvidia.com/mig-3g.20gb.engines.jpeg": "0",
        "nvidia.com/mig-3g.20gb.engines.ofa": "0",
    }
    # Counted over every GPU; a "+" in a profile's name becomes "." in the label and the product.
    assert mig["nvidia.com/mig-1g.5gb.count"] == "2"
    assert mig["nvidia.com/mig-1g.5gb.me.count"] == "1"
    assert mig["nvidia.com/mig-1g.5gb.me.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb.me"
    assert mig["nvidia.com/mig-1g.5gb.me.engines.ofa"] == "1"
    assert len(mig) == 1 + 3 * 13
    # The whole GPUs keep their labels: GPU 2 is described.
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.count"]) == ("NVIDIA-A100-SXM4-40GB", "3")


def test_mixed_mig_resources_are_not_time_sliced_by_the_gpu_rule_but_by_their_own():
    mig = _mig_labels(gpu_labels(A100_MIXED, sharing=TIME_SLICED, mig_strategy="mixed"))
    assert (mig["nvidia.com/mig-1g.5gb.replicas"], mig["nvidia.com/mig-1g.5gb.sharing-strategy"]) == ("1", "none")
    own = {"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 2}]}}
    mig = _mig_labels(gpu_labels(A100_MIXED, sharing=own, mig_strategy="mixed"))
    assert mig["nvidia.com/mig-1g.5gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED"
    assert (mig["nvidia.com/mig-1g.5gb.replicas"], mig["nvidia.com/mig-1g.5gb.sharing-strategy"]) == (
        "2",
        "time-slicing",
    )


def test_mixed_without_mig_devices_is_the_strategy_label_alone():
    assert _mig_labels(gpu_labels(_info(count=2), mig_strategy="mixed")) == {"nvidia.com/mig.strategy": "mixed"}


H100 = "NVIDIA H100 80GB HBM3"
H100_SINGLE = {
    "gpus": [
        _mig_gpu(i, [_mig(f"MIG-{i}-{j}", "1g.10gb", 9984, 16, dec=1, jpeg=1) for j in range(7)], H100, "9.0")
        for i in range(2)
    ]
}


def test_single_describes_the_mig_devices_as_the_nodes_gpus():
    labels = gpu_labels(H100_SINGLE, mig_strategy="single")
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert not [k for k in labels if k.startswith("nvidia.com/mig-")]
    gpu = {k: v for k, v in labels.items() if k.startswith("nvidia.com/gpu.")}
    assert gpu == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        "nvidia.com/gpu.count": "14",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "9984",
        "nvidia.com/gpu.multiprocessors": "16",
        "nvidia.com/gpu.slices.gi": "1",
        "nvidia.com/gpu.slices.ci": "1",
        "nvidia.com/gpu.engines.copy": "1",
        "nvidia.com/gpu.engines.decoder": "1",
        "nvidia.com/gpu.engines.encoder": "0",
        "nvidia.com/gpu.engines.jpeg": "1",
        "nvidia.com/gpu.engines.ofa": "0",
        # The whole GPU's architecture stays.
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
    }


def test_single_mig_devices_are_time_sliced_as_the_nodes_gpus():
    labels = gpu_labels(H100_SINGLE, sharing=TIME_SLICED, mig_strategy="single")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED"
    assert (labels["nvidia.com/gpu.replicas"], labels["nvidia.com/gpu.sharing-strategy"]) == ("4", "time-slicing")


INVALID_SINGLE = {
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
    "nvidia.com/gpu.count": "0",
    "nvidia.com/gpu.replicas": "0",
    "nvidia.com/gpu.sharing-strategy": "",
    "nvidia.com/gpu.memory": "0",
}


@pytest.mark.parametrize(
    "gpus",
    [
        # A GPU not in MIG mode beside one in MIG mode.
        [_mig_gpu(0, [_mig("MIG-a", "1g.5gb", 4864)]), _gpu(1, "NVIDIA A100-SXM4-40GB")],
        # A GPU in MIG mode without MIG devices.
        [_mig_gpu(0, [_mig("MIG-a", "1g.5gb", 4864)]), _mig_gpu(1, [])],
        # Two profiles.
        [_mig_gpu(0, [_mig("MIG-a", "1g.5gb", 4864), _mig("MIG-b", "2g.10gb", 9856, 28, 2, 2, 2, 1)])],
    ],
    ids=["a-whole-gpu", "an-empty-gpu", "two-profiles"],
)
def test_single_on_a_node_that_is_not_one_profile_is_gfds_invalid(gpus):
    labels = gpu_labels({"gpus": gpus}, sharing=TIME_SLICED, mig_strategy="single")
    assert {k: labels[k] for k in INVALID_SINGLE} == INVALID_SINGLE
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert not [k for k in labels if k.startswith(("nvidia.com/gpu.multiprocessors", "nvidia.com/gpu.slices"))]


def test_single_without_gpus_in_mig_mode_is_the_strategy_label_and_the_whole_gpus():
    labels = gpu_labels(_info(count=2), mig_strategy="single")
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.count"]) == ("NVIDIA-H100-80GB-HBM3", "2")


def test_mig_labels_from_facts_without_the_attributes_have_what_the_facts_say():
    info = {"gpus": [_mig_gpu(0, [{"uuid": "MIG-a", "profile": "1g.5gb", "memory_mib": 4864}])]}
    assert _mig_labels(gpu_labels(info, mig_strategy="mixed")) == {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-1g.5gb.count": "1",
        "nvidia.com/mig-1g.5gb.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/mig-1g.5gb.replicas": "1",
        "nvidia.com/mig-1g.5gb.sharing-strategy": "none",
        "nvidia.com/mig-1g.5gb.memory": "4864",
    }


def test_no_gpus_no_mig_strategy_label():
    assert gpu_labels({"gpus": []}, mig_strategy="mixed") == {}


@pytest.mark.parametrize(
    "info, strategy, message",
    [
        (_info(), "all", "mig_strategy must be one of none, single, mixed .* not 'all'"),
        (
            {"gpus": [_mig_gpu(0, [{"uuid": "MIG-a"}])]},
            "mixed",
            "a MIG device of GPU 0 .* has no profile or memory_mib",
        ),
    ],
)
def test_bad_mig_input_fails_with_one_sentence(info, strategy, message):
    with pytest.raises(AnsibleFilterError, match=message):
        gpu_labels(info, mig_strategy=strategy)
