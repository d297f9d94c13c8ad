"""The collection's uses of kubernetes.core and community.general run against the lowest versions galaxy.yml allows,
so that each floor is a version a test ran. scripts/collections-floor.sh puts the two, at their floors, into a tree
that goes first on ANSIBLE_COLLECTIONS_PATH here (the versions the ansible package ships come after it):

- node_drain's tests of node_drain.py, imported below and so run here as well, with this module's
  ``cluster``: kubernetes.core.k8s_info and k8s_drain against the control_plane fixture's API server (k8s_drain
  before 5.1.0 does not wait for a node's one pod, and says less of a refusing disruption budget);
- the device_plugin tests of labels.py (daemonset mode), imported the same way, with this module's
  ``apiserver``: kubernetes.core.k8s creates, updates and deletes, k8s_info reads;
- nvidia_driver's nouveau blacklist (community.general.kernel_blacklist, through the role's own tasks file) on a file
  of the test's own, in check mode and for real;
- every module of the two collections a role or playbook calls: each option it passes, and each literal choice, is
  one the floor's module has. That is all that is checked of community.general.modprobe and dnf_versionlock, which
  cannot run here (no kernel modules, no dnf).

Each run reports in its own output the version of each collection it loaded (playbook_env.loaded_versions_task),
and the tests check that it was the floor."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import test_labels_api as labels
import test_node_drain_api as node_drain
import yaml
from local_api import token_admin_api_server
from playbook_env import DEPENDENCIES, REPO, loaded_versions, loaded_versions_task, playbook_env

TOKEN = "gpuops-dependency-floors-admin-token"
API_SERVER = token_admin_api_server(TOKEN)


def galaxy_floors() -> dict[str, str]:
    """Each dependency's floor: the X.Y.Z of the ``>=X.Y.Z`` its range in galaxy.yml starts with."""
    floors = {}
    for name, spec in yaml.safe_load((REPO / "galaxy.yml").read_text())["dependencies"].items():
        match = re.match(r">=(\d+\.\d+\.\d+)(,|$)", str(spec))
        assert match, f"galaxy.yml gives {name} the range {spec!r}, which does not start with a floor (>=X.Y.Z)"
        floors[name] = match[1]
    return floors


FLOORS = galaxy_floors()


@pytest.fixture(scope="module")
def floor_tree():
    """scripts/collections-floor.sh's tree (built on the first call, then cached)."""
    run = subprocess.run(
        [str(REPO / "scripts/collections-floor.sh")], capture_output=True, text=True, timeout=1800, check=False
    )
    assert run.returncode == 0, f"scripts/collections-floor.sh failed:\n{run.stderr[-3000:]}"
    return run.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def floor_env(floor_tree):
    return playbook_env(floor_tree)


@pytest.fixture(scope="module")
def cluster(control_plane, floor_env):
    """The node_drain tests' cluster, their plays run with the floors (and each run checked to have loaded them)."""
    return node_drain.drain_cluster(control_plane, TOKEN, floor_env, loaded=FLOORS)


@pytest.fixture(scope="module")
def apiserver(control_plane, floor_env):
    """The device_plugin tests' API server, their plays run with the floors (and each run checked to have loaded
    them)."""
    return labels.labels_apiserver(control_plane, TOKEN, floor_env, loaded=FLOORS)


# test_labels_api.py's tests of device_plugin's daemonset mode and test_node_drain_api.py's tests, run here as well with
# this module's cluster and apiserver, in their modules' order.
test_daemonset_and_runtimeclass = labels.test_daemonset_and_runtimeclass
test_a_node_that_leaves_takes_the_runtimeclass_only_when_it_is_the_last_gpu_node = (
    labels.test_a_node_that_leaves_takes_the_runtimeclass_only_when_it_is_the_last_gpu_node
)
test_a_refused_drain_leaves_the_node_cordoned_with_a_record_and_says_so_and_the_next_run_lifts_it = (
    node_drain.test_a_refused_drain_leaves_the_node_cordoned_with_a_record_and_says_so_and_the_next_run_lifts_it
)
test_a_drain_whose_pods_do_not_go_fails_and_the_next_run_finishes_it = (
    node_drain.test_a_drain_whose_pods_do_not_go_fails_and_the_next_run_finishes_it
)
test_a_persons_cordon_stays_through_a_failed_drain_and_the_next_run = (
    node_drain.test_a_persons_cordon_stays_through_a_failed_drain_and_the_next_run
)
test_the_drain_waits_for_a_pod_that_takes_a_moment_to_stop = (
    node_drain.test_the_drain_waits_for_a_pod_that_takes_a_moment_to_stop
)


def test_the_floor_tree_holds_the_floors_galaxy_yml_declares(floor_tree):
    """The tree has the two collections, at the floors, and nothing else; and galaxy.yml names no other dependency,
    which the floor tests would then leave untested."""
    assert set(FLOORS) == set(DEPENDENCIES) == {"kubernetes.core", "community.general"}
    found = {
        f"{manifest.parts[-3]}.{manifest.parts[-2]}": json.loads(manifest.read_text())["collection_info"]["version"]
        for manifest in Path(floor_tree).glob("ansible_collections/*/*/MANIFEST.json")
    }
    assert found == FLOORS


