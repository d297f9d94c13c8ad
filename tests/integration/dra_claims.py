"""ResourceClaims allocated as the scheduler allocates them, for the tests and benchmarks that run an API server and
no scheduler (test_dra_api.py, bench/bench_dra_prepare.py, bench/bench_dra_compared.py): a DeviceClass of the
driver, a claim of it, the allocation written to the claim's status, and a pod on the node that uses the claim."""

from __future__ import annotations

from typing import Any

from kubernetes import client

GROUP = "resource.k8s.io"


def device_class(custom: client.CustomObjectsApi, name: str, driver: str) -> None:
    """A DeviceClass that selects every device of the driver."""
    custom.create_cluster_custom_object(
        GROUP,
        "v1",
        "deviceclasses",
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]},
        },
    )


def allocated_claim(
    custom: client.CustomObjectsApi,
    claim: tuple[str, str],
    device_class_name: str,
    pool: tuple[str, str],
    devices: list[str],
    selectors: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The claim (namespace, name) of one request `gpus` for len(devices) devices of the class (and the CEL
    selectors), allocated the devices of the pool (driver, node) as the scheduler writes it; the claim as stored."""
    namespace, name = claim
    driver, node = pool
    exactly: dict[str, Any] = {"deviceClassName": device_class_name, "count": len(devices)}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    created = custom.create_namespaced_custom_object(
        GROUP,
        "v1",
        namespace,
        "resourceclaims",
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
        },
    )
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    created["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpus", "driver": driver, "pool": node, "device": d} for d in devices]},
            "nodeSelector": {"nodeSelectorTerms": [term]},
        }
    }
    return custom.replace_namespaced_custom_object_status(GROUP, "v1", namespace, "resourceclaims", name, created)


def claim_pod(core: client.CoreV1Api, claim: tuple[str, str], pod: str, node: str) -> None:
    """A pod bound to the node that uses the claim (namespace, name): what lets the node read the claim."""
    namespace, name = claim
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": pod},
            "spec": {
                "nodeName": node,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            },
        },
    )
