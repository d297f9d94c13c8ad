#!/usr/bin/env python
"""AWX survey specs for the collection's playbooks, generated from the roles' argument specs.

meta/awx-survey.yml names, per playbook, the role options its survey asks; the type, description,
default, choices and whether an answer is required come from each option's meta/argument_specs.yml,
so a survey cannot drift from what the role accepts. docs/awx.md embeds the spec of site.yml.

  scripts/awx-survey.py site.yml                        # print the survey spec (JSON)
  scripts/awx-survey.py site.yml --check docs/awx.md    # exit 1 if the spec embedded there differs
  scripts/awx-survey.py site.yml --write docs/awx.md    # rewrite the spec embedded there
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
COLLECTION_PREFIX = "gpuops.k8s."

# argument_specs type -> AWX survey question type. bool becomes a multiplechoice true/false; list,
# dict and raw options have no survey form a role could read (an answer is one string).
QUESTION_TYPES = {"str": "text", "path": "text", "int": "integer", "float": "float", "bool": "multiplechoice"}
BOOL_CHOICES = ["true", "false"]
# What a question in meta/awx-survey.yml may set besides role and option: what an argument spec cannot say.
OVERRIDES = ("question_name", "required", "min", "max")

# Ansible's documentation markup, reduced to the text an operator reads in a survey form.
_MARKUP_LINK = re.compile(r"\b[LR]\(([^,()]*),[^()]*\)")
_MARKUP_PLUGIN = re.compile(r"\bP\(([^#()]*)#[^()]*\)")
_MARKUP_TEXT = re.compile(r"\b[BCEIMOUV]\(([^()]*)\)")


class SurveyError(Exception):
    """A problem with the selection, an argument spec or the document, said in one sentence."""


def shown(path: Path) -> str:
    """A path as the messages name it: relative to the repository when it lies inside."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def plain_text(description: str | list[str] | None) -> str:
    """An argument spec description as one line of plain text."""
    if description is None:
        return ""
    text = " ".join(description) if isinstance(description, list) else str(description)
    text = _MARKUP_LINK.sub(r"\1", text)
    text = _MARKUP_PLUGIN.sub(r"\1", text)
    text = _MARKUP_TEXT.sub(r"\1", text)
    return " ".join(text.split())


def load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise SurveyError(f"{shown(path)}: cannot be read ({err.strerror}).") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise SurveyError(f"{shown(path)}: is not valid YAML{where}.") from err


def role_options(roles_dir: Path, role: str, where: str) -> dict[str, dict[str, Any]]:
    """The options of a role's main entry point."""
    spec_file = roles_dir / role / "meta" / "argument_specs.yml"
    if not spec_file.is_file():
        raise SurveyError(
            f"{where} names role '{role}', which has no meta/argument_specs.yml under {shown(roles_dir)}."
        )
    data = load_yaml(spec_file) or {}
    try:
        options = data["argument_specs"]["main"]["options"]
    except (KeyError, TypeError) as err:
        raise SurveyError(f"{shown(spec_file)}: has no argument_specs.main.options.") from err
    if not isinstance(options, dict):
        raise SurveyError(f"{shown(spec_file)}: argument_specs.main.options is not a mapping.")
    return options


_ROLE_TASKS = ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role")


def _task_roles(tasks: Any) -> set[str]:
    """The roles that include_role / import_role tasks name, in blocks and their rescue and always too."""
    roles: set[str] = set()
    for task in tasks if isinstance(tasks, list) else []:
        if not isinstance(task, dict):
            continue
        for key in ("block", "rescue", "always"):
            roles |= _task_roles(task.get(key))
        for action in _ROLE_TASKS:
            name = (task.get(action) or {}).get("name") if isinstance(task.get(action), dict) else None
            if isinstance(name, str):
                roles.add(name.removeprefix(COLLECTION_PREFIX))
    return roles


