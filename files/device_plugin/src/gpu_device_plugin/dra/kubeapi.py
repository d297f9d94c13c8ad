"""The DRA API side's client of the API server: ResourceClaims, ResourceSlices and the Node.

Built on the `kubernetes` client, used for its configuration loading, authentication and transport
only: objects go back and forth as JSON (the CustomObjects calls serve any group), so the daemon
speaks the `resource.k8s.io` versions the server has whatever typed models the installed client
release carries. The version is probed once (`v1`, else `v1beta2`, else `v1beta1`); callers always
see and give the `v1` shape, this module translates where v1beta1 differs (a device's fields under
`basic`, a request's fields not under `exactly`).

Every failure is a `KubeApiError` (an `OSError`) whose message is one sentence: what was asked,
which object, and what the server or the connection said."""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any, Mapping, Optional

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")  # in order of preference
CONFLICT_ATTEMPTS = 5  # a condition write refused because the Node changed under it is tried this often
# The fields of a v1beta1 DeviceRequest that v1beta2 and v1 moved under `exactly`.
_EXACT_REQUEST_FIELDS = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)


class KubeApiError(OSError):
    """The API server could not be asked, or refused; `status` is the HTTP status when it answered."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status

    def __str__(self) -> str:
        return str(self.args[0])


def _server_message(body: Any) -> str:
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            status = json.loads(body)
        except ValueError:
            return body.strip()[:300]
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"]).strip().rstrip(".")
    return ""


class KubeApi:
    """One API server, one identity. `kubeconfig`: a kubeconfig file (the node's kubelet.conf under
    systemd); None: the in-cluster ServiceAccount (a DaemonSet). `timeout`: seconds per request."""

    def __init__(self, kubeconfig: Optional[str] = None, timeout: float = 10.0) -> None:
        from kubernetes import client, config  # imported here: only the dra mode needs the client

        configuration = client.Configuration()
        try:
            if kubeconfig:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=kubeconfig, client_configuration=configuration, persist_config=False
                )
            else:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
            where = f"the kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster ServiceAccount credentials"
            raise KubeApiError(f"cannot load {where}: {str(exc).strip() or type(exc).__name__}.") from None
        # Fail fast when the server is down: the callers retry on their own schedule.
        configuration.retries = 1
        self.server = str(configuration.host)
        self.timeout = timeout
        self._api_client = client.ApiClient(configuration)
        self._custom = client.CustomObjectsApi(self._api_client)
        self._core = client.CoreV1Api(self._api_client)
        self._version: Optional[str] = None

    def close(self) -> None:
        self._api_client.close()  # type: ignore[no-untyped-call]

    # -- plumbing --------------------------------------------------------------------------------
    def _call(self, what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one client call; a 404 comes back as None, any other failure as a KubeApiError."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return function(*args, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                return None
            message = _server_message(exc.body)
            detail = f": {message}" if message else ""
            raise KubeApiError(
                f"cannot {what}: the API server answered {exc.status} {exc.reason}{detail}.", exc.status
            ) from None
        except (HTTPError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise KubeApiError(
                f"cannot {what}: the API server at {self.server} cannot be reached ({reason})."
            ) from None

    @property
    def version(self) -> str:
        """The resource.k8s.io version in use (probed on first use)."""
        if self._version is None:
            self._version = self.probe()
        return self._version

    def probe(self) -> str:
        """Which resource.k8s.io version the server serves with ResourceSlices: v1, else v1beta2, else
        v1beta1. Raises KubeApiError when it serves none (DRA is off) or cannot be asked."""
        for version in VERSIONS:
            found = self._call(
                f"discover {GROUP}/{version}", self._custom.get_api_resources, GROUP, version, _preload_content=False
            )
            if found is None:
                continue
            resources = json.loads(found.data).get("resources") or []
            if any(r.get("name") == "resourceslices" for r in resources):
                self._version = version
                log.info("DRA API version found", extra={"server": self.server, "version": f"{GROUP}/{version}"})
                return version
        raise KubeApiError(
            f"the API server at {self.server} serves none of {', '.join(GROUP + '/' + v for v in VERSIONS)}"
            " with ResourceSlices: Dynamic Resource Allocation is off there."
        )

    # -- objects ---------------------------------------------------------------------------------
    def get_resource_claim(self, namespace: str, name: str) -> Optional[Mapping[str, Any]]:
        """The ResourceClaim in the v1 shape, or None when it does not exist (the `ClaimReader`)."""
        version = self.version
        claim = self._call(
            f"get ResourceClaim {namespace}/{name}",
            self._custom.get_namespaced_custom_object,
            GROUP,
            version,
            namespace,
            "resourceclaims",
            name,
        )
        return None if claim is None else claim_to_v1(claim)

    def get_node(self, name: str) -> Optional[dict[str, Any]]:
        """The Node as JSON, or None when it does not exist."""
        response = self._call(f"get Node {name}", self._core.read_node, name, _preload_content=False)
        return None if response is None else dict(json.loads(response.data))

    def set_node_condition(self, node_name: str, condition: Mapping[str, Any]) -> bool:
        """Set one condition of the Node's status, leaving the others (the kubelet's) as they are; False when
        the Node already has it with the same status, reason and message.

        A JSON patch of the status subresource: it replaces the condition at the index it was read at,
        after a `test` that the index still holds that type, or appends it after a `test` that the
        conditions are still those it read, so that two writers never append it twice: the one that comes
        second is refused (422 or 409) and reads again, CONFLICT_ATTEMPTS times in all. (A strategic merge patch would
        merge by type too, but the client releases the daemon supports disagree on the content type they
        send for a dict.) The timestamps follow the kubelet's use: lastHeartbeatTime is the write,
        lastTransitionTime the last change of status."""
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                return self._set_node_condition(node_name, condition)
            except KubeApiError as exc:
                if exc.status not in (409, 422) or attempt == CONFLICT_ATTEMPTS:
                    raise
                log.info(
                    "the Node changed while its condition was written; reading it again",
                    extra={"node": node_name, "condition": condition["type"], "status": exc.status},
                )
        return False  # not reached: the last attempt returns or raises

    def _set_node_condition(self, node_name: str, condition: Mapping[str, Any]) -> bool:
        node = self.get_node(node_name)
        if node is None:
            raise KubeApiError(f"cannot set the condition {condition['type']} of Node {node_name}: it does not exist.")
        conditions = (node.get("status") or {}).get("conditions") or []
        position = next((i for i, c in enumerate(conditions) if c.get("type") == condition["type"]), None)
        current = conditions[position] if position is not None else {}
        if all(current.get(key) == condition.get(key) for key in ("status", "reason", "message")):
            return False
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        written = dict(condition, lastHeartbeatTime=now)
        same_status = current.get("status") == condition.get("status") and current.get("lastTransitionTime")
        written["lastTransitionTime"] = current["lastTransitionTime"] if same_status else now
        if position is None:
            if conditions:
                patch: list[dict[str, Any]] = [
                    {"op": "test", "path": "/status/conditions", "value": conditions},
                    {"op": "add", "path": "/status/conditions/-", "value": written},
                ]
            else:
                # No list yet (a Node no kubelet has written): JSON patch cannot test that a path is absent,
                # so the whole Node is tested unchanged, by its resourceVersion.
                version = (node.get("metadata") or {}).get("resourceVersion")
                patch = [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                    {"op": "add", "path": "/status/conditions", "value": [written]},
                ]
        else:
            path = f"/status/conditions/{position}"
            patch = [
                {"op": "test", "path": f"{path}/type", "value": condition["type"]},
                {"op": "replace", "path": path, "value": written},
            ]
        what = f"set the condition {condition['type']} of Node {node_name}"
        if self._call(what, self._core.patch_node_status, node_name, patch, _preload_content=False) is None:
            raise KubeApiError(f"cannot {what}: the Node no longer exists.", 404)
        return True

    def list_resource_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        """This node's slices of this driver, in the v1 shape. The field selector on spec.nodeName is
        also what the Node authorizer requires before it lets a node list slices."""
        found = self._call(
            f"list the ResourceSlices of node {node_name}",
            self._custom.list_cluster_custom_object,
            GROUP,
            self.version,
            "resourceslices",
            field_selector=f"spec.nodeName={node_name},spec.driver={driver}",
        )
        items = [] if found is None else found.get("items") or []
        return [slice_to_v1(item) for item in items]

    def create_resource_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        version = self.version
        created = self._call(
            f"create a ResourceSlice for node {body['spec'].get('nodeName')}",
            self._custom.create_cluster_custom_object,
            GROUP,
            version,
            "resourceslices",
            slice_from_v1(body, version),
        )
        if created is None:
            raise KubeApiError(f"cannot create a ResourceSlice: the API server does not know {GROUP}/{version}.", 404)
        return slice_to_v1(created)

    def update_resource_slice(self, body: Mapping[str, Any]) -> Optional[dict[str, Any]]:
        """Replace a slice (its metadata.resourceVersion guards against lost updates: a 409 is a
        KubeApiError with status 409); None when it no longer exists."""
        version = self.version
        name = body["metadata"]["name"]
        updated = self._call(
            f"update ResourceSlice {name}",
            self._custom.replace_cluster_custom_object,
            GROUP,
            version,
            "resourceslices",
            name,
            slice_from_v1(body, version),
        )
        return None if updated is None else slice_to_v1(updated)

    def delete_resource_slice(self, name: str) -> None:
        """Delete a slice; one that is already gone is not an error."""
        self._call(
            f"delete ResourceSlice {name}",
            self._custom.delete_cluster_custom_object,
            GROUP,
            self.version,
            "resourceslices",
            name,
        )


# -- the v1beta1 shape ---------------------------------------------------------------------------
def _with_api_version(obj: Mapping[str, Any], version: str) -> dict[str, Any]:
    copy = dict(obj)
    copy["apiVersion"] = f"{GROUP}/{version}"
    return copy


def slice_to_v1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceSlice as any served version gives it, in the v1 shape (v1beta2's is the same)."""
    copy = _with_api_version(obj, "v1")
    spec = dict(copy.get("spec") or {})
    devices = []
    for device in spec.get("devices") or []:
        flat = {k: v for k, v in device.items() if k != "basic"}
        flat.update(device.get("basic") or {})
        devices.append(flat)
    if "devices" in spec:
        spec["devices"] = devices
    copy["spec"] = spec
    return copy


