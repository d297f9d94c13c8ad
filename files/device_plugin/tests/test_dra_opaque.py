"""NVIDIA's opaque device configuration (resource.nvidia.com/v1beta1 GpuConfig, MigDeviceConfig) in a claim:
decoded strictly, matched to devices as NVIDIA's DRA driver matches them, time-slicing set through nvidia-smi
while the claim is prepared (a test double of nvidia-smi records what it is asked), MPS refused per claim.

The decoding cases follow NVIDIA's v0.5.0 API package (api/nvidia.com/resource/v1beta1: sharing.go,
validate.go, gpuconfig.go, migconfig.go) and its strict decoder (unknown fields refused)."""

from __future__ import annotations

import json
import os
import stat

import pytest
from api_server_double import DRIVER
from gpu_device_plugin.dra import opaque
from harness import H100, fixture, write_spec

API = "resource.nvidia.com/v1beta1"


def gpu_config(**sharing):
    return {"apiVersion": API, "kind": "GpuConfig", **({"sharing": sharing} if sharing else {})}


def entry(parameters, requests=(), source="FromClaim", driver=DRIVER):
    return {"source": source, "requests": list(requests), "opaque": {"driver": driver, "parameters": parameters}}


# -- decoding ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (gpu_config(), opaque.DeviceConfig("GpuConfig")),
        (gpu_config(strategy="TimeSlicing"), opaque.DeviceConfig("GpuConfig", "TimeSlicing", "Default")),
        (
            gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long"}),
            opaque.DeviceConfig("GpuConfig", "TimeSlicing", "Long"),
        ),
        (
            gpu_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 50}),
            opaque.DeviceConfig("GpuConfig", "MPS"),
        ),
        (
            {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}},
            opaque.DeviceConfig("MigDeviceConfig", "TimeSlicing"),
        ),
    ],
)
def test_nvidia_s_configurations_decode(parameters, expected):
    assert opaque.decode(parameters) == expected


@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        ({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}, "apiVersion resource.nvidia.com/v1, not"),
        ({"apiVersion": API, "kind": "GPUConfig"}, "kind GPUConfig, not GpuConfig or MigDeviceConfig"),
        ({"apiVersion": API, "kind": "VfioDeviceConfig"}, "a VfioDeviceConfig, which this driver does not serve"),
        ({**gpu_config(), "shraing": {}}, 'GpuConfig has the unknown field "shraing"'),
        (gpu_config(strategy="TimeSlicing", replicas=4), 'GpuConfig.sharing has the unknown field "replicas"'),
        (
            gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long", "x": 1}),
            'GpuConfig.sharing.timeSlicingConfig has the unknown field "x"',
        ),
        (gpu_config(strategy="Exclusive"), "strategy is Exclusive, not one of the strategies TimeSlicing or MPS"),
        (gpu_config(), None),
        (
            gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Longest"}),
            "interval is Longest, not one of",
        ),
        (gpu_config(strategy="TimeSlicing", mpsConfig={}), "cannot have an mpsConfig with the TimeSlicing strategy"),
        (gpu_config(strategy="MPS", timeSlicingConfig={}), "cannot have a timeSlicingConfig with the MPS strategy"),
        (gpu_config(strategy="MPS", mpsConfig={"threads": 5}), 'mpsConfig has the unknown field "threads"'),
        (gpu_config(strategy="MPS", mpsConfig={"multiUser": "yes"}), "mpsConfig.multiUser must be a bool"),
        (
            {
                "apiVersion": API,
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}},
            },
            'MigDeviceConfig.sharing has the unknown field "timeSlicingConfig"',
        ),
        ("GpuConfig", "must be an object"),
    ],
)
def test_what_nvidia_s_strict_decoder_refuses_is_refused_with_the_reason(parameters, reason):
    if reason is None:
        assert opaque.decode(parameters) == opaque.DeviceConfig("GpuConfig")
        return
    with pytest.raises(opaque.OpaqueError, match=reason):
        opaque.decode(parameters)


