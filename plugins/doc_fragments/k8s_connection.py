# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later


class ModuleDocFragment:
    # The Kubernetes connection of the collection's API modules (module_utils/_k8s_connection.py), named as
    # kubernetes.core names it, so that module_defaults for group/gpuops.k8s.k8s carry it.
    DOCUMENTATION = r"""
options:
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
requirements:
  - kubernetes (the Python client) on the host the module runs on
"""
