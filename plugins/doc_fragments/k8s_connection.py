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
      - Path to a kubeconfig, or the kubeconfig itself as a dict (as a vault or a lookup hands it over). Without it
        (and without O(host)) the in-cluster service account is used when the module runs in a pod, else the
        default kubeconfig.
      - Falls back to the E(K8S_AUTH_KUBECONFIG) environment variable.
    type: raw
  context:
    description: The kubeconfig context to use. Falls back to E(K8S_AUTH_CONTEXT).
    type: str
  host:
    description: The API server's URL. Falls back to E(K8S_AUTH_HOST).
    type: str
  api_key:
    description: A bearer token. Falls back to E(K8S_AUTH_API_KEY).
    type: str
  username:
    description:
      - A user name for HTTP basic authentication, with O(password), sent when no O(api_key) is given. Kubernetes'
        own API server dropped basic authentication in 1.19; a front that takes it before one still may.
      - Falls back to E(K8S_AUTH_USERNAME).
    type: str
  password:
    description: The password of O(username). Falls back to E(K8S_AUTH_PASSWORD).
    type: str
  validate_certs:
    description:
      - Verify the API server's certificate. Unset leaves it to the kubeconfig.
      - Falls back to E(K8S_AUTH_VERIFY_SSL) or E(K8S_AUTH_VALIDATE_CERTS).
    type: bool
    aliases: [verify_ssl]
  ca_cert:
    description:
      - The CA certificate that signed the API server's. Falls back to E(K8S_AUTH_SSL_CA_CERT) or
        E(K8S_AUTH_CA_CERT).
    type: path
    aliases: [ssl_ca_cert]
  client_cert:
    description: A client certificate. Falls back to E(K8S_AUTH_CERT_FILE) or E(K8S_AUTH_CLIENT_CERT).
    type: path
    aliases: [cert_file]
  client_key:
    description: The client certificate's key. Falls back to E(K8S_AUTH_KEY_FILE) or E(K8S_AUTH_CLIENT_KEY).
    type: path
    aliases: [key_file]
  proxy:
    description:
      - The URL of an HTTP proxy to reach the API server through (HTTPS through CONNECT). Falls back to
        E(K8S_AUTH_PROXY); unset, the Python client takes the usual E(HTTPS_PROXY) variables.
    type: str
  no_proxy:
    description:
      - Comma-separated hosts, domains and networks reached without the proxy. Falls back to E(K8S_AUTH_NO_PROXY).
    type: str
  proxy_headers:
    description:
      - Headers for the proxy. Unset, each is read from E(K8S_AUTH_PROXY_HEADERS_PROXY_BASIC_AUTH),
        E(K8S_AUTH_PROXY_HEADERS_BASIC_AUTH) and E(K8S_AUTH_PROXY_HEADERS_USER_AGENT).
    type: dict
    suboptions:
      proxy_basic_auth:
        description: C(user:password) for the proxy's own authentication.
        type: str
      basic_auth:
        description: C(user:password) for basic authentication of the request.
        type: str
      user_agent:
        description: The User-Agent header.
        type: str
  persist_config:
    description:
      - Write a token the kubeconfig's authentication provider refreshed back into the kubeconfig file.
      - Falls back to E(K8S_AUTH_PERSIST_CONFIG).
    type: bool
  impersonate_user:
    description:
      - The user to act as (the API server's impersonation; the caller needs the right to impersonate).
      - Falls back to E(K8S_AUTH_IMPERSONATE_USER).
    type: str
  impersonate_groups:
    description:
      - The groups to act as, each sent as a header of its own. Falls back to E(K8S_AUTH_IMPERSONATE_GROUPS)
        (comma-separated).
    type: list
    elements: str
requirements:
  - kubernetes (the Python client) on the host the module runs on
"""
