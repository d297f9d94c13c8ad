"""Pod start on the lab, DRA against the device plugin, side by side in one run: from the pod's create
call until the API server reports it Running, for
- a pod asking for 1 GPU as nvidia.com/gpu on a device-plugin node (the kubelet's Allocate),
- a pod asking for 1 GPU through a ResourceClaimTemplate on a DRA node (the ResourceClaim controller
  makes the claim, the scheduler allocates it, the kubelet has the daemon prepare it and containerd
  injects the CDI spec),
- a pod asking for nvidia.com/gpu: 1 on the DRA node (the DeviceClass's extended-resource mapping).
Rounds alternate the kinds so that load on the machine falls on all of them alike. Prints medians and
the DRA/device-plugin ratio (the target is at most 1.2); asserts nothing.

    python bench/bench_dra_pods.py [--rounds 15] [--keep]

Brings up a lab of two nodes (GPUOPS_LAB_INSTANCE picks it; one that is up with two nodes is used as it
is), runs site.yml with node 1 in dra mode and node 2 in device_plugin mode (both on the simulated
8 x H100 spec), and takes the lab down afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

import yaml
from conftest import Lab, run_lab
from dra_objects import GPU, RESOURCE, claim_template, pod_manifest
from kubernetes import client, config, watch
from playbook_run import lab_inventory, run_playbook


def lab_up(nodes: int) -> Lab:
    run_lab("up", str(nodes))
    kubeconfig = Path(run_lab("kubeconfig").strip())
    return Lab(
        kubeconfig=kubeconfig, nodes=run_lab("nodes").split(), api=config.new_client_from_config(str(kubeconfig))
    )


def converge(lab: Lab, work: Path) -> tuple[str, str]:
    """site.yml with node 1 in dra mode and node 2 in device_plugin mode; returns (dra node, dp node)."""
    dra_node, dp_node = lab.nodes[0], lab.nodes[1]
    inventory = lab_inventory(work / "inventory.yml")
    data = yaml.safe_load(inventory.read_text())
    hosts = data["all"]["children"]["gpu_nodes"]["hosts"]
    hosts[dra_node]["gpu_allocation_mode"] = "dra"
    hosts[dp_node]["gpu_allocation_mode"] = "device_plugin"
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    done = run_playbook("site.yml", inventory, limit=f"{dra_node},{dp_node}")
    if done.returncode != 0:
        sys.exit(f"site.yml failed:\n{done.summary()}")
    lab.wait_until(f"{GPU}=8 on {dp_node}", lambda: lab.allocatable(dp_node).get(GPU) == "8", timeout=120)
    return dra_node, dp_node


def time_pod(lab: Lab, manifest: dict[str, Any]) -> float:
    """Seconds from the create call until a watch on the pod sees it Running (a watch, not polling: the
    event arrives when the kubelet's status write does)."""
    name = manifest["metadata"]["name"]
    start = time.monotonic()
    created = lab.core.create_namespaced_pod("default", manifest)
    seconds = None
    stream = watch.Watch()
    for event in stream.stream(
        lab.core.list_namespaced_pod,
        "default",
        field_selector=f"metadata.name={name}",
        resource_version=created.metadata.resource_version,
        timeout_seconds=180,
    ):
        if event["object"].status.phase == "Running":
            seconds = time.monotonic() - start
            stream.stop()
    if seconds is None:
        sys.exit(f"pod {name} was not Running within 180 s")
    # A graceful delete (the pod's 1 s grace period): the kubelet keeps the pod object until its claims are
    # unprepared, so the next pod's claim cannot be handed a GPU still prepared for this one. A forced
    # delete (grace period 0) frees the claim at once; the daemon then refuses the GPU to the next claim
    # until the kubelet has unprepared it, and the kubelet retries that pod about 10 s later.
    lab.core.delete_namespaced_pod(name, "default")
    lab.wait_until(
        f"pod {name} gone",
        lambda: not [p for p in lab.core.list_namespaced_pod("default").items if p.metadata.name == name],
        timeout=120,
    )
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    args = parser.parse_args()

    lab = lab_up(2)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-dra-pods-{uuid.uuid4().hex[:6]}"
    work.mkdir(parents=True)
    try:
        dra_node, dp_node = converge(lab, work)
        if "runc" not in [rc.metadata.name for rc in client.NodeV1Api(lab.api).list_runtime_class().items]:
            client.NodeV1Api(lab.api).create_runtime_class(
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": "runc"},
                    "handler": "runc",
                }
            )
        template = f"bench-one-gpu-{uuid.uuid4().hex[:6]}"
        objects = client.CustomObjectsApi(lab.api)
        objects.create_namespaced_custom_object(
            *RESOURCE, "default", "resourceclaimtemplates", claim_template(template, 1, "40Gi")
        )
        kinds = {
            "device plugin, nvidia.com/gpu: 1": lambda n: pod_manifest(n, dp_node, gpus=1),
            "DRA, ResourceClaimTemplate (1 GPU)": lambda n: pod_manifest(n, dra_node, claim_template=template),
            "DRA, nvidia.com/gpu: 1 (extended resource)": lambda n: pod_manifest(n, dra_node, gpus=1),
        }
        times: dict[str, list[float]] = {k: [] for k in kinds}
        # One unmeasured pod of each kind first: image and sandbox caches are warm for every kind alike.
        for rnd in range(args.rounds + 1):
            for kind, make in kinds.items():
                seconds = time_pod(lab, make(f"bench-{rnd}-{uuid.uuid4().hex[:6]}"))
                if rnd > 0:
                    times[kind].append(seconds)
        objects.delete_namespaced_custom_object(*RESOURCE, "default", "resourceclaimtemplates", template)
    finally:
        if not args.keep:
            run_lab("down", timeout=300)

    load = os.getloadavg()
    base = statistics.median(times["device plugin, nvidia.com/gpu: 1"])
    print(f"\nPod create -> Running on the lab, {args.rounds} rounds (load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}):")
    print(f"{'pod':<45} {'median s':>9} {'min s':>7} {'max s':>7} {'x device plugin':>16}")
    for kind, values in times.items():
        median = statistics.median(values)
        print(f"{kind:<45} {median:>9.2f} {min(values):>7.2f} {max(values):>7.2f} {median / base:>16.2f}")
    print("target: a DRA pod starts within 1.2 x the device-plugin pod")
    return 0


if __name__ == "__main__":
    sys.exit(main())
