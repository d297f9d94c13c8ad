"""Places that must agree, checked so they cannot drift apart again:

- the daemon's default metrics address, the device_plugin role's default and validate.yml's fallback;
- the daemon's dependencies as the role installs them on a node, the ranges its pyproject.toml declares and the
  versions its tests run with (the lower bounds, which have wheels for Python 3.9);
- the versions of the collections this one depends on: galaxy.yml's ranges hold the ones the ansible package of each
  controller CI runs ships (requirements/controller*.txt) and start at the floors scripts/collections-floor.sh
  installs for the integration tests, and the README names the same ranges;
- the example systemd unit shipped with the daemon and the unit the role writes with its defaults;
- docs/metrics.md's scrape config and PodMonitor, Prometheus (promtool), the role's port, node selector and DaemonSets;
- the example inventory and the README: an unprivileged user with sudo, never root;
- the README's table of what `make test-full` adds and the tests that add it;
- the README's Layout block and the tree: every directory, module, filter, helper, role and playbook named there
  exists, and each of them that exists is named (and every module and role has its row in "What is in it");
- each role's README and its meta/main.yml: the sections a user of a role looks for, and the same platforms;
- the ansible-core the collection claims: meta/runtime.yml, every role's meta/main.yml and the README name one
  minimum, and it is the oldest minor version CI runs (requirements/controller-oldest.txt); the Makefile's matrix
  holds every minor from there to the newest (requirements/controller.txt), as the README's "Version matrix" says;
- the two EDA rulebooks: gpu_remediation_job_template.yml is gpu_remediation.yml (source, rules, throttle,
  strategy) but for its remediation action, which passes the same extra variables and the alert's node as the
  limit, and launches by default the job template docs/awx.md creates."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jinja2
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "files" / "device_plugin"
ROLE = REPO / "roles" / "device_plugin"

sys.path.insert(0, str(PLUGIN))
from lower_bounds import lower_bounds  # noqa: E402


def role_defaults() -> dict:
    """The role's defaults, the kubelet socket (which names the kubelet directory) resolved."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    resolved = dict(defaults)
    for key in ("device_plugin_kubelet_socket",):
        resolved[key] = environment.from_string(defaults[key]).render(defaults)
    return resolved


