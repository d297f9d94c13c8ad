"""The AWX survey generator, scripts/awx-survey.py, against the roles' argument specs and docs/awx.md.

The generator runs as a program, the way docs/awx.md tells operators to run it. Its output is checked
against the argument specs read here independently, against the rules AWX's API applies when a survey
spec is posted (awx/api/views JobTemplateSurveySpec), and against the copy embedded in docs/awx.md. A
changed argument spec (in a copy of roles/) must change the survey, and a selection that names something
no role has must fail with one sentence. No peer is involved: AWX itself is not run here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "awx-survey.py"
SELECTION = REPO / "meta" / "awx-survey.yml"
DOC = REPO / "docs" / "awx.md"
PLAYBOOKS = sorted(yaml.safe_load(SELECTION.read_text(encoding="utf-8")))

# The question types AWX accepts, and the Python type it wants a default of each to have.
AWX_DEFAULT_TYPES = {
    "text": str,
    "textarea": str,
    "password": str,
    "multiplechoice": str,
    "multiselect": str,
    "integer": int,
    "float": float,
}
SCALAR_TYPES = {"str": "text", "path": "text", "int": "integer", "float": "float"}


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def generated(playbook: str, *args: str | Path) -> dict:
    proc = run(playbook, *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def one_sentence(proc: subprocess.CompletedProcess[str]) -> str:
    """The generator's error: exit status 2, one line on stderr, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("awx-survey: ") and lines[0].endswith("."), lines[0]
    assert "Traceback" not in proc.stderr
    return lines[0]


def role_options(roles_dir: Path = REPO / "roles") -> dict[str, tuple[str, dict]]:
    """Every option of every role's main entry point: name -> (role, its argument spec)."""
    options: dict[str, tuple[str, dict]] = {}
    for spec_file in sorted(roles_dir.glob("*/meta/argument_specs.yml")):
        role = spec_file.parts[-3]
        for name, spec in yaml.safe_load(spec_file.read_text(encoding="utf-8"))["argument_specs"]["main"][
            "options"
        ].items():
            options[name] = (role, spec or {})
    return options


def plain(description: str | list[str] | None) -> str:
    """Ansible's documentation markup as plain text: C(x) -> x, P(name#type) -> name, L(text,url) -> text."""
    text = " ".join(description) if isinstance(description, list) else (description or "")
    text = re.sub(r"\b[LR]\(([^,()]*),[^()]*\)", r"\1", text)
    text = re.sub(r"\bP\(([^#()]*)#[^()]*\)", r"\1", text)
    text = re.sub(r"\b[A-Z]\(([^()]*)\)", r"\1", text)
    return " ".join(text.split())


def write_selection(path: Path, questions: list[dict], playbook: str = "site.yml") -> Path:
    path.write_text(
        yaml.safe_dump({playbook: {"name": "test", "description": "test", "questions": questions}}), encoding="utf-8"
    )
    return path


def embedded_site_survey(document: str) -> dict:
    block = re.search(
        r"<!-- awx-survey site\.yml -->\n```json\n(.*?)```\n<!-- /awx-survey site\.yml -->", document, re.S
    )
    assert block, "docs/awx.md has no generated survey block for site.yml"
    return json.loads(block.group(1))


