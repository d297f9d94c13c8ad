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


def test_product_label_is_sanitized():
    assert gpu_labels(_info(name="NVIDIA RTX A6000 / Ada"))["nvidia.com/gpu.product"] == "NVIDIA-RTX-A6000---Ada"


def test_user_labels_added_and_win():
    labels = gpu_labels(
        _info(), {"accelerator": "nvidia-tesla-p100", "nvidia.com/gpu.family": "custom", "team/x": True}
    )
    assert labels["accelerator"] == "nvidia-tesla-p100"
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
