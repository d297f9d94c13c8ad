#!/usr/bin/env python
"""Prints, as a JSON list, the names of the role tasks in an ansible.posix.json run (read from stdin) that ran a
module on a node: tasks of a role (the callback names them "role : task"), not skipped, and not an action the control
host answers alone (an include, set_fact, debug, assert, ...). One name per host and run of the task."""

import json
import sys

# Also read by bench/bench_site.py, which counts the same module runs.
CONTROL_ACTIONS = {
    "add_host",
    "assert",
    "debug",
    "fail",
    "group_by",
    "import_role",
    "import_tasks",
    "include_role",
    "include_tasks",
    "include_vars",
    "meta",
    "pause",
    "set_fact",
    "set_stats",
    "validate_argument_spec",
}


def module_runs(run):
    names = []
    for play in run["plays"]:
        for task in play["tasks"]:
            name = task["task"]["name"]
            for result in task["hosts"].values():
                action = result.get("action", "").removeprefix("ansible.builtin.").removeprefix("ansible.legacy.")
                if " : " in name and not result.get("skipped") and action not in CONTROL_ACTIONS:
                    names.append(name)
    return names


if __name__ == "__main__":
    print(json.dumps(module_runs(json.load(sys.stdin))))