def daemon_default(field: str) -> object:
    """A field's default in the daemon's Config dataclass, read from its source (the daemon's package is not
    importable here without its own dependencies)."""
    tree = ast.parse((PLUGIN / "src" / "gpu_device_plugin" / "config.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == field:
            assert node.value is not None, f"config.py: {field} has no default"
            return ast.literal_eval(node.value)
    raise AssertionError(f"config.py declares no field {field}")


def test_one_default_metrics_address_for_the_daemon_the_role_and_validate() -> None:
    daemon = daemon_default("metrics_address")
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    spec_default = specs["argument_specs"]["main"]["options"]["device_plugin_metrics_address"]["default"]
    validate = (REPO / "playbooks" / "validate.yml").read_text()
    fallback = re.search(r"device_plugin_metrics_address \| default\('([^']*)'\)", validate)
    assert fallback, "validate.yml no longer falls back to a default metrics address"
    assert role_defaults()["device_plugin_metrics_address"] == daemon
    assert spec_default == daemon
    assert fallback.group(1) == daemon
    # 9400 is the port of NVIDIA's DCGM exporter, which often runs on the same nodes.
    assert not str(daemon).endswith(":9400")


def test_the_role_installs_the_daemons_tested_dependency_versions() -> None:
    defaults = role_defaults()
    pins = {}
    for line in defaults["device_plugin_pip_packages"] + defaults["device_plugin_dra_pip_packages"]:
        name, version = line.split("==")
        pins[name.lower()] = version
    pins.pop("setuptools")  # the venv's build tool, not a dependency of the package
    bounds = {name.lower(): version for name, version in lower_bounds().items()}
    assert pins == bounds
    pyproject = (PLUGIN / "pyproject.toml").read_text()
    dependencies = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.S | re.M)
    assert dependencies
    for text in re.findall(r'^\s*"([^"]+)",', dependencies.group(1), re.M):
        requirement = Requirement(text)
        assert requirement.specifier.contains(pins[requirement.name.lower()]), (text, pins[requirement.name.lower()])


def shipped_versions(tree: Path) -> dict[str, str]:
    """The version of each collection under ``tree``/ansible_collections, from its MANIFEST.json."""
    return {
        f"{manifest.parts[-3]}.{manifest.parts[-2]}": json.loads(manifest.read_text())["collection_info"]["version"]
        for manifest in tree.glob("ansible_collections/*/*/MANIFEST.json")
    }


def built_tree(*argv: str) -> Path:
    """The directory a script that builds an ansible_collections tree prints."""
    run = subprocess.run([str(REPO / "scripts" / argv[0]), *argv[1:]], capture_output=True, text=True, check=False)
    assert run.returncode == 0, f"scripts/{argv[0]} failed:\n{run.stderr[-3000:]}"
    return Path(run.stdout.strip().splitlines()[-1])


def test_the_dependency_ranges_hold_what_ci_runs_and_start_at_the_tested_floors():
    """Each range in galaxy.yml's dependencies holds the version that the ansible package of each controller CI runs
    ships (read from the installed package for the environment these tests run in, from that release's wheel for
    another controller), starts at the floor the floor tests run (scripts/collections-floor.sh) and ends before the
    major version after the newest that a controller ships: no major version is claimed that no test ran. The
    README's requirements name the same ranges."""
    ranges = yaml.safe_load((REPO / "galaxy.yml").read_text())["dependencies"]
    assert set(ranges) == {"kubernetes.core", "community.general"}, ranges
    shipped = {}
    for requirements in sorted((REPO / "requirements").glob("controller*.txt")):
        release = pins(requirements.stem)["ansible"]
        if importlib.metadata.version("ansible") == release:
            tree = Path(importlib.metadata.distribution("ansible").locate_file("."))
        else:
            tree = built_tree("ansible-collections.sh", release)
        shipped[f"{requirements.name} (ansible {release})"] = shipped_versions(tree)
    assert shipped, "no requirements/controller*.txt"
    floors = shipped_versions(built_tree("collections-floor.sh"))
    readme = (REPO / "README.md").read_text()
    for name, spec in ranges.items():
        match = re.fullmatch(r">=(\d+\.\d+\.\d+),<(\d+)\.0\.0", spec)
        assert match, f"galaxy.yml gives {name} {spec!r}, not a floor and the next major version (>=X.Y.Z,<N.0.0)"
        assert floors[name] == match[1], (name, floors[name])
        outside = {where: found[name] for where, found in shipped.items() if found[name] not in SpecifierSet(spec)}
        assert outside == {}, f"{name} {spec} does not hold what these controllers ship: {outside}"
        newest = max(Version(found[name]) for found in shipped.values())
        assert int(match[2]) == newest.major + 1, f"{name} {spec}: the newest version CI runs is {newest}"
        assert f"`{name}` {spec.replace(',', ', ')}" in readme, f"the README does not name {name} {spec}"


def unit_lines(text: str) -> list[str]:
    """A unit file's directives, comments dropped and continuation lines joined."""
    text = re.sub(r"\s*\\\n\s*", " ", text)
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_example_unit_is_the_unit_the_role_writes_with_its_defaults() -> None:
    defaults = role_defaults()
    install_dir = defaults["device_plugin_install_dir"]
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    environment.filters["quote"] = shlex.quote
    environment.filters["dirname"] = os.path.dirname
    template = environment.from_string((ROLE / "templates" / "device-plugin.service.j2").read_text())
    # The arguments are the role's vars/main.yml expression evaluated for the defaults, written out here; the
    # comparison below checks them against the example's ExecStart option by option.
    args = [
        "--backend",
        defaults["device_plugin_backend"],
        "--kubelet-socket",
        defaults["device_plugin_kubelet_socket"],
        "--config-file",
        f"{defaults['device_plugin_config_dir']}/config.yaml",
        "--device-list-strategy",
        defaults["device_plugin_device_list_strategy"],
        "--log-format",
        defaults["device_plugin_log_format"],
        "--metrics-address",
        defaults["device_plugin_metrics_address"],
        "--dcgm-metrics-address",
        defaults["device_plugin_dcgm_metrics_address"],
        "--dcgm-interval-seconds",
        str(defaults["device_plugin_dcgm_interval"]),
        "--pod-resources-socket",
        f"{os.path.dirname(defaults['device_plugin_kubelet_dir'])}/pod-resources/kubelet.sock",
    ]
    rendered = template.render(
        ansible_managed="managed",
        __device_plugin_dra=False,
        device_plugin_backend=defaults["device_plugin_backend"],
        __device_plugin_venv=f"{install_dir}/venv",
        __device_plugin_args=args,
        device_plugin_kubelet_dir=defaults["device_plugin_kubelet_dir"],
        device_plugin_service_extra=defaults["device_plugin_service_extra"],
        device_plugin_health_file=defaults["device_plugin_health_file"],
    )
    example = (PLUGIN / "gpu-device-plugin.service").read_text()
    role_lines, example_lines = unit_lines(rendered), unit_lines(example)
    role_exec = [line for line in role_lines if line.startswith("ExecStart=")]
    example_exec = [line for line in example_lines if line.startswith("ExecStart=")]
    assert [shlex.split(line) for line in example_exec] == [shlex.split(line) for line in role_exec]
    assert example_lines == role_lines


def test_the_scrape_config_and_podmonitor_of_the_metrics_page_fit_prometheus_and_the_roles_daemon(tmp_path) -> None:
    """docs/metrics.md's Prometheus scrape config is one promtool accepts, at the role's port on the nodes the role's
    DaemonSets select; its PodMonitor selects both DaemonSets' pods in the role's namespace at the port they name."""
    text = (REPO / "docs" / "metrics.md").read_text()
    blocks = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]
    (scrape,) = [block for block in blocks if "scrape_configs" in block]
    (monitor,) = [block for block in blocks if block.get("kind") == "PodMonitor"]
    # Debian builds Prometheus without its Kubernetes discovery: promtool checks the job with a static target in its
    # place (the relabelling rules as written), and the discovery is the nodes' role.
    job = dict(scrape["scrape_configs"][0])
    assert job.pop("kubernetes_sd_configs") == [{"role": "node"}]
    config = tmp_path / "prometheus.yml"
    job["static_configs"] = [{"targets": ["10.0.0.1:10250"]}]
    config.write_text(yaml.safe_dump({"scrape_configs": [job]}))
    checked = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    defaults = role_defaults()
    port = defaults["device_plugin_dcgm_metrics_address"].rpartition(":")[2]
    assert port == daemon_source_constant("dcgm.py", "DEFAULT_ADDRESS").rpartition(":")[2] == "9400"
    keep, address = scrape["scrape_configs"][0]["relabel_configs"][:2]
    ((label, value),) = defaults["device_plugin_node_selector"].items()
    assert keep == {
        "source_labels": ["__meta_kubernetes_node_label_" + re.sub(r"[^A-Za-z0-9_]", "_", label)],
        "regex": value,
        "action": "keep",
    }
    assert address["replacement"] == "${1}:" + port
    names = []
    for template in ("daemonset.yml.j2", "dra-daemonset.yml.j2"):
        source = (ROLE / "templates" / template).read_text()
        names += re.findall(r"(?m)^kind: DaemonSet\nmetadata:\n  name: (\S+)", source)
        assert "- name: dcgm-metrics" in source, template
    assert monitor["metadata"]["namespace"] == defaults["device_plugin_namespace"]
    assert monitor["spec"]["selector"]["matchExpressions"] == [
        {"key": "app.kubernetes.io/name", "operator": "In", "values": names}
    ]
    assert names == ["gpuops-device-plugin", "gpuops-dra-plugin"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["honorLabels"]) == ("dcgm-metrics", True)


