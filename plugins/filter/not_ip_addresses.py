# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: not_ip_addresses
short_description: The entries of a list that are not an IPv4 or IPv6 address
version_added: 0.1.0
description:
  - Takes a list and returns the entries that are not one IPv4 or IPv6 address as Python's C(ipaddress) reads one
    (C(10.0.0.11), C(fd00::11)). Networks (C(10.0.0.0/24)), host names, empty strings and anything that is not a
    string are returned, in their order. An empty list means every entry is an address.
  - C(gpuops.k8s.nvidia_driver) checks C(nvidia_driver_imex_peers) with it before it writes IMEX's peer list.
options:
  _input:
    description: The entries to check.
    type: list
    elements: raw
    required: true
"""

EXAMPLES = r"""
- name: Refuse peers that are not addresses
  ansible.builtin.assert:
    that: peers | gpuops.k8s.not_ip_addresses | length == 0
    fail_msg: "{{ peers | gpuops.k8s.not_ip_addresses | join(', ') }} are not IP addresses."
"""

RETURN = r"""
_value:
  description: The entries that are not an IPv4 or IPv6 address, in their order.
  type: list
  elements: raw
"""

import ipaddress

from ansible.errors import AnsibleFilterError


def _is_address(entry):
    if not isinstance(entry, str) or entry != entry.strip():
        return False
    try:
        ipaddress.ip_address(entry)
    except ValueError:
        return False
    return True


def not_ip_addresses(entries):
    if isinstance(entries, (str, bytes)) or not isinstance(entries, (list, tuple)):
        raise AnsibleFilterError("not_ip_addresses: the input must be a list.")
    return [entry for entry in entries if not _is_address(entry)]


class FilterModule:
    def filters(self):
        return {"not_ip_addresses": not_ip_addresses}