@pytest.fixture(scope="module")
def surveys() -> dict[str, dict]:
    return {playbook: generated(playbook) for playbook in PLAYBOOKS}


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_every_question_is_the_argument_spec_of_a_role_option(surveys, playbook):
    options = role_options()
    selection = {entry["option"]: entry for entry in yaml.safe_load(SELECTION.read_text())[playbook]["questions"]}
    asked = surveys[playbook]["spec"]
    assert [q["variable"] for q in asked] == list(selection)
    for question in asked:
        variable = question["variable"]
        assert variable in options, f"{variable} is no option of any role's argument spec"
        role, spec = options[variable]
        assert selection[variable]["role"] == role
        kind = spec.get("type", "str")
        if spec.get("no_log"):
            assert question["type"] == "password"
        elif kind == "bool":
            assert (question["type"], question["choices"]) == ("multiplechoice", ["true", "false"])
            assert question["default"] == ("true" if spec.get("default") else "false")
        elif spec.get("choices"):
            assert (question["type"], question["choices"]) == ("multiplechoice", [str(c) for c in spec["choices"]])
        else:
            assert question["type"] == SCALAR_TYPES[kind], (variable, kind)
            assert question["choices"] == ""
        if kind != "bool":
            assert question["default"] == ("" if spec.get("default") is None else spec["default"]), variable
        assert question["question_description"] == plain(spec.get("description"))
        assert question["required"] == selection[variable].get("required", spec.get("required", False))
        for limit in ("min", "max"):
            assert question[limit] == selection[variable].get(limit)


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_survey_passes_awx_validation(surveys, playbook):
    """What AWX checks when the spec is posted to /api/v2/job_templates/N/survey_spec/."""
    survey = surveys[playbook]
    assert isinstance(survey["name"], str) and isinstance(survey["description"], str)
    assert isinstance(survey["spec"], list) and survey["spec"], "AWX refuses a survey without questions"
    variables = [q["variable"] for q in survey["spec"]]
    assert len(variables) == len(set(variables)), "AWX refuses a variable asked twice"
    for question in survey["spec"]:
        assert question["type"] in AWX_DEFAULT_TYPES
        for field in ("question_name", "variable"):
            assert isinstance(question[field], str) and question[field]
        assert isinstance(question["required"], bool)
        if question["default"] != "":
            default = question["default"]
            assert isinstance(default, AWX_DEFAULT_TYPES[question["type"]]) and not isinstance(default, bool), question
        for limit in ("min", "max"):
            value = question[limit]
            assert value is None or (isinstance(value, int) and not isinstance(value, bool)), question
        if question["type"] == "multiplechoice":
            assert isinstance(question["choices"], list) and question["choices"]
            assert question["default"] in ["", *question["choices"]]


def unconverted_reads(name: str, sources: list[Path]) -> list[str]:
    """The lines of `sources` that read the variable `name` without turning it into a boolean.

    Accepted: `name | bool` (perhaps after `| default(...)`), `name` as the whole value of a module
    argument, which the module converts by its own argument spec, and `name: true` or `name: false`, a boolean
    the YAML gives it (an include's vars), which is no read.
    """
    mentioned = re.compile(rf"\b{name}\b")
    converted = re.compile(rf"\b{name}\s*(\|\s*default\([^()]*\)\s*)?\|\s*bool\b")
    module_argument = re.compile(rf'^\s*[A-Za-z_]+:\s*"\{{\{{\s*{name}\s*\}}\}}"\s*$')
    set_to_a_boolean = re.compile(rf"^\s*{name}:\s*(true|false)\s*(#.*)?$")
    found = []
    for path in sources:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.lstrip().startswith("#") or module_argument.match(line) or set_to_a_boolean.match(line):
                continue
            if len(mentioned.findall(line)) > len(converted.findall(line)):
                found.append(f"{path}:{number}: {line.strip()}")
    return found


def test_bool_questions_are_read_as_booleans_by_the_roles(surveys):
    """A survey answer is the string "true" or "false", and "false" is a true value to Jinja: every
    place a role or playbook reads an asked bool option must make it a boolean itself."""
    options = role_options()
    asked = {q["variable"] for survey in surveys.values() for q in survey["spec"]}
    bools = sorted(name for name in asked if options[name][1].get("type") == "bool")
    assert bools, "no bool question to check"
    sources = [
        path
        for path in [*(REPO / "roles").rglob("*"), *(REPO / "playbooks").rglob("*.yml")]
        if path.suffix in (".yml", ".j2") and path.parent.name not in ("meta", "defaults")
    ]
    for name in bools:
        assert any(re.search(rf"\b{name}\b", path.read_text(encoding="utf-8")) for path in sources), name
        assert unconverted_reads(name, sources) == [], f"{name} is read without | bool, but a survey answer is a string"


