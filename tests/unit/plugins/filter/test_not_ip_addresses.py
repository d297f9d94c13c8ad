import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.not_ip_addresses import FilterModule, not_ip_addresses


def test_addresses_pass():
    assert not_ip_addresses(["10.0.0.11", "192.168.1.2", "fd00::11", "2001:db8::1", "::1"]) == []


@pytest.mark.parametrize(
    "entry",
    [
        "10.0.0.0/24",
        "10.0.0.256",
        "10.0.0",
        "tray-01",
        "",
        " 10.0.0.11",
        "10.0.0.11\n",
        "fd00:::1",
        10,
        None,
        ["10.0.0.1"],
    ],
)
def test_anything_but_one_address_is_returned(entry):
    assert not_ip_addresses(["10.0.0.11", entry, "fd00::11"]) == [entry]


def test_the_order_is_kept():
    assert not_ip_addresses(["b", "10.0.0.1", "a"]) == ["b", "a"]


@pytest.mark.parametrize("value", ["10.0.0.11", None, {"peer": "10.0.0.11"}])
def test_the_input_must_be_a_list(value):
    with pytest.raises(AnsibleFilterError, match="must be a list"):
        not_ip_addresses(value)


def test_the_filter_is_registered():
    assert FilterModule().filters()["not_ip_addresses"] is not_ip_addresses