def slice_from_v1(obj: Mapping[str, Any], version: str) -> dict[str, Any]:
    """A ResourceSlice in the v1 shape as `version` takes it: for v1beta1 each device's fields but its
    name go under `basic`."""
    copy = _with_api_version(obj, version)
    if version != "v1beta1":
        return copy
    spec = dict(copy["spec"])
    spec["devices"] = [
        {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}} for d in spec.get("devices") or []
    ]
    copy["spec"] = spec
    return copy


def claim_to_v1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceClaim as any served version gives it, in the v1 shape: v1beta1's requests carry the
    fields of an exact request themselves; v1 and v1beta2 put them under `exactly`. The status (the
    allocation results) has the same shape in every version."""
    copy = _with_api_version(obj, "v1")
    spec = copy.get("spec")
    if not isinstance(spec, dict):
        return copy
    devices = spec.get("devices")
    if not isinstance(devices, dict) or not isinstance(devices.get("requests"), list):
        return copy
    requests = devices["requests"]
    normalised = []
    for request in requests:
        if not isinstance(request, dict) or "exactly" in request or "firstAvailable" in request:
            normalised.append(request)
            continue
        exactly = {k: request[k] for k in _EXACT_REQUEST_FIELDS if k in request}
        rest = {k: v for k, v in request.items() if k not in _EXACT_REQUEST_FIELDS}
        normalised.append(dict(rest, exactly=exactly) if exactly else rest)
    copy["spec"] = dict(spec, devices=dict(devices, requests=normalised))
    return copy
