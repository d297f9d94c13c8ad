"""gpuops.k8s.alert_token: a node's alert token is HMAC-SHA256 of its name under the alert secret (the one derivation,
plugins/module_utils/_alert_tokens.py, which the gpu_alerts event source verifies with)."""

import hashlib
import hmac

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.alert_token import FilterModule, alert_token
from ansible_collections.gpuops.k8s.plugins.module_utils._alert_tokens import is_node_token, node_token


def test_a_nodes_token_is_the_hmac_of_its_name_in_hex():
    token = alert_token("gpu-node-1", "s3cret")
    assert token == hmac.new(b"s3cret", b"gpu-node-1", hashlib.sha256).hexdigest()
    assert len(token) == 64 and token == token.lower()
    assert FilterModule().filters()["alert_token"] is alert_token


def test_each_node_and_each_secret_has_its_own_token():
    assert len({node_token("s3cret", "gpu-1"), node_token("s3cret", "gpu-2"), node_token("other", "gpu-1")}) == 3


def test_a_token_is_checked_against_the_node_it_claims():
    token = node_token("s3cret", "gpu-1")
    assert is_node_token(token, "s3cret", "gpu-1") is True
    assert is_node_token(token, "s3cret", "gpu-2") is False
    assert is_node_token(token, "other", "gpu-1") is False
    assert is_node_token(None, "s3cret", "gpu-1") is False
    assert is_node_token(token, None, "gpu-1") is False


@pytest.mark.parametrize(
    "node, secret, sentence",
    [
        ("gpu-1", "", "alert_token: The alert secret must be a non-empty string."),
        ("gpu-1", None, "alert_token: The alert secret must be a non-empty string."),
        ("", "s3cret", "alert_token: The node name must be a non-empty string."),
    ],
)
def test_no_token_without_a_secret_and_a_node(node, secret, sentence):
    with pytest.raises(AnsibleFilterError) as raised:
        alert_token(node, secret)
    assert raised.value.message == sentence
