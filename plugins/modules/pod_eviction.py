#!/usr/bin/python
# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
module: pod_eviction
short_description: Evict pods through the Kubernetes Eviction API and wait until they are gone
version_added: 0.1.0
description:
  - Evicts each pod it is given through the C(policy/v1) Eviction API, the way C(kubectl drain) does, so that
    PodDisruptionBudgets are honoured. An eviction a budget refuses (HTTP 429) is asked again until O(timeout);
    the pods a budget does not hold are evicted in the meantime.
  - Then waits until every evicted pod is gone, or replaced by a pod of the same name with another UID (what a
    StatefulSet does). The eviction only asks for the deletion; the pod is gone once its kubelet has stopped it.
  - A pod that does not exist, or exists under another UID than the one given, is already gone, which is no
    change. A pod already being deleted is waited for but not evicted again.
  - DaemonSet pods and static pods (the API server's mirror pods) are left where they are and listed in RV(kept),
    as C(kubectl drain) leaves them, since their DaemonSet or their kubelet would put them straight back.
  - An eviction answered with HTTP 409 (a conflict) counts as gone only where the pod, read again, is gone or has
    another UID; otherwise it is asked again until O(timeout).
  - The role M(gpuops.k8s.nvidia_mig) runs it for the pods that C(gpu-device-plugin gpu-pods) finds on the GPUs
    whose MIG layout changes.
  - Credentials as M(kubernetes.core.k8s) takes them, including its C(K8S_AUTH_*) environment variables.
author:
  - gpuops.k8s maintainers (@gpuops)
options:
  pods:
    description:
      - The pods to evict. The C(pods) that C(gpu-device-plugin gpu-pods) prints can be given as they are.
    type: list
    elements: dict
    required: true
    suboptions:
      namespace:
        description: The pod's namespace.
        type: str
        required: true
      name:
        description: The pod's name.
        type: str
        required: true
      uid:
        description:
          - The UID of the pod meant. A pod of that name with another UID is not evicted and counts as gone.
          - Unset, the pod of that name found when the module starts is the one evicted and waited for.
        type: str
      containers:
        description: Not used; accepted so that the output of C(gpu-device-plugin gpu-pods) can be given as it is.
        type: list
        elements: str
      gpus:
        description: Not used; accepted so that the output of C(gpu-device-plugin gpu-pods) can be given as it is.
        type: list
        elements: str
      claims:
        description: Not used; accepted so that the output of C(gpu-device-plugin gpu-pods) can be given as it is.
        type: list
        elements: dict
  timeout:
    description:
      - Seconds to get every pod evicted and gone, the retries of refused evictions included. When they run out the
        module fails, naming each pod not yet evicted (with the disruption budget's reason) or not yet gone.
    type: int
    default: 300
  grace_period:
    description:
      - The pods' termination grace period in seconds, instead of their own C(terminationGracePeriodSeconds).
      - C(0) deletes a pod at once, without waiting for its kubelet to stop its containers.
    type: int
extends_documentation_fragment:
  - gpuops.k8s.k8s_connection
attributes:
  check_mode:
    support: full
    description: Reads the pods and reports which it would evict; evicts nothing and does not wait.
  diff_mode:
    support: none
    description: The change is the pods' deletion, which RV(evicted) lists.
notes:
  - Retries of a refused eviction follow the API server's C(Retry-After) header, 5 seconds when it sends none, and
    at most 10 seconds apart.
  - A pod with more than one PodDisruptionBudget cannot be evicted (the API server refuses it with HTTP 500);
    the module fails at once naming it.
"""

EXAMPLES = r"""
- name: Find the pods on the GPUs whose MIG layout changes
  ansible.builtin.command:
    argv: [/opt/gpuops/device-plugin/venv/bin/gpu-device-plugin, gpu-pods, --gpu, "{{ gpu_uuid }}"]
  register: gpu_pods
  changed_when: false

- name: Evict them and wait until they are gone
  gpuops.k8s.pod_eviction:
    kubeconfig: /etc/kubernetes/admin.conf
    pods: "{{ (gpu_pods.stdout | from_json).pods }}"
    timeout: 600
  delegate_to: localhost

- name: Evict one pod at once, without a grace period
  gpuops.k8s.pod_eviction:
    pods:
      - {namespace: ml, name: train-0}
    grace_period: 0
"""

RETURN = r"""
evicted:
  description:
    - The pods this run evicted (in check mode, the ones it would evict), each with the UID it had.
  returned: always
  type: list
  elements: dict
  sample: [{namespace: ml, name: train-0, uid: 6a8c3f5e-4f0b-4c4e-9a57-2b1f0c8e7d11}]
already_gone:
  description: The requested pods that did not exist, or existed under another UID, when the module came to them.
  returned: always
  type: list
  elements: dict
  sample: [{namespace: ml, name: train-1}]
terminating:
  description: The requested pods that were already being deleted; the module waited for them without evicting them.
  returned: always
  type: list
  elements: dict
kept:
  description:
    - The requested pods left where they are, each with its C(reason), C(DaemonSet) (a DaemonSet's pod) or
      C(mirror) (a static pod of the node's kubelet).
  returned: always
  type: list
  elements: dict
  sample: [{namespace: kube-system, name: gpu-exporter-x7k2p, reason: DaemonSet}]
refused:
  description:
    - How many times the API server refused to evict a pod (HTTP 429, a PodDisruptionBudget), per C(namespace/name).
  returned: always
  type: dict
  sample: {ml/train-0: 2}
"""

import json
import time
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_connection import CONNECTION_ARGUMENT_SPEC, api_client
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import run_or_fail
from ansible_collections.gpuops.k8s.plugins.module_utils._pod_eviction import EvictionError, evict_pods

try:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.client.exceptions import ApiException
    from urllib3 import exceptions as urllib3_exceptions

    KUBERNETES_IMPORT_ERROR = None
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()


# The annotation the kubelet gives the API server's copy of a static pod.
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


class PodApi:
    """The two calls evict_pods makes, on the kubernetes client's CoreV1Api: each answers in plain data."""

    def __init__(self, client):
        self._core = k8s_client.CoreV1Api(client)

    def read_pod(self, namespace, name):
        """(uid, being deleted, why it is kept: None, 'DaemonSet' or 'mirror') of the pod, or None when there is
        none."""
        try:
            pod = self._core.read_namespaced_pod(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise EvictionError(f"cannot read the pod {namespace}/{name}: {_status_text(error)}") from None
        kept = None
        if any(owner.kind == "DaemonSet" for owner in pod.metadata.owner_references or []):
            kept = "DaemonSet"
        elif MIRROR_ANNOTATION in (pod.metadata.annotations or {}):
            kept = "mirror"
        return pod.metadata.uid, pod.metadata.deletion_timestamp is not None, kept

    def evict(self, namespace, name, uid, grace_period):
        """('evicted' | 'gone' | 'refused' | 'conflict', the API server's reason, seconds it asks to wait before
        asking again)."""
        options = {"preconditions": {"uid": uid}}
        if grace_period is not None:
            options["gracePeriodSeconds"] = grace_period
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": options,
        }
        try:
            # The answer is a Status, not an Eviction: it is not read.
            self._core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False)
        except ApiException as error:
            if error.status == 429:
                return "refused", _status_text(error), _retry_after(error)
            if error.status == 404:
                return "gone", _status_text(error), None
            if error.status == 409:  # the UID precondition failed, or a conflict: evict_pods reads the pod again
                return "conflict", _status_text(error), None
            raise EvictionError(f"the API server refused to evict {namespace}/{name}: {_status_text(error)}") from None
        return "evicted", "", None


def _status_text(error):
    """One sentence from an API error: the Status message and its causes (a disruption budget's reason)."""
    try:
        status = json.loads(error.body or "{}")
    except (TypeError, ValueError):
        status = {}
    parts = [str(status.get("message") or error.reason or f"HTTP {error.status}").strip()]
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("message"):
            parts.append(str(cause["message"]).strip())
    return " ".join(" ".join(parts).split())


def _retry_after(error):
    try:
        return float((error.headers or {}).get("Retry-After"))
    except (TypeError, ValueError):
        return None


ARGUMENT_SPEC = {
    "pods": {
        "type": "list",
        "elements": "dict",
        "required": True,
        "options": {
            "namespace": {"type": "str", "required": True},
            "name": {"type": "str", "required": True},
            "uid": {"type": "str"},
            "containers": {"type": "list", "elements": "str"},
            "gpus": {"type": "list", "elements": "str"},
            "claims": {"type": "list", "elements": "dict"},
        },
    },
    "timeout": {"type": "int", "default": 300},
    "grace_period": {"type": "int"},
    **CONNECTION_ARGUMENT_SPEC,
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_or_fail(module, "pod_eviction", run_module)


def run_module(module):
    """Check the options, evict, and answer with what changed."""
    if KUBERNETES_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    params = module.params
    if params["timeout"] < 0:
        module.fail_json(msg=f"pod_eviction: timeout must be 0 or more seconds, got {params['timeout']}.")
    if params["grace_period"] is not None and params["grace_period"] < 0:
        module.fail_json(msg=f"pod_eviction: grace_period must be 0 or more seconds, got {params['grace_period']}.")
    result = {"evicted": [], "already_gone": [], "terminating": [], "kept": [], "refused": {}}
    try:
        evict_pods(
            PodApi(api_client(params)),
            [{"namespace": p["namespace"], "name": p["name"], "uid": p["uid"]} for p in params["pods"]],
            result,
            timeout=params["timeout"],
            grace_period=params["grace_period"],
            check_mode=module.check_mode,
            clock=time.monotonic,
            sleep=time.sleep,
        )
    except EvictionError as error:
        module.fail_json(msg=f"pod_eviction: {error}", changed=bool(result["evicted"]), **result)
    except (k8s_config.ConfigException, OSError) as error:
        module.fail_json(msg=f"pod_eviction: cannot set up the Kubernetes client: {error}", **result)
    except urllib3_exceptions.HTTPError as error:  # no connection, TLS, retries exhausted
        module.fail_json(msg=f"pod_eviction: cannot reach the Kubernetes API: {error}", **result)
    module.exit_json(changed=bool(result["evicted"]), **result)


if __name__ == "__main__":
    main()