# -- which configuration applies to a device ---------------------------------------------------------
def test_the_claim_s_entries_come_after_the_class_s_and_a_later_one_wins():
    allocation = {
        "devices": {
            "config": [
                entry(gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Short"})),
                entry(gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Medium"}), source="FromClass"),
                entry({"anything": "for another driver"}, driver="gpu.example.com"),
                entry(gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long"}), requests=["ts"]),
            ]
        }
    }
    candidates = opaque.configs(allocation, DRIVER)
    assert [(c.source, c.interval, c.requests) for c in candidates] == [
        ("FromClass", "Medium", ()),
        ("FromClaim", "Short", ()),
        ("FromClaim", "Long", ("ts",)),
    ]
    assert opaque.config_for("gpu-0", "ts", False, candidates).interval == "Long"
    assert opaque.config_for("gpu-0", "ts/a100", False, candidates).interval == "Long"
    assert opaque.config_for("gpu-1", "other", False, candidates).interval == "Short"
    # A MIG device: no GpuConfig fits it and none names its request.
    assert opaque.config_for("gpu-0-mig-1g5gb-19-4", "other", True, candidates) is None


def test_an_entry_naming_a_request_must_fit_its_device():
    candidates = opaque.configs({"devices": {"config": [entry(gpu_config(), requests=["mig"])]}}, DRIVER)
    with pytest.raises(
        opaque.OpaqueError, match="a GpuConfig cannot apply to device gpu-0-mig-1g5gb-19-4, a MIG device"
    ):
        opaque.config_for("gpu-0-mig-1g5gb-19-4", "mig", True, candidates)


def test_entries_that_are_not_opaque_or_of_no_known_source_are_refused():
    with pytest.raises(opaque.OpaqueError, match="has no opaque parameters"):
        opaque.configs({"devices": {"config": [{"source": "FromClaim"}]}}, DRIVER)
    with pytest.raises(opaque.OpaqueError, match="has the source FromNode"):
        opaque.configs({"devices": {"config": [{**entry(gpu_config()), "source": "FromNode"}]}}, DRIVER)


# -- on a node ---------------------------------------------------------------------------------------
@pytest.fixture
def nvidia_smi(tmp_path):
    """A TEST DOUBLE of nvidia-smi: appends its arguments to a log, one JSON list per call; fails when the
    file `fail` exists beside it."""
    log = tmp_path / "nvidia-smi.log"
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'[ -e "{tmp_path}/fail" ] && {{ echo "Unable to set the time slice: Insufficient Permissions"; exit 4; }}\n'
        "python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\" >> " + str(log) + "\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)

    class Smi:
        path = str(script)

        @staticmethod
        def calls():
            if not log.exists():
                return []
            return [json.loads(line) for line in log.read_text().splitlines()]

        @staticmethod
        def fail():
            (tmp_path / "fail").write_text("")

    return Smi


def timeslice_calls(uuid, interval):
    return [["-i", uuid, "-c", "DEFAULT"], ["compute-policy", "-i", uuid, "--set-timeslice", str(interval)]]


def test_a_time_sliced_claim_sets_its_gpus_interval_and_unprepare_sets_it_back(dra, nvidia_smi):
    dra.start(nvidia_smi=nvidia_smi.path)
    config = [entry(gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long"}))]
    claim = dra.allocate("ts", "5e1f0000-0000-4000-8000-000000000081", ["gpu-2", "gpu-5"], config=config)
    assert dra.kubelet.prepare(DRIVER, [claim])[claim[2]].error == ""
    assert nvidia_smi.calls() == timeslice_calls(H100[2], 3) + timeslice_calls(H100[5], 3)
    with open(dra.checkpoint, encoding="utf-8") as handle:
        assert json.load(handle)["claims"][claim[2]]["timeSliced"] == sorted([H100[2], H100[5]])
    # Prepared again (the kubelet retries): answered from the checkpoint, nothing set twice.
    assert dra.kubelet.prepare(DRIVER, [claim])[claim[2]].error == ""
    assert len(nvidia_smi.calls()) == 4
    assert dra.kubelet.unprepare(DRIVER, [claim])[claim[2]] == ""
    assert nvidia_smi.calls()[4:] == timeslice_calls(H100[2], 0) + timeslice_calls(H100[5], 0)


def test_a_claim_without_sharing_calls_no_nvidia_smi(dra, nvidia_smi):
    dra.start(nvidia_smi=nvidia_smi.path)
    claim = dra.allocate("plain", "5e1f0000-0000-4000-8000-000000000082", ["gpu-1"], config=[entry(gpu_config())])
    assert dra.kubelet.prepare(DRIVER, [claim])[claim[2]].error == ""
    assert nvidia_smi.calls() == []
    with open(dra.checkpoint, encoding="utf-8") as handle:
        assert "timeSliced" not in json.load(handle)["claims"][claim[2]]


def test_mps_is_refused_per_claim_with_one_sentence_and_nothing_is_prepared(dra, nvidia_smi):
    dra.start(nvidia_smi=nvidia_smi.path)
    config = [entry(gpu_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 50}))]
    claim = dra.allocate("mps", "5e1f0000-0000-4000-8000-000000000083", ["gpu-0"], config=config)
    other = dra.allocate("ok", "5e1f0000-0000-4000-8000-000000000084", ["gpu-1"])
    answers = dra.kubelet.prepare(DRIVER, [claim, other])
    assert answers[claim[2]].error == (
        f"ResourceClaim default/mps (UID {claim[2]}) asks for MPS sharing of device gpu-0 (GpuConfig), which this"
        " driver does not provide; use the TimeSlicing strategy or no sharing."
    )
    assert answers[other[2]].error == ""
    assert dra.spec_of(claim[2]) is None and nvidia_smi.calls() == []


def test_an_unknown_field_refuses_the_claim_naming_it(dra, nvidia_smi):
    dra.start(nvidia_smi=nvidia_smi.path)
    config = [entry(gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long", "period": 5}))]
    claim = dra.allocate("typo", "5e1f0000-0000-4000-8000-000000000085", ["gpu-0"], config=config)
    error = dra.kubelet.prepare(DRIVER, [claim])[claim[2]].error
    assert error == (
        f"ResourceClaim default/typo (UID {claim[2]}) has a device configuration this driver cannot use: the device"
        ' configuration 0 (from the claim): GpuConfig.sharing.timeSlicingConfig has the unknown field "period" (it has'
        " interval)."
    )
    assert dra.spec_of(claim[2]) is None


def test_an_nvidia_smi_that_fails_leaves_the_claim_unprepared_and_says_why(dra, nvidia_smi):
    dra.start(nvidia_smi=nvidia_smi.path)
    nvidia_smi.fail()
    config = [entry(gpu_config(strategy="TimeSlicing"))]
    claim = dra.allocate("fails", "5e1f0000-0000-4000-8000-000000000086", ["gpu-4"], config=config)
    error = dra.kubelet.prepare(DRIVER, [claim])[claim[2]].error
    assert error.startswith(f"ResourceClaim default/fails (UID {claim[2]}) was not prepared: {nvidia_smi.path} -i")
    assert "Insufficient Permissions" in error
    assert dra.spec_of(claim[2]) is None
    if os.path.exists(dra.checkpoint):
        with open(dra.checkpoint, encoding="utf-8") as handle:
            assert claim[2] not in json.load(handle)["claims"]


def test_time_slicing_on_a_mig_device_is_accepted_and_sets_nothing(dra, nvidia_smi):
    write_spec(dra.spec, fixture("a100-mig.yaml"))
    dra.start(nvidia_smi=nvidia_smi.path)
    config = [entry({"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}})]
    claim = dra.allocate("mig", "5e1f0000-0000-4000-8000-000000000087", ["gpu-0-mig-1g5gb-19-4"], config=config)
    assert dra.kubelet.prepare(DRIVER, [claim])[claim[2]].error == ""
    assert nvidia_smi.calls() == []
