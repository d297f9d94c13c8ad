# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Kubernetes connection of the collection's API modules (node_labels, pod_eviction), private.

The options are named, and read (K8S_AUTH_* environment variables included), as kubernetes.core's modules
name and read them, so one ``module_defaults`` entry for ``group/gpuops.k8s.k8s`` gives the connection to
this collection's modules and kubernetes.core's alike. The documentation is the ``k8s_connection`` fragment.
"""

from __future__ import annotations

import os
import traceback

from ansible.module_utils.basic import env_fallback

try:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    KUBERNETES_IMPORT_ERROR = None
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()


CONNECTION_ARGUMENT_SPEC = {
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


def api_client(params):
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