def playbook_roles(playbook: Path) -> set[str]:
    """The roles a playbook's plays run (their `roles:` lists, and include_role / import_role tasks), without the
    collection prefix."""
    plays = load_yaml(playbook) or []
    roles: set[str] = set()
    for play in plays if isinstance(plays, list) else []:
        for entry in (play or {}).get("roles") or []:
            name = entry if isinstance(entry, str) else (entry or {}).get("role") or (entry or {}).get("name")
            if isinstance(name, str):
                roles.add(name.removeprefix(COLLECTION_PREFIX))
        for section in ("pre_tasks", "tasks", "post_tasks"):
            roles |= _task_roles((play or {}).get(section))
    return roles


def _default(option: str, spec: dict[str, Any], kind: str, where: str) -> Any:
    default = spec.get("default")
    if isinstance(default, str) and "{{" in default:
        raise SurveyError(
            f"{where} asks {option}, whose default ({default}) is a template only the role can evaluate;"
            " leave it out of the survey."
        )
    if default is None:
        return ""
    if kind == "bool":
        return "true" if default else "false"
    if kind == "int":
        return int(default)
    if kind == "float":
        return float(default)
    return str(default)


def question(role: str, option: str, spec: dict[str, Any], entry: dict[str, Any], where: str) -> dict[str, Any]:
    """One survey question for a role option, from its argument spec and the selection entry."""
    kind = spec.get("type", "str")
    if kind not in QUESTION_TYPES:
        raise SurveyError(
            f"{where} asks {option}, an option of type {kind}: a survey answer is one string, which role {role}"
            " would not read as that type; leave it out of the survey."
        )
    choices: list[str] | str = ""
    if spec.get("no_log"):
        qtype = "password"
    elif kind == "bool":
        qtype, choices = "multiplechoice", list(BOOL_CHOICES)
    elif spec.get("choices"):
        qtype, choices = "multiplechoice", [str(choice) for choice in spec["choices"]]
    else:
        qtype = QUESTION_TYPES[kind]
    default = _default(option, spec, kind, where)
    if qtype == "multiplechoice" and default != "" and default not in choices:
        raise SurveyError(f"{where} asks {option}, whose default {default!r} is not one of its choices {choices}.")

    for key in entry:
        if key not in ("role", "option", *OVERRIDES):
            raise SurveyError(
                f"{where} sets '{key}', which comes from the argument spec;"
                f" a question can set only {', '.join(OVERRIDES)}."
            )
    name = entry.get("question_name", option)
    if not isinstance(name, str) or not name.strip():
        raise SurveyError(f"{where} has a question_name that is not a non-empty string.")
    required = entry.get("required", bool(spec.get("required", False)))
    if not isinstance(required, bool):
        raise SurveyError(f"{where} has required: {required!r}; it must be true or false.")
    limits: dict[str, int | None] = {}
    for key in ("min", "max"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise SurveyError(f"{where} has {key}: {value!r}; AWX takes an integer there.")
        limits[key] = value
    return {
        "question_name": name.strip(),
        "question_description": plain_text(spec.get("description")),
        "variable": option,
        "type": qtype,
        "required": required,
        "default": default,
        "choices": choices,
        "min": limits["min"],
        "max": limits["max"],
    }


def build_survey(playbook: str, selection_file: Path, roles_dir: Path, playbooks_dir: Path) -> dict[str, Any]:
    """The AWX survey spec of a playbook."""
    selection = load_yaml(selection_file) or {}
    source = shown(selection_file)
    if not isinstance(selection, dict):
        raise SurveyError(f"{source}: is not a mapping of playbook names to surveys.")
    key = Path(playbook).name
    if key not in selection:
        known = ", ".join(sorted(selection)) or "none"
        raise SurveyError(f"{source} has no survey for {key}; it has surveys for {known}.")
    survey = selection[key] or {}
    entries = survey.get("questions") if isinstance(survey, dict) else None
    if not isinstance(entries, list) or not entries:
        raise SurveyError(f"{source}: {key} needs a non-empty list of questions (AWX refuses an empty survey).")
    for field in ("name", "description"):
        if not isinstance(survey.get(field), str):
            raise SurveyError(f"{source}: {key} needs a {field} (a string).")

    # A bare name is one of the collection's playbooks, even where the current directory has a file of that name.
    given = Path(playbook)
    playbook_file = given if given.parent != Path() and given.is_file() else playbooks_dir / key
    if not playbook_file.is_file():
        raise SurveyError(f"{source}: {key} is not a playbook under {shown(playbooks_dir)}.")
    runs = playbook_roles(playbook_file)

    spec: list[dict[str, Any]] = []
    for number, entry in enumerate(entries, start=1):
        where = f"{source}: {key} question {number}"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("role"), str)
            or not isinstance(entry.get("option"), str)
        ):
            raise SurveyError(f"{where} needs a role and an option (strings).")
        role, option = entry["role"].removeprefix(COLLECTION_PREFIX), entry["option"]
        options = role_options(roles_dir, role, where)
        if option not in options:
            raise SurveyError(
                f"{where} names option '{option}', which the argument spec of role {role}"
                f" ({shown(roles_dir / role / 'meta' / 'argument_specs.yml')}) does not have."
            )
        if role not in runs:
            raise SurveyError(f"{where} asks an option of role {role}, which {shown(playbook_file)} does not run.")
        if any(asked["variable"] == option for asked in spec):
            raise SurveyError(f"{where} asks {option} a second time.")
        spec.append(question(role, option, options[option] or {}, entry, where))
    return {"name": survey["name"], "description": survey["description"], "spec": spec}


