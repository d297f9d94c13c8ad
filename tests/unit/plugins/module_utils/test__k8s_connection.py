"""The collection's Kubernetes connection (module_utils/_k8s_connection.py): what each option sets on the client.
The integration tier (tests/integration/test_labels_api.py) proves the proxy, impersonation and a kubeconfig
given as a dict against a real API server."""

import base64

import pytest
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_connection import (
    CONNECTION_ARGUMENT_SPEC,
    api_client,
)

HOST = {"host": "https://203.0.113.10:6443/"}


def params(**given):
    return {**dict.fromkeys(CONNECTION_ARGUMENT_SPEC), **given}


def test_the_host_loses_its_trailing_slash_and_the_proxy_settings_reach_the_configuration():
    client = api_client(params(**HOST, proxy="http://proxy.example:3128", no_proxy="10.0.0.0/8,.cluster.local"))
    configuration = client.configuration
    assert configuration.host == "https://203.0.113.10:6443"
    assert configuration.proxy == "http://proxy.example:3128"
    assert configuration.no_proxy == "10.0.0.0/8,.cluster.local"


def test_proxy_headers_come_from_the_option_else_from_their_environment_variables(monkeypatch):
    given = api_client(
        params(**HOST, proxy_headers={"proxy_basic_auth": "u:p", "basic_auth": None, "user_agent": None})
    )
    assert given.configuration.proxy_headers == {"proxy-authorization": "Basic " + base64.b64encode(b"u:p").decode()}
    monkeypatch.setenv("K8S_AUTH_PROXY_HEADERS_USER_AGENT", "gpuops")
    from_env = api_client(params(**HOST))
    assert from_env.configuration.proxy_headers == {"user-agent": "gpuops"}


def test_basic_authentication_only_without_a_token():
    client = api_client(params(**HOST, username="admin", password="secret"))
    assert client.default_headers["authorization"] == "Basic " + base64.b64encode(b"admin:secret").decode()
    with_token = api_client(params(**HOST, username="admin", password="secret", api_key="t0ken"))
    assert "authorization" not in with_token.default_headers


class Recorded(Exception):
    """Raised by the stand-in pool manager once it has the request's headers."""


@pytest.mark.parametrize("groups", [["team-a"], ["team-a", "team-b"]])
def test_each_impersonated_group_is_a_header_of_its_own(groups):
    client = api_client(params(**HOST, impersonate_user="alice", impersonate_groups=groups))
    assert client.default_headers["Impersonate-User"] == "alice"
    seen = {}

    class PoolManager:
        def request(self, *args, **kwargs):
            seen["headers"] = kwargs["headers"]
            raise Recorded

    client.rest_client.pool_manager = PoolManager()
    with pytest.raises(Recorded):
        client.rest_client.request("GET", "https://203.0.113.10:6443/api", headers={"Accept": "application/json"})
    headers = seen["headers"]
    assert headers.getlist("Impersonate-Group") == groups
    assert headers["Accept"] == "application/json"