def test_unconverted_reads_finds_a_string_read_as_a_boolean(tmp_path):
    tasks = tmp_path / "main.yml"
    tasks.write_text(
        "- name: read as it comes\n"
        "  when: flag\n"
        "- ansible.builtin.debug:\n"
        "    msg: \"{{ 'on' if flag else 'off' }}\"\n"
        "- ansible.builtin.debug:\n"
        '    msg: "{{ flag | bool }} {{ flag | default(true) | bool }}"\n'
        "  # flag in a comment\n"
        "- ansible.builtin.copy:\n"
        '    backup: "{{ flag }}"\n',
        encoding="utf-8",
    )
    assert [read.split(": ", 1)[0] for read in unconverted_reads("flag", [tasks])] == [f"{tasks}:2", f"{tasks}:4"]


def test_docs_embed_the_current_site_survey():
    proc = run("site.yml", "--check", DOC)
    assert proc.returncode == 0, proc.stderr
    assert embedded_site_survey(DOC.read_text(encoding="utf-8")) == generated("site.yml")


def test_check_names_a_stale_copy_and_write_replaces_only_it(tmp_path):
    document = DOC.read_text(encoding="utf-8")
    stale = document.replace('"default": 180', '"default": 170', 1)
    assert stale != document
    doc = tmp_path / "awx.md"
    doc.write_text(stale, encoding="utf-8")

    proc = run("site.yml", "--check", doc)
    assert proc.returncode == 1
    first = proc.stderr.splitlines()[0]
    assert str(doc) in first and "differs" in first and f"--write {doc}" in first, first
    assert '-      "default": 170,' in proc.stderr and '+      "default": 180,' in proc.stderr

    assert run("site.yml", "--write", doc).returncode == 0
    assert doc.read_text(encoding="utf-8") == document
    assert run("site.yml", "--check", doc).returncode == 0


def test_a_document_without_the_markers_is_one_sentence(tmp_path):
    doc = tmp_path / "awx.md"
    doc.write_text("# AWX\n", encoding="utf-8")
    message = one_sentence(run("site.yml", "--check", doc))
    assert "<!-- awx-survey site.yml -->" in message


def test_an_unknown_role_is_one_sentence(tmp_path):
    selection = write_selection(tmp_path / "survey.yml", [{"role": "nvidia_drivr", "option": "nvidia_driver_branch"}])
    message = one_sentence(run("site.yml", "--selection", selection))
    assert "site.yml question 1 names role 'nvidia_drivr'" in message


def test_an_unknown_option_is_one_sentence(tmp_path):
    selection = write_selection(tmp_path / "survey.yml", [{"role": "nvidia_driver", "option": "nvidia_driver_brnch"}])
    message = one_sentence(run("site.yml", "--selection", selection))
    assert "names option 'nvidia_driver_brnch'" in message and "role nvidia_driver" in message


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ({"role": "device_plugin", "option": "device_plugin_service_extra"}, "of type list"),
        ({"role": "device_plugin", "option": "device_plugin_config"}, "of type dict"),
        ({"role": "gpu_node_labels", "option": "gpu_node_labels_node_name"}, "is a template"),
        ({"role": "nvidia_driver", "option": "nvidia_driver_branch", "default": "580"}, "sets 'default'"),
        ({"role": "nvidia_driver", "option": "nvidia_driver_branch", "min": "1"}, "integer"),
    ],
    ids=["list", "dict", "templated-default", "override-from-spec", "min-not-int"],
)
def test_what_a_survey_cannot_ask_is_one_sentence(tmp_path, question, expected):
    selection = write_selection(tmp_path / "survey.yml", [question])
    assert expected in one_sentence(run("site.yml", "--selection", selection))


