# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The Kubernetes connection of the collection's API modules (node_cordon, node_labels, node_remediation,
pod_eviction), private.

The options are named, and read (K8S_AUTH_* environment variables included), as kubernetes.core's modules
name and read them, so one ``module_defaults`` entry for ``group/gpuops.k8s.k8s`` gives the connection to
this collection's modules and kubernetes.core's alike. The documentation is the ``k8s_connection`` fragment.
"""

from __future__ import annotations

import os
import traceback

from ansible.module_utils.basic import env_fallback

try:
    import urllib3
    from urllib3._collections import HTTPHeaderDict
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    KUBERNETES_IMPORT_ERROR = None
except ImportError:
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()


# The proxy's own headers, each read from K8S_AUTH_PROXY_HEADERS_<NAME> where unset (as kubernetes.core reads them).
PROXY_HEADERS_SPEC = {
    "proxy_basic_auth": {"type": "str", "no_log": True},
    "basic_auth": {"type": "str", "no_log": True},
    "user_agent": {"type": "str"},
}

CONNECTION_ARGUMENT_SPEC = {
    # A path, or the kubeconfig itself as a dict; it may hold credentials, so it is not logged.
    "kubeconfig": {"type": "raw", "no_log": True, "fallback": (env_fallback, ["K8S_AUTH_KUBECONFIG"])},
    "context": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_CONTEXT"])},
    "host": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_HOST"])},
    "api_key": {"type": "str", "no_log": True, "fallback": (env_fallback, ["K8S_AUTH_API_KEY"])},
    "username": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_USERNAME"])},
    "password": {"type": "str", "no_log": True, "fallback": (env_fallback, ["K8S_AUTH_PASSWORD"])},
    "validate_certs": {
        "type": "bool",
        "aliases": ["verify_ssl"],
        "fallback": (env_fallback, ["K8S_AUTH_VERIFY_SSL", "K8S_AUTH_VALIDATE_CERTS"]),
    },
    "ca_cert": {
        "type": "path",
        "aliases": ["ssl_ca_cert"],
        "fallback": (env_fallback, ["K8S_AUTH_SSL_CA_CERT", "K8S_AUTH_CA_CERT"]),
    },
    "client_cert": {
        "type": "path",
        "aliases": ["cert_file"],
        "fallback": (env_fallback, ["K8S_AUTH_CERT_FILE", "K8S_AUTH_CLIENT_CERT"]),
    },
    "client_key": {
        "type": "path",
        "aliases": ["key_file"],
        "fallback": (env_fallback, ["K8S_AUTH_KEY_FILE", "K8S_AUTH_CLIENT_KEY"]),
    },
    "proxy": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_PROXY"])},
    "no_proxy": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_NO_PROXY"])},
    "proxy_headers": {"type": "dict", "options": PROXY_HEADERS_SPEC},
    "persist_config": {"type": "bool", "fallback": (env_fallback, ["K8S_AUTH_PERSIST_CONFIG"])},
    "impersonate_user": {"type": "str", "fallback": (env_fallback, ["K8S_AUTH_IMPERSONATE_USER"])},
    "impersonate_groups": {
        "type": "list",
        "elements": "str",
        "fallback": (env_fallback, ["K8S_AUTH_IMPERSONATE_GROUPS"]),
    },
}


def _proxy_headers(params):
    """The proxy_headers option, else its K8S_AUTH_PROXY_HEADERS_* variables; None when neither says anything."""
    given = params.get("proxy_headers")
    if given is None:
        given = {name: os.environ.get("K8S_AUTH_PROXY_HEADERS_" + name.upper()) for name in PROXY_HEADERS_SPEC}
    headers = {name: value for name, value in given.items() if value is not None}
    return headers or None


def api_client(params):
    """A client configured the way kubernetes.core configures its own from the same options."""
    configuration = k8s_client.Configuration()
    kubeconfig = params.get("kubeconfig")
    loaded = {
        "context": params.get("context"),
        "client_configuration": configuration,
        "persist_config": bool(params.get("persist_config")),
    }
    if isinstance(kubeconfig, dict):
        k8s_config.load_kube_config_from_dict(config_dict=kubeconfig, **loaded)
    elif kubeconfig:
        k8s_config.load_kube_config(config_file=os.path.expanduser(str(kubeconfig)), **loaded)
    elif not params.get("host"):
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not params.get("context"):
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(**loaded)
    if params.get("host"):
        configuration.host = params["host"].rstrip("/")
    if params.get("api_key"):
        configuration.api_key = {"authorization": params["api_key"]}
        configuration.api_key_prefix = {"authorization": "Bearer"}
    if params.get("validate_certs") is not None:
        configuration.verify_ssl = params["validate_certs"]
    if params.get("ca_cert"):
        configuration.ssl_ca_cert = params["ca_cert"]
    if params.get("client_cert"):
        configuration.cert_file = params["client_cert"]
    if params.get("client_key"):
        configuration.key_file = params["client_key"]
    if params.get("proxy"):
        configuration.proxy = params["proxy"]
    if params.get("no_proxy"):
        configuration.no_proxy = params["no_proxy"]
    proxy_headers = _proxy_headers(params)
    if proxy_headers:
        configuration.proxy_headers = urllib3.util.make_headers(**proxy_headers)
    client = k8s_client.ApiClient(configuration)
    if params.get("username") and params.get("password") and not params.get("api_key"):
        # The Python client sends no basic authentication of its own: an API server that takes it (or a front
        # before one) gets the header here.
        basic = urllib3.util.make_headers(basic_auth=f"{params['username']}:{params['password']}")
        client.set_default_header("authorization", basic["authorization"])
    if params.get("impersonate_user"):
        client.set_default_header("Impersonate-User", params["impersonate_user"])
    groups = [group for group in params.get("impersonate_groups") or [] if group]
    if groups:
        _send_each(client, "Impersonate-Group", groups)
    return client


def _send_each(client, name, values):
    """Every request of CLIENT carries the header NAME once per value, as the API server reads impersonated groups
    (one value with commas would be one group). The client's default headers hold one value per name, so the
    values are added where its REST client sends a request."""
    rest = client.rest_client
    send = rest.request

    def request(*args, **kwargs):
        headers = HTTPHeaderDict(kwargs.get("headers") or {})
        headers.discard(name)
        for value in values:
            headers.add(name, value)
        kwargs["headers"] = headers
        return send(*args, **kwargs)

    rest.request = request