def daemon_source_constant(module: str, name: str) -> object:
    """A module-level constant of the daemon's package, read from its source."""
    tree = ast.parse((PLUGIN / "src" / "gpu_device_plugin" / module).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{module} declares no {name}")


def test_the_example_inventory_logs_in_as_an_unprivileged_user() -> None:
    inventory = yaml.safe_load((REPO / "inventory" / "example" / "group_vars" / "all.yml").read_text())
    readme = (REPO / "README.md").read_text()
    assert "unprivileged user with `sudo`" in readme
    assert inventory.get("ansible_user") not in (None, "root")
    assert not inventory.get("ansible_become")  # the playbooks become where they need to


def test_the_readme_names_every_module_in_its_layout_and_its_table() -> None:
    readme = (REPO / "README.md").read_text()
    layout = re.search(r"^plugins/modules/ +(.*?)^plugins/module_utils/", readme, re.M | re.S).group(1)
    listed = {name.strip() for name in layout.replace("\n", ",").split(",") if name.strip()}
    modules = {path.stem for path in (REPO / "plugins" / "modules").glob("*.py") if path.stem != "__init__"}
    assert listed == modules
    for name in modules:
        assert f"| `gpuops.k8s.{name}` |" in readme, name
    for role in (path.name for path in (REPO / "roles").iterdir() if path.is_dir()):
        assert f"| role `{role}` |" in readme, role


def test_the_readme_layout_names_every_role_and_playbook() -> None:
    readme = (REPO / "README.md").read_text()
    roles = re.search(r"^roles/ +(.*?)^playbooks/", readme, re.M | re.S).group(1)
    assert {name.strip() for name in roles.replace("\n", ",").split(",") if name.strip()} == {
        path.name for path in (REPO / "roles").iterdir() if path.is_dir()
    }
    playbooks = re.search(r"^playbooks/ +(.*)$", readme, re.M).group(1)
    assert set(re.findall(r"[\w-]+\.yml", playbooks)) == {path.name for path in (REPO / "playbooks").glob("*.yml")}


def layout_block() -> str:
    """The README's Layout block: a path column, then what is there (continued on indented lines)."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"^## Layout\n\n```\n(.*?)^```$", readme, re.M | re.S)
    assert block, "the README has no Layout block"
    return block.group(1)


def layout_entries(block: str) -> dict[str, str]:
    """Each path the block's left column names (a line may name several, comma-separated), with its description."""
    entries: dict[str, str] = {}
    names: list[str] = []
    for line in block.splitlines():
        if line[:1].strip():
            column, _sep, description = line.partition("  ")
            names = [name.strip().rstrip("/") for name in column.split(",") if name.strip()]
            entries.update(dict.fromkeys(names, ""))
        for name in names:
            entries[name] += " " + (description if line[:1].strip() else line).strip()
    return entries


def tree_files() -> list[str]:
    """The files git knows about, tracked and untracked but not ignored: what `make collection` mirrors."""
    listing = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    )
    return [path for path in listing.stdout.splitlines() if (REPO / path).exists()]