def test_an_option_of_a_role_the_playbook_does_not_run_is_one_sentence(tmp_path):
    selection = write_selection(
        tmp_path / "survey.yml",
        [{"role": "container_toolkit", "option": "container_toolkit_version"}],
        "upgrade_driver.yml",
    )
    message = one_sentence(run("upgrade_driver.yml", "--selection", selection))
    assert "role container_toolkit" in message and "playbooks/upgrade_driver.yml does not run" in message


def test_a_playbook_without_a_survey_is_one_sentence():
    assert "no survey for validate.yml" in one_sentence(run("validate.yml"))


def test_each_argument_spec_type_has_its_question_type(tmp_path):
    questions = [
        {"role": "container_toolkit", "option": "container_toolkit_version"},
        {"role": "container_toolkit", "option": "container_toolkit_cdi_output"},
        {"role": "gpu_node_labels", "option": "gpu_node_labels_taint_effect", "question_name": "Taint effect"},
        {"role": "gpu_node_labels", "option": "gpu_node_labels_taint", "required": True},
        {"role": "gpu_node_labels", "option": "gpu_node_labels_api_key"},
        {"role": "device_plugin", "option": "device_plugin_pod_timeout", "min": 10, "max": 600},
    ]
    spec = generated("site.yml", "--selection", write_selection(tmp_path / "survey.yml", questions))["spec"]
    asked = {q["variable"]: q for q in spec}
    assert asked["container_toolkit_version"] == {
        "question_name": "container_toolkit_version",
        "question_description": "Toolkit version for all four packages.",
        "variable": "container_toolkit_version",
        "type": "text",
        "required": False,
        "default": "1.18.1",
        "choices": "",
        "min": None,
        "max": None,
    }
    assert (asked["container_toolkit_cdi_output"]["type"], asked["container_toolkit_cdi_output"]["default"]) == (
        "text",
        "/var/run/cdi/nvidia.yaml",
    )
    effect = asked["gpu_node_labels_taint_effect"]
    assert (effect["question_name"], effect["type"], effect["default"]) == (
        "Taint effect",
        "multiplechoice",
        "NoSchedule",
    )
    assert effect["choices"] == ["NoSchedule", "PreferNoSchedule", "NoExecute"]
    taint = asked["gpu_node_labels_taint"]
    assert (taint["type"], taint["choices"], taint["default"], taint["required"]) == (
        "multiplechoice",
        ["true", "false"],
        "true",
        True,
    )
    assert (asked["gpu_node_labels_api_key"]["type"], asked["gpu_node_labels_api_key"]["default"]) == ("password", "")
    timeout = asked["device_plugin_pod_timeout"]
    assert (timeout["type"], timeout["default"], timeout["min"], timeout["max"]) == ("integer", 180, 10, 600)


def test_a_changed_argument_spec_changes_the_survey(tmp_path):
    roles = tmp_path / "roles"
    shutil.copytree(REPO / "roles", roles, ignore=shutil.ignore_patterns("__pycache__"))
    spec_file = roles / "device_plugin" / "meta" / "argument_specs.yml"
    spec = spec_file.read_text(encoding="utf-8")
    old_description = (
        "Seconds to wait for the node's plugin pod to be ready (daemonset mode), or gone (a node moving to systemd"
        " mode)."
    )
    new_description = "How long C(site.yml) waits for the pod."
    assert spec.count("default: 180") == 1 and spec.count(old_description) == 1
    spec = spec.replace("default: 180", "default: 240").replace(old_description, new_description)
    spec_file.write_text(spec, encoding="utf-8")

    before = generated("site.yml")
    after = generated("site.yml", "--roles", roles)
    changed = [q for q in after["spec"] if q not in before["spec"]]
    assert [q["variable"] for q in changed] == ["device_plugin_pod_timeout"]
    assert changed[0]["default"] == 240
    assert changed[0]["question_description"] == "How long site.yml waits for the pod."
    proc = run("site.yml", "--check", DOC, "--roles", roles)
    assert proc.returncode == 1 and "differs" in proc.stderr
