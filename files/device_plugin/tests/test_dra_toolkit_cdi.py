"""Claims handed over as the NVIDIA Container Toolkit's CDI devices too (dra/cdi.py): where the toolkit's spec
(`nvidia-ctk cdi generate`, kind nvidia.com/gpu) names every device of a claim, each device's CDI IDs are ours and
the toolkit's, and NVIDIA_VISIBLE_DEVICES is `void`, so that a container gets the devices of the requests it names
and no more; where it does not, the claim-wide variable as before. Over real unix-socket gRPC, as test_dra_plugin."""

from __future__ import annotations

import json
import logging
import os

from api_server_double import DRIVER
from harness import H100

UID = "5e1f0000-0000-4000-8000-0000000000c1"
OURS = "gpuops.k8s/gpu=" + UID + "-{}"


def write_toolkit_spec(directory: str, names: list[str], kind: str = "nvidia.com/gpu", file: str = "nvidia.yaml"):
    """A spec in the shape nvidia-ctk writes: devices by index and by UUID, `all`, and common edits."""
    lines = ["---", "cdiVersion: 0.5.0", "containerEdits:", "  env:", "  - NVIDIA_VISIBLE_DEVICES=void", "devices:"]
    for name in names:
        lines += [f"- name: {json.dumps(name)}", "  containerEdits:", "    deviceNodes:", "    - path: /dev/nvidia0"]
    lines += ["- name: all", "  containerEdits:", "    deviceNodes:", "    - path: /dev/nvidia0", f"kind: {kind}", ""]
    path = os.path.join(directory, file)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    return path


def ids(answer) -> list[list[str]]:
    return [list(d.cdi_device_ids) for d in answer.devices]


def test_devices_the_toolkit_names_are_handed_over_as_its_devices_and_the_variable_is_void(dra):
    write_toolkit_spec(dra.cdi, [str(i) for i in range(8)] + H100)
    dra.start()
    claim = dra.allocate("pair", UID, ["gpu-3", "gpu-5"])
    answer = dra.kubelet.prepare(DRIVER, [claim])[UID]
    assert answer.error == ""
    assert ids(answer) == [
        [OURS.format("gpu-3"), f"nvidia.com/gpu={H100[3]}"],
        [OURS.format("gpu-5"), f"nvidia.com/gpu={H100[5]}"],
    ]
    spec = dra.spec_of(UID)
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    described = json.loads(spec["annotations"]["gpuops.k8s/devices"])
    assert [d["toolkit"] for d in described] == [f"nvidia.com/gpu={H100[3]}", f"nvidia.com/gpu={H100[5]}"]
    with open(dra.checkpoint, encoding="utf-8") as handle:
        recorded = json.load(handle)["claims"][UID]["devices"]
    assert [d["toolkit"] for d in recorded] == [f"nvidia.com/gpu={H100[3]}", f"nvidia.com/gpu={H100[5]}"]
    # Asked again: the same answer, from the checkpoint.
    assert ids(dra.kubelet.prepare(DRIVER, [claim])[UID]) == ids(answer)


def test_the_choice_outlives_a_lost_checkpoint_and_a_reboot_that_empties_the_cdi_directory(dra):
    toolkit = write_toolkit_spec(dra.cdi, H100)
    dra.start()
    claim = dra.allocate("kept", UID, ["gpu-1", "gpu-2"])
    first = ids(dra.kubelet.prepare(DRIVER, [claim])[UID])
    dra.stop_daemons()
    os.unlink(dra.checkpoint)
    with open(dra.checkpoint, "w") as handle:
        handle.write("{not json")  # rebuilt from our spec, which records the toolkit's devices
    dra.start()
    assert ids(dra.kubelet.prepare(DRIVER, [claim])[UID]) == first
    dra.stop_daemons()
    # A reboot: /var/run/cdi is empty, the toolkit's refresh has not run yet. Our spec is written again as it was.
    os.unlink(toolkit)
    os.unlink(os.path.join(dra.cdi, f"gpuops.k8s-gpu_{UID}.json"))
    dra.start()
    assert dra.spec_of(UID)["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert ids(dra.kubelet.prepare(DRIVER, [claim])[UID]) == first


def test_a_claim_the_toolkit_does_not_wholly_name_keeps_the_claim_wide_variable(dra, caplog):
    # Written before gpu-5 was there, and a spec of another kind that names every UUID: neither will do.
    write_toolkit_spec(dra.cdi, [H100[3]])
    write_toolkit_spec(dra.cdi, H100, kind="example.com/gpu", file="other.yaml")
    with open(os.path.join(dra.cdi, "broken.yaml"), "w") as handle:
        handle.write("kind: nvidia.com/gpu\ndevices: [\n")
    dra.start()
    claim = dra.allocate("wide", UID, ["gpu-3", "gpu-5"])
    with caplog.at_level(logging.WARNING, logger="gpu_device_plugin"):
        answer = dra.kubelet.prepare(DRIVER, [claim])[UID]
    assert answer.error == ""
    assert ids(answer) == [[OURS.format("gpu-3")], [OURS.format("gpu-5")]]
    assert dra.spec_of(UID)["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={H100[3]},{H100[5]}"]
    assert any("does not name every device of the claim" in r.getMessage() for r in caplog.records)
    with open(dra.checkpoint, encoding="utf-8") as handle:
        assert "toolkit" not in handle.read()
    # The toolkit's spec written again with both: the next claim is handed over as its devices.
    write_toolkit_spec(dra.cdi, [H100[3], H100[5], H100[6]])
    other = "5e1f0000-0000-4000-8000-0000000000c2"
    answer = dra.kubelet.prepare(DRIVER, [dra.allocate("next", other, ["gpu-6"])])[other]
    assert ids(answer) == [[f"gpuops.k8s/gpu={other}-gpu-6", f"nvidia.com/gpu={H100[6]}"]]