# nvidia_driver's tasks file for the nouveau blacklist, as apply.yml includes it.
BLACKLIST_PLAY = [
    {
        "name": "nvidia_driver's nouveau blacklist",
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            loaded_versions_task(),
            {
                "name": "Blacklist nouveau as nvidia_driver does",
                "ansible.builtin.include_role": {"name": "gpuops.k8s.nvidia_driver", "tasks_from": "blacklist"},
            },
        ],
    }
]


def blacklist(floor_env, work, check):
    """Run BLACKLIST_PLAY on work/blacklist.conf; (its json report, the file's lines after it)."""
    path = work / "blacklist.conf"
    playbook = work / "blacklist-play.yml"
    playbook.write_text(yaml.safe_dump(BLACKLIST_PLAY))
    extra = work / "blacklist-extra.json"
    extra.write_text(
        json.dumps(
            {
                # What the role's read of the node would have found: the file (the test's own) and its text, and a
                # blacklist to write.
                "__nvidia_driver_blacklist_file": str(path),
                "__nvidia_driver_blacklist_text": path.read_text(),
                "__nvidia_driver_todo": {"blacklist": True, "nouveau_options": False},
                # The kernel is not the role's to touch here: its handler that rebuilds the initramfs does nothing.
                "__nvidia_driver_in_container": True,
                "__nvidia_driver_kernel_tree_present": False,
                "ansible_python_interpreter": sys.executable,
            }
        )
    )
    argv = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook), "-e", f"@{extra}"]
    if check:
        argv.append("--check")
    run = subprocess.run(argv, capture_output=True, text=True, env=floor_env, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert loaded_versions(report) == [FLOORS]
    return report, path.read_text().splitlines()


def test_the_nouveau_blacklist_in_check_mode_then_for_real_then_unchanged(floor_env, tmp_path):
    (tmp_path / "blacklist.conf").write_text("blacklist nouveau\n")

    report, lines = blacklist(floor_env, tmp_path, check=True)
    tasks = {task["task"]["name"]: task["hosts"]["localhost"] for play in report["plays"] for task in play["tasks"]}
    items = {item["item"]: item["changed"] for item in tasks["gpuops.k8s.nvidia_driver : Blacklist nouveau"]["results"]}
    assert items == {"nouveau": False, "lbm-nouveau": True}
    assert lines == ["blacklist nouveau"], "check mode wrote the file"
    assert tasks["gpuops.k8s.nvidia_driver : Rebuild the initramfs"].get("skipped") is True

    report, lines = blacklist(floor_env, tmp_path, check=False)
    assert report["stats"]["localhost"]["changed"] == 1
    assert lines == ["blacklist nouveau", "blacklist lbm-nouveau"]

    report, lines = blacklist(floor_env, tmp_path, check=False)
    assert report["stats"]["localhost"]["changed"] == 0
    assert lines == ["blacklist nouveau", "blacklist lbm-nouveau"]


# A module of the two collections named as a YAML key, in a task or in module_defaults.
MODULE_KEY = re.compile(r"^[ \t-]*((?:kubernetes\.core|community\.general)\.\w+):", re.MULTILINE)


def module_uses():
    """(file, module, arguments) for each place a role or playbook names a module of the two collections; the
    arguments are a template string where they are not given one by one."""
    files = [*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("roles/*/handlers/*.yml"), *REPO.glob("playbooks/*.yml")]
    uses = []

    def walk(node, where):
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and MODULE_KEY.match(f"{key}:"):
                    uses.append((where, key, value))
                walk(value, where)
        elif isinstance(node, list):
            for value in node:
                walk(value, where)

    named = set()
    for path in sorted(files):
        where = str(path.relative_to(REPO))
        walk(yaml.safe_load(path.read_text()), where)
        named |= {(where, name) for name in MODULE_KEY.findall(path.read_text())}
    return uses, named


def unknown_arguments(arguments, options, where):
    """Each argument not among ``options`` (with their aliases), or a literal value outside an option's choices."""
    by_name = {alias: option for name, option in options.items() for alias in [name, *option.get("aliases", [])]}
    wrong = []
    for key, value in arguments.items():
        option = by_name.get(key)
        if option is None:
            wrong.append(f"{where}: no option {key}")
        elif isinstance(value, dict) and option.get("suboptions"):
            wrong += unknown_arguments(value, option["suboptions"], f"{where}.{key}")
        elif isinstance(value, str) and "{{" not in value and option.get("choices") and value not in option["choices"]:
            wrong.append(f"{where}: {key}={value} is none of {option['choices']}")
    return wrong


def test_every_option_the_roles_pass_to_the_two_collections_is_one_their_floors_have(floor_tree, floor_env):
    uses, named = module_uses()
    # The walk over the YAML found each place a plain search of the text finds.
    assert {(where, module) for where, module, _arguments in uses} == named
    modules = sorted({module for _where, module, _arguments in uses})
    assert {"kubernetes.core.k8s_drain", "community.general.kernel_blacklist"} <= set(modules), modules
    run = subprocess.run(
        ["ansible-doc", "-t", "module", "--json", *modules],
        capture_output=True,
        text=True,
        env=floor_env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    docs = json.loads(run.stdout)
    assert sorted(docs) == modules
    # ansible-doc read each module from the floor tree.
    read_from = {module: docs[module]["doc"]["filename"] for module in modules}
    assert {module: path for module, path in read_from.items() if not path.startswith(f"{floor_tree}/")} == {}
    wrong = []
    for where, module, arguments in uses:
        if isinstance(arguments, dict):
            wrong += unknown_arguments(arguments, docs[module]["doc"]["options"], f"{where}: {module}")
    assert wrong == []
