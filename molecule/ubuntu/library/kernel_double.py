# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A double of the kernel fact: reports an Ubuntu kernel release as ansible_facts.kernel, since the containers run
the machine's kernel."""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={"release": {"type": "str", "required": True}}, supports_check_mode=True)
    module.exit_json(changed=False, ansible_facts={"kernel": module.params["release"]})


if __name__ == "__main__":
    main()