def render(survey: dict[str, Any]) -> str:
    return json.dumps(survey, indent=2, ensure_ascii=False) + "\n"


def markers(playbook: str) -> tuple[str, str]:
    key = Path(playbook).name
    return f"<!-- awx-survey {key} -->", f"<!-- /awx-survey {key} -->"


def embedded_block(document: str, playbook: str, doc_path: Path) -> tuple[int, int, str]:
    """Where the generated block sits in a document (start and end offsets of its body) and the body."""
    begin, end = markers(playbook)
    start = document.find(begin)
    stop = document.find(end, start + len(begin)) if start >= 0 else -1
    if start < 0 or stop < 0:
        raise SurveyError(f"{shown(doc_path)} has no block between '{begin}' and '{end}' to hold the survey spec.")
    body_start = start + len(begin)
    return body_start, stop, document[body_start:stop]


def block_body(survey_json: str) -> str:
    return f"\n```json\n{survey_json}```\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="AWX survey specs generated from the roles' argument specs.")
    parser.add_argument("playbook", help="site.yml, upgrade_driver.yml (a name under playbooks/, or a path)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", metavar="DOC", type=Path, help="exit 1 if the spec embedded in DOC differs")
    action.add_argument("--write", metavar="DOC", type=Path, help="rewrite the spec embedded in DOC")
    parser.add_argument("--selection", type=Path, default=REPO / "meta" / "awx-survey.yml", help=argparse.SUPPRESS)
    parser.add_argument("--roles", type=Path, default=REPO / "roles", help=argparse.SUPPRESS)
    parser.add_argument("--playbooks", type=Path, default=REPO / "playbooks", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    try:
        survey_json = render(build_survey(args.playbook, args.selection, args.roles, args.playbooks))
        if args.check is None and args.write is None:
            sys.stdout.write(survey_json)
            return 0
        doc_path: Path = args.check or args.write
        try:
            document = doc_path.read_text(encoding="utf-8")
        except OSError as err:
            raise SurveyError(f"{shown(doc_path)}: cannot be read ({err.strerror}).") from err
        start, stop, current = embedded_block(document, args.playbook, doc_path)
        wanted = block_body(survey_json)
        if args.write is not None:
            if current != wanted:
                doc_path.write_text(document[:start] + wanted + document[stop:], encoding="utf-8")
            return 0
        if current != wanted:
            begin = markers(args.playbook)[0]
            sys.stderr.write(
                f"{shown(doc_path)}: the survey spec after '{begin}' differs from what {shown(args.selection)}"
                " and the roles' argument specs give;"
                f" run scripts/awx-survey.py {Path(args.playbook).name} --write {doc_path}\n"
            )
            sys.stderr.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True), wanted.splitlines(keepends=True), "embedded", "generated"
                )
            )
            return 1
        return 0
    except SurveyError as err:
        sys.stderr.write(f"awx-survey: {err}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
