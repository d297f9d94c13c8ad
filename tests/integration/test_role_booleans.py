"""Every boolean role option is read through ``| bool`` wherever a conditional or an expression uses it.

An AWX survey answers a true/false question with the string "true" or "false" (scripts/awx-survey.py),
and ``-e name=false`` passes a string too. Role argument validation accepts such strings without
converting them, so ``when: not option`` would see a non-empty string (and ansible-core 2.19 refuses a
conditional that is not a boolean). This reads the roles' argument specs for the bool options and every
task file, handler and playbook, and names each place an option is used without ``| bool``.
"""

from __future__ import annotations

import glob
import os
import re

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONDITION_KEYS = ("when", "changed_when", "failed_when", "until")
_STRING_LITERAL = re.compile(r"'[^']*'|\"[^\"]*\"")
_JINJA = re.compile(r"\{\{(.*?)\}\}", re.S)


def bool_options() -> set[str]:
    """The bool options with a true/false default. The tri-state ones (null by default: *_validate_certs)
    are only handed to module parameters, which convert a string themselves."""
    names = set()
    for path in glob.glob(os.path.join(REPO, "roles", "*", "meta", "argument_specs.yml")):
        with open(path) as handle:
            for entry in yaml.safe_load(handle)["argument_specs"].values():
                names.update(
                    name
                    for name, spec in entry.get("options", {}).items()
                    if spec.get("type") == "bool" and spec.get("default") is not None
                )
    return names


def expressions(node, key=None):
    """(key, expression) for every conditional and every {{ }} in a loaded YAML document."""
    if isinstance(node, dict):
        for child_key, value in node.items():
            yield from expressions(value, child_key)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item, key)
    elif isinstance(node, str):
        if key in CONDITION_KEYS:
            yield key, node
        else:
            for match in _JINJA.finditer(node):
                yield key, match.group(1)
    elif isinstance(node, bool) or node is None:
        return


def unconverted(expression: str, names: set[str]) -> list[str]:
    code = _STRING_LITERAL.sub("''", expression)
    found = []
    for name in names:
        for match in re.finditer(r"\b" + re.escape(name) + r"\b", code):
            rest = code[match.end() :]
            rest = re.sub(r"^\s*\|\s*default\([^)]*\)", "", rest)
            if not re.match(r"^\s*\|\s*bool\b", rest):
                found.append(name)
    return found


def task_files() -> list[str]:
    patterns = ("roles/*/tasks/*.yml", "roles/*/handlers/*.yml", "playbooks/*.yml", "playbooks/tasks/*.yml")
    return sorted(path for pattern in patterns for path in glob.glob(os.path.join(REPO, pattern)))


def test_the_checker_sees_options_and_files():
    names = bool_options()
    assert {"nvidia_runtime_set_as_default", "nvidia_driver_reboot", "device_plugin_wait_for_pod"} <= names
    assert len(task_files()) > 20
    # It names a bare use, and accepts the converted ones and names inside string literals.
    assert unconverted("not nvidia_driver_reboot", names) == ["nvidia_driver_reboot"]
    assert unconverted("(nvidia_driver_reboot | default(true) | bool) and x", names) == []
    assert unconverted("'set nvidia_driver_reboot=true' if nvidia_driver_reboot | bool else ''", names) == []


def test_every_bool_option_is_converted_where_it_is_read():
    names = bool_options()
    problems = []
    for path in task_files():
        with open(path) as handle:
            document = yaml.safe_load(handle)
        for key, expression in expressions(document):
            for name in unconverted(expression, names):
                problems.append(
                    f"{os.path.relpath(path, REPO)}: {key}: {name} without | bool in {expression.strip()!r}"
                )
    assert problems == []
