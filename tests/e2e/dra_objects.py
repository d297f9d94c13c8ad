"""The Kubernetes objects of a DRA GPU workload on the lab, shared by tests/e2e/test_site_dra.py and
bench/bench_dra_pods.py: pods that ask for GPUs through a ResourceClaimTemplate or as nvidia.com/gpu, and
claim templates with a CEL selector on memory. Pods run on containerd's default runtime, the nvidia runtime in
CDI mode."""

from __future__ import annotations

from typing import Any

from conftest import PAUSE_IMAGE, Lab
from kubernetes import client

GPU = "nvidia.com/gpu"
DRIVER = "gpu.gpuops.k8s"
DEVICE_CLASS = "gpu.gpuops.k8s"
RESOURCE = ("resource.k8s.io", "v1")


def pod_manifest(name: str, node: str, *, claim_template: str | None = None, gpus: int = 0) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "gpu", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}
    spec: dict[str, Any] = {
        # Scheduled, not bound by name: the scheduler allocates the claims.
        "nodeSelector": {"kubernetes.io/hostname": node},
        "automountServiceAccountToken": False,
        "dnsPolicy": "Default",
        "terminationGracePeriodSeconds": 1,
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
    }
    if claim_template:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": claim_template}]
        container["resources"] = {"claims": [{"name": "gpus"}]}
    if gpus:
        container["resources"] = {"limits": {GPU: str(gpus)}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def claim_template(name: str, count: int, memory_at_least: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {
                                "deviceClassName": DEVICE_CLASS,
                                "allocationMode": "ExactCount",
                                "count": count,
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": f'device.capacity["{DRIVER}"].memory'
                                            f'.compareTo(quantity("{memory_at_least}")) >= 0'
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }


def slices(lab: Lab, node: str) -> list[dict[str, Any]]:
    """The node's ResourceSlices of our driver."""
    return client.CustomObjectsApi(lab.api).list_cluster_custom_object(
        *RESOURCE, "resourceslices", field_selector=f"spec.nodeName={node},spec.driver={DRIVER}"
    )["items"]


def published(lab: Lab, node: str) -> dict[str, dict[str, Any]]:
    """Device name -> device, over the node's slices of our driver."""
    return {d["name"]: d for s in slices(lab, node) for d in s["spec"].get("devices", [])}
