# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A role's argument spec and its defaults/main.yml agree where a default is a template.

Ansible renders a templated default of the argument spec when it validates the role's arguments, before the role
runs: a default written there differently from defaults/main.yml is what validation renders, and it can fail where the
role's own would not. With extra variables from the command line (-e name=600, a string), a sum without `| int`
stopped every run of gpu_remediation at its validation; each templated default is rendered here with the integers
the role's defaults name given as strings, as -e gives them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.template import Templar, trust_as_template

ROLES = Path(__file__).resolve().parents[3] / "roles"


def templated_defaults():
    for spec_path in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        role = spec_path.parent.parent
        defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
        for entry, spec in yaml.safe_load(spec_path.read_text())["argument_specs"].items():
            for name, option in (spec.get("options") or {}).items():
                default = option.get("default")
                if isinstance(default, str) and "{{" in default:
                    yield pytest.param(defaults, name, default, id=f"{role.name}-{entry}-{name}")


@pytest.mark.parametrize(("defaults", "name", "default"), list(templated_defaults()))
def test_a_templated_default_is_the_roles_own_and_renders_from_command_line_strings(defaults, name, default):
    assert name in defaults, f"{name} has a default in the argument spec but none in defaults/main.yml"
    assert default.strip() == str(defaults[name]).strip()
    # As -e gives them: every integer default as a string.
    given = {k: str(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in defaults.items()}
    given.pop(name)
    # What a play gives every template: its inventory's groups and the host's name.
    given.update(groups={"all": ["gpu-1"], "gpu_nodes": ["gpu-1"], "ungrouped": []}, inventory_hostname="gpu-1")
    try:
        Templar(variables=given).template(trust_as_template(default))
    except Exception as error:  # an undefined variable is fine here (one the inventory gives); a type error is not
        assert "is undefined" in str(error) or "undefined" in type(error).__name__.lower(), error