def test_the_readme_layout_names_every_directory_and_only_what_exists() -> None:
    # Every top-level directory, and every directory under plugins/, tests/ and extensions/, is named in the Layout
    # block (or a directory under it is); every path the block names exists.
    entries = layout_entries(layout_block())
    missing = sorted(name for name in entries if not (REPO / name).exists())
    assert not missing, f"the README's Layout names {missing}, which the tree does not have"
    directories = set()
    for path in tree_files():
        parts = path.split("/")
        if len(parts) > 1 and not parts[0].startswith("."):
            directories.add(parts[0])
            if parts[0] in ("plugins", "tests", "extensions") and len(parts) > 2:
                directories.add("/".join(parts[:2]))
    unnamed = sorted(
        directory
        for directory in directories
        if not any(name == directory or name.startswith(directory + "/") for name in entries)
    )
    assert not unnamed, f"the README's Layout does not name {unnamed}"


def test_the_readme_layout_names_every_filter_helper_and_meta_file() -> None:
    entries = layout_entries(layout_block())
    filters = {path.stem for path in (REPO / "plugins" / "filter").glob("*.py") if path.stem != "__init__"}
    listed = {name.strip() for name in entries["plugins/filter"].split(",") if name.strip()}
    assert listed == filters
    helpers = {path.stem for path in (REPO / "plugins" / "module_utils").glob("*.py") if path.stem != "__init__"}
    named = set(re.findall(r"\b_\w+", entries["plugins/module_utils"]))
    assert named == helpers, f"unnamed: {sorted(helpers - named)}, gone: {sorted(named - helpers)}"
    extensions = {path.name for path in (REPO / "extensions" / "eda").glob("*/**/*.*")}
    meta = {path.name for path in (REPO / "meta").iterdir()}
    unnamed = sorted(name for name in meta | extensions if not re.search(rf"\b{re.escape(name)}\b", layout_block()))
    assert not unnamed, f"the README's Layout does not name {unnamed}"


