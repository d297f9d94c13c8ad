#!/usr/bin/python
# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
module: node_labels
short_description: GPU labels and the GPU taint on many Kubernetes Nodes with one LIST and one PATCH per change
version_added: 0.1.0
description:
  - Computes, for every node it is given, the labels GPU Feature Discovery would set from that node's
    M(gpuops.k8s.nvidia_gpu_info) result merged with the user's labels (as P(gpuops.k8s.gpu_labels#filter)
    does), and the change that brings the Node object there (as P(gpuops.k8s.node_label_patch#filter) does).
  - Reads every Node with one LIST and writes one JSON merge patch per Node that needs a change; a Node
    already right is not written.
  - Each patch carries the C(resourceVersion) of the Node it was computed from, so the API server refuses
    it when someone else wrote the Node in between; the module then reads that Node again, recomputes and
    writes again (up to O(conflict_retries) times). A label or taint written by someone else between the
    LIST and the PATCH is never lost.
  - The role M(gpuops.k8s.gpu_node_labels) runs it once per play batch.
  - Credentials as M(kubernetes.core.k8s) takes them, including its C(K8S_AUTH_*) environment variables.
requirements:
  - kubernetes (the Python client) on the host the module runs on
author:
  - gpuops.k8s maintainers (@gpuops)
options:
  nodes:
    description: The nodes to label, one entry per Node.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The Node's name.
        type: str
        required: true
      gpu_info:
        description:
          - The node's M(gpuops.k8s.nvidia_gpu_info) result.
          - C(gpus), C(driver_version) and C(cuda_driver_version) are read.
        type: dict
        default: {}
      user_labels:
        description: The user's own labels; they win over computed labels of the same key.
        type: dict
        default: {}
      sharing:
        description:
          - The C(sharing) section of the device plugin's config (NVIDIA's config, version v1) on this node, for
            C(nvidia.com/gpu.replicas), C(nvidia.com/gpu.sharing-strategy) and the C(-SHARED) product, as the
            P(gpuops.k8s.gpu_labels#filter) filter computes them.
        type: dict
        default: {}
      taint:
        description: Whether the node carries the GPU taint.
        type: bool
        default: true
      taint_key:
        description: Key of the GPU taint.
        type: str
        default: nvidia.com/gpu
      taint_value:
        description: Value of the GPU taint.
        type: str
        default: present
      taint_effect:
        description: Effect of the GPU taint.
        type: str
        default: NoSchedule
        choices: [NoSchedule, PreferNoSchedule, NoExecute]
  conflict_retries:
    description: How many times a write refused because the Node changed is redone from a fresh read.
    type: int
    default: 5
  kubeconfig:
    description:
      - Path to a kubeconfig. Without it (and without O(host)) the in-cluster service account is used when the
        module runs in a pod, else the default kubeconfig.
      - Falls back to the E(K8S_AUTH_KUBECONFIG) environment variable.
    type: path
  context:
    description: The kubeconfig context to use. Falls back to E(K8S_AUTH_CONTEXT).
    type: str
  host:
    description: The API server's URL. Falls back to E(K8S_AUTH_HOST).
    type: str
  api_key:
    description: A bearer token. Falls back to E(K8S_AUTH_API_KEY).
    type: str
  validate_certs:
    description:
      - Verify the API server's certificate. Unset leaves it to the kubeconfig.
      - Falls back to E(K8S_AUTH_VERIFY_SSL).
    type: bool
    aliases: [verify_ssl]
  ca_cert:
    description: The CA certificate that signed the API server's. Falls back to E(K8S_AUTH_SSL_CA_CERT).
    type: path
    aliases: [ssl_ca_cert]
  client_cert:
    description: A client certificate. Falls back to E(K8S_AUTH_CERT_FILE).
    type: path
    aliases: [cert_file]
  client_key:
    description: The client certificate's key. Falls back to E(K8S_AUTH_KEY_FILE).
    type: path
    aliases: [key_file]
attributes:
  check_mode:
    support: full
    description: Reads the Nodes and computes every change without writing anything.
  diff_mode:
    support: full
    description: Returns each changed Node's labels, the collection's annotations and taints before and after.
notes:
  - A node the API has no Node for, or whose labels cannot be computed, is listed in RV(missing) or
    RV(invalid) and does not stop the others; the role fails those hosts with a sentence each.
"""

EXAMPLES = r"""
- name: Label two nodes from their GPU facts
  gpuops.k8s.node_labels:
    kubeconfig: /etc/kubernetes/admin.conf
    nodes:
      - name: gpu-node-1
        gpu_info: "{{ hostvars['gpu-node-1'].gpu_info }}"
        user_labels: {accelerator: nvidia-h100}
      - name: gpu-node-2
        gpu_info: "{{ hostvars['gpu-node-2'].gpu_info }}"
        taint: false
"""

RETURN = r"""
nodes_changed:
  description:
    - Node name to the merge patch written (in check mode, the one that would be written), for changed nodes only.
  returned: always
  type: dict
missing:
  description: Names of requested nodes the API server has no Node object for.
  returned: always
  type: list
  elements: str
invalid:
  description: Node name to the sentence saying why its labels cannot be computed.
  returned: always
  type: dict
conflicts:
  description: How many writes the API server refused because the Node had changed, each redone from a fresh read.
  returned: always
  type: int
unchanged:
  description: How many requested nodes were already right.
  returned: always
  type: int
"""

import os
import traceback

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import run_or_fail
from ansible_collections.gpuops.k8s.plugins.module_utils._node_labels import Conflict, LabelError, label_batch

try:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ConflictError, DynamicApiError, NotFoundError
    from urllib3 import exceptions as urllib3_exceptions

    KUBERNETES_IMPORT_ERROR = None
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()

MERGE_PATCH = "application/merge-patch+json"


def _api_client(params):
    """A client configured the way kubernetes.core configures its own from the same options."""
    configuration = k8s_client.Configuration()
    if params["kubeconfig"]:
        k8s_config.load_kube_config(
            config_file=params["kubeconfig"], context=params["context"], client_configuration=configuration
        )
    elif not params["host"]:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not params["context"]:
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(context=params["context"], client_configuration=configuration)
    if params["host"]:
        configuration.host = params["host"]
    if params["api_key"]:
        configuration.api_key = {"authorization": params["api_key"]}
        configuration.api_key_prefix = {"authorization": "Bearer"}
    if params["validate_certs"] is not None:
        configuration.verify_ssl = params["validate_certs"]
    if params["ca_cert"]:
        configuration.ssl_ca_cert = params["ca_cert"]
    if params["client_cert"]:
        configuration.cert_file = params["client_cert"]
    if params["client_key"]:
        configuration.key_file = params["client_key"]
    return k8s_client.ApiClient(configuration)


class NodeApi:
    """The three calls label_batch makes, on the kubernetes client's dynamic client."""

    def __init__(self, api_client):
        self._nodes = DynamicClient(api_client).resources.get(api_version="v1", kind="Node")

    def list_nodes(self):
        return self._nodes.get().to_dict().get("items") or []

    def read_node(self, name):
        try:
            return self._nodes.get(name=name).to_dict()
        except NotFoundError:
            return None

    def patch_node(self, name, patch):
        try:
            return self._nodes.patch(name=name, body=patch, content_type=MERGE_PATCH).to_dict()
        except ConflictError:
            raise Conflict(name) from None


def _api_error(error):
    """One sentence from a Kubernetes API error."""
    reason = getattr(error, "summary", None)
    text = reason() if callable(reason) else str(error)
    return " ".join(str(text).split())


ARGUMENT_SPEC = {
    "nodes": {
        "type": "list",
        "elements": "dict",
        "required": True,
        "options": {
            "name": {"type": "str", "required": True},
            "gpu_info": {"type": "dict", "default": {}},
            "user_labels": {"type": "dict", "default": {}},
            "sharing": {"type": "dict", "default": {}},
            "taint": {"type": "bool", "default": True},
            "taint_key": {"type": "str", "default": "nvidia.com/gpu", "no_log": False},
            "taint_value": {"type": "str", "default": "present"},
            "taint_effect": {
                "type": "str",
                "default": "NoSchedule",
                "choices": ["NoSchedule", "PreferNoSchedule", "NoExecute"],
            },
        },
    },
    "conflict_retries": {"type": "int", "default": 5},
    # The connection options, named and read (K8S_AUTH_* included) as kubernetes.core's modules name them.
    "kubeconfig": {"type": "path", "fallback": (env_fallback, ["K8S_AUTH_KUBECONFIG"])},
    "context": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_CONTEXT"])},
    "host": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_HOST"])},
    "api_key": {"type": "str", "no_log": True, "fallback": (env_fallback, ["K8S_AUTH_API_KEY"])},
    "validate_certs": {
        "type": "bool",
        "aliases": ["verify_ssl"],
        "fallback": (env_fallback, ["K8S_AUTH_VERIFY_SSL"]),
    },
    "ca_cert": {
        "type": "path",
        "aliases": ["ssl_ca_cert"],
        "fallback": (env_fallback, ["K8S_AUTH_SSL_CA_CERT"]),
    },
    "client_cert": {
        "type": "path",
        "aliases": ["cert_file"],
        "fallback": (env_fallback, ["K8S_AUTH_CERT_FILE"]),
    },
    "client_key": {"type": "path", "aliases": ["key_file"], "fallback": (env_fallback, ["K8S_AUTH_KEY_FILE"])},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run_or_fail(module, "node_labels", run_module)


def run_module(module):
    """Check the options, label the batch, and answer with what changed."""
    if KUBERNETES_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=KUBERNETES_IMPORT_ERROR)
    if module.params["conflict_retries"] < 0:
        module.fail_json(
            msg=f"node_labels: conflict_retries must be 0 or more, got {module.params['conflict_retries']}."
        )
    module.exit_json(**_response(module, _label(module)))


def _label(module):
    """label_batch on the API the options name; each way it can fail, one sentence."""
    try:
        api = NodeApi(_api_client(module.params))
        return label_batch(
            module.params["nodes"],
            api,
            check_mode=module.check_mode,
            conflict_retries=module.params["conflict_retries"],
        )
    except LabelError as error:
        module.fail_json(msg=str(error))
    except (k8s_config.ConfigException, OSError) as error:
        module.fail_json(msg=f"node_labels: cannot set up the Kubernetes client: {error}")
    except DynamicApiError as error:
        module.fail_json(msg=f"node_labels: the Kubernetes API refused a request: {_api_error(error)}")
    except urllib3_exceptions.HTTPError as error:  # no connection, TLS, retries exhausted
        module.fail_json(msg=f"node_labels: cannot reach the Kubernetes API: {error}")


def _response(module, result):
    """The module's result. The invocation echoes every node's GPU facts; a fleet's worth is not worth keeping
    in each host's result, so it says how many nodes there were instead."""
    changed = result["changed"]
    nodes = module.params["nodes"]
    response = {
        "changed": bool(changed),
        "nodes_changed": changed,
        "missing": result["missing"],
        "invalid": result["invalid"],
        "conflicts": result["conflicts"],
        "unchanged": len(nodes) - len(changed) - len(result["missing"]) - len(result["invalid"]),
        "invocation": {"module_args": {"nodes": f"({len(nodes)} nodes)"}},
    }
    if module._diff and changed:
        names = sorted(changed)
        response["diff"] = {
            "before": {name: result["diff"][name]["before"] for name in names},
            "after": {name: result["diff"][name]["after"] for name in names},
        }
    return response


if __name__ == "__main__":
    main()