def test_every_role_readme_has_the_sections_a_user_looks_for_and_the_roles_platforms() -> None:
    for role in sorted(path for path in (REPO / "roles").iterdir() if path.is_dir()):
        readme = (role / "README.md").read_text()
        headings = re.findall(r"^## (.+)$", readme, re.M)
        for section in ("Requirements", "Supported platforms", "Example", "License"):
            assert section in headings, f"{role.name}/README.md has no section {section}"
        assert any("variables" in heading.lower() for heading in headings), f"{role.name}/README.md: no variables"
        assert "meta/argument_specs.yml" in readme, role.name
        platforms = yaml.safe_load((role / "meta" / "main.yml").read_text())["galaxy_info"]["platforms"]
        section = readme.split("## Supported platforms", 1)[1].split("\n## ", 1)[0]
        for version in (str(version) for platform in platforms for version in platform["versions"]):
            assert version in section, f"{role.name}/README.md does not name {version} of meta/main.yml"


def test_the_xid_classes_page_is_the_table() -> None:
    # docs/xid-classes.md shows the table of plugins/module_utils/_xid_classes.py row by row.
    sys.path.insert(0, str(REPO / "plugins" / "module_utils"))
    try:
        import _xid_classes as classes
    finally:
        sys.path.pop(0)
    page = (REPO / "docs" / "xid-classes.md").read_text()
    rows = {}
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0].isdigit():
            rows[int(cells[0])] = (cells[3].strip("`"), cells[2].strip("`"), cells[1])
    assert rows == classes.TABLE


def test_the_readme_names_every_place_make_test_full_adds_to() -> None:
    # Every e2e or integration module with tests marked full or cases for GPUOPS_TEST_FULL, every molecule scenario
    # that reads gpuops_test_full or that only make test-full runs (scripts/molecule.sh), and the demo when only
    # make test-full runs it, has its row in the README's table of what `make test-full` adds; and the table names
    # nothing that adds nothing.
    readme = (REPO / "README.md").read_text()
    table = re.search(r"What it adds to `make test`:\n\n(\|.*?)\n\n", readme, re.S)
    assert table, "the README has no table of what make test-full adds"
    rows = set(re.findall(r"^\| (`[^|]+`|molecule `\w+`|the demo) \|", table.group(1), re.M))
    marked = {
        f"`tests/{path.parent.name}/{path.name}`"
        for tier in ("e2e", "integration")
        for path in (REPO / "tests" / tier).glob("test_*.py")
        if re.search(r"pytest\.mark\.full\b|\"GPUOPS_TEST_FULL\"\)", path.read_text())
    }
    scenarios = {
        f"molecule `{path.parent.name}`"
        for path in (REPO / "molecule").glob("*/molecule.yml")
        if "gpuops_test_full" in "".join(p.read_text() for p in path.parent.rglob("*.yml"))
    }
    full_only = re.search(r"^full_only=\((.*)\)$", (REPO / "scripts" / "molecule.sh").read_text(), re.M).group(1)
    scenarios |= {f"molecule `{name}`" for name in full_only.split()}
    makefile = (REPO / "Makefile").read_text()
    tiers = [
        tier
        for group in ("FIRST_TIERS", "LANE1_TIERS", "LANE2_TIERS")
        for tier in re.search(rf"^{group} := (.*)$", makefile, re.M).group(1).split()
    ]
    assert re.search(r"^TIERS := \$\(FIRST_TIERS\) \$\(LANE1_TIERS\) \$\(LANE2_TIERS\)$", makefile, re.M)
    full_tiers = re.search(r"^FULL_TIERS := \$\(TIERS\) (.*)$", makefile, re.M).group(1).split()
    demo = {"the demo"} if "demo-test" in full_tiers and "demo-test" not in tiers else set()
    # ansible-core: make test runs sanity and units on the newest alone, make test-full on every minor.
    middle = {"the ansible-core minors between the oldest and the newest"} if len(ansible_core_matrix()) > 2 else set()
    assert re.search(r"^ANSIBLE_CORE_NEWEST := \$\(lastword \$\(ANSIBLE_CORE_MATRIX\)\)$", makefile, re.M)
    assert re.search(
        r"^ANSIBLE_CORE_RUN = \$\(if \$\(FULL\),\$\(ANSIBLE_CORE_MATRIX\),\$\(ANSIBLE_CORE_NEWEST\)\)$", makefile, re.M
    )
    for command in ("sanity", "units"):
        assert re.search(rf"^\tscripts/ansible-test-matrix.sh {command} \$\(ANSIBLE_CORE_RUN\)$", makefile, re.M)
    oldest = {"the oldest ansible-core's sanity and units"}
    # The daemon's suite: make test runs it under daemon-py39, make test-full also in the daemon tier.
    assert re.search(r"^DAEMON_SUITE = \$\(or \$\(FULL\),", makefile, re.M)
    daemon = {"the daemon's suite on the tools' Python"}
    pattern = (
        r"^\| (the ansible-core minors between the oldest and the newest|the oldest ansible-core's sanity and units"
        r"|the daemon's suite on the tools' Python) \|"
    )
    rows |= set(re.findall(pattern, table.group(1), re.M))
    assert rows == marked | scenarios | demo | middle | oldest | daemon
    assert "test-full:" in makefile


def test_the_job_template_rulebook_is_the_playbook_rulebook_but_for_its_action() -> None:
    rulebooks = REPO / "extensions" / "eda" / "rulebooks"
    (playbook_ruleset,) = yaml.safe_load((rulebooks / "gpu_remediation.yml").read_text())
    (job_template_ruleset,) = yaml.safe_load((rulebooks / "gpu_remediation_job_template.yml").read_text())
    playbook_rules = playbook_ruleset.pop("rules")
    job_template_rules = job_template_ruleset.pop("rules")
    assert job_template_ruleset == playbook_ruleset  # name, hosts, execution_strategy, sources
    assert [rule["name"] for rule in job_template_rules] == [rule["name"] for rule in playbook_rules]
    actions = []
    for playbook_rule, job_template_rule in zip(playbook_rules, job_template_rules):
        if "run_playbook" in playbook_rule.get("action", {}):
            actions.append((playbook_rule.pop("action"), job_template_rule.pop("action")))
        assert job_template_rule == playbook_rule, playbook_rule["name"]  # condition, throttle, any other action
    ((playbook_action, job_template_action),) = actions
    assert list(job_template_action) == ["run_job_template"]
    launch, run = job_template_action["run_job_template"], playbook_action["run_playbook"]
    assert launch == {
        "name": "{{ gpu_remediation_job_template | default('gpu-remediate') }}",
        "organization": "{{ gpu_remediation_organization | default('Default') }}",
        "job_args": {"limit": run["extra_vars"]["gpuops_alert_node"], "extra_vars": run["extra_vars"]},
    }
    assert run["extra_vars"]["gpuops_alert_node"] == "{{ event.gpu_alert.node }}"
    # The default job template is the one docs/awx.md creates for remediate.yml.
    awx = (REPO / "docs" / "awx.md").read_text()
    assert re.search(
        r"awx\.awx\.job_template:\n +name: gpu-remediate\n +project: \S+\n +playbook: remediate\.yml\n", awx
    )


def pins(name: str) -> dict[str, str]:
    """The ``name==version`` pins of requirements/NAME.txt."""
    return dict(
        line.split("==", 1) for line in (REPO / "requirements" / f"{name}.txt").read_text().splitlines() if "==" in line
    )


def ansible_core_matrix() -> list[tuple[str, str]]:
    """The Makefile's ANSIBLE_CORE_MATRIX: (ansible-core version, Python) from the oldest to the newest."""
    match = re.search(r"^ANSIBLE_CORE_MATRIX := (.+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert match, "the Makefile has no ANSIBLE_CORE_MATRIX"
    return [tuple(entry.split("/")) for entry in match[1].split()]


def minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int(parts[1])


def test_one_ansible_core_minimum_everywhere_and_it_is_the_one_ci_runs():
    """meta/runtime.yml's requires_ansible, each role's min_ansible_version and the README's controller line name
    one minimum, and that minimum is the oldest ansible-core CI runs (requirements/controller-oldest.txt): none is
    claimed that no test ran."""
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    match = re.fullmatch(r">=(\d+)\.(\d+)\.0", runtime["requires_ansible"])
    assert match, runtime["requires_ansible"]
    minimum = f"{match[1]}.{match[2]}"
    roles = {
        meta.parent.parent.name: str(yaml.safe_load(meta.read_text())["galaxy_info"]["min_ansible_version"])
        for meta in sorted(REPO.glob("roles/*/meta/main.yml"))
    }
    assert {name: version for name, version in roles.items() if version != minimum} == {}
    assert pins("controller-oldest")["ansible-core"].rsplit(".", 1)[0] == minimum
    readme = (REPO / "README.md").read_text()
    assert f"Controller: ansible-core {minimum} " in readme


def test_the_version_matrix_is_every_minor_from_the_oldest_to_the_newest_and_the_readme_says_it():
    """The Makefile's ANSIBLE_CORE_MATRIX (what sanity and units run on) holds one version per ansible-core minor,
    from the oldest controller's pin to the newest's with none left out, and the README's "Version matrix" table
    has the same rows: version and Python, and the ansible package beside the two controllers' versions."""
    matrix = ansible_core_matrix()
    oldest, newest = pins("controller-oldest"), pins("controller")
    assert matrix[0][0] == oldest["ansible-core"]
    assert matrix[-1][0] == newest["ansible-core"]
    minors = [minor(entry[0]) for entry in matrix]
    assert minors == [(minors[0][0], m) for m in range(minors[0][1], minors[-1][1] + 1)]
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("### Version matrix") :].split("\n\n")[2]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:] if line.startswith("|")
    ]
    packages = {oldest["ansible-core"]: oldest["ansible"], newest["ansible-core"]: newest["ansible"]}
    expected = [
        (f"{version} (ansible {packages[version]})" if version in packages else version, python)
        for version, python in matrix
    ]
    assert [(row[0], row[1]) for row in rows] == expected


def test_the_requirement_files_name_the_controller_they_run():
    """requirements/test.txt (the tools' environment, Python 3.11) and eda.txt are on the oldest controller, e2e.txt
    on the newest, and the execution environment's ansible-core is the oldest's (its base has Python 3.11)."""
    include = {
        name: re.findall(r"^-r (\S+)$", (REPO / "requirements" / f"{name}.txt").read_text(), re.MULTILINE)
        for name in ("test", "eda", "e2e")
    }
    assert "controller-oldest.txt" in include["test"] and "controller.txt" not in include["test"]
    assert "controller-oldest.txt" in include["eda"] and "controller.txt" not in include["eda"]
    assert "controller.txt" in include["e2e"] and "controller-oldest.txt" not in include["e2e"]
