# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the tests of the roles' decisions share within one pytest process, so that each test pays only for its own
rendering: the roles' vars files parsed once, and each Jinja template source compiled once.

ansible-test runs every unit test in a process forked from its pytest worker (its ansible_forked plugin), so what a
test computes dies with it; a fixture of any scope is set up again in each test's process. What is shared has to be
in the worker before the forks: conftest.py calls warm() when the worker has collected its tests. The forks also keep
the tests independent: nothing a test does reaches the next one.

- role_file(): a vars or defaults file as Ansible's DataLoader parses it, parsed once. Each caller gets its own
  top-level dict; the values are shared, and nothing here (nor Ansible's templar) changes them.
- Jinja's Environment.compile turns a template source into Python code, which Environment.from_string then binds to
  the environment at hand (the step Jinja's own bytecode cache skips for a template loaded again). Ansible compiles
  every template string anew at each render, the same vars/main.yml expressions some hundred times a test. The code
  is kept per source and per everything of the environment that the compilation reads (its syntax, extensions,
  finalize, Ansible's backslash escaping); a source that fails to compile is not kept and fails each time.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import jinja2
from ansible.parsing.dataloader import DataLoader

try:  # Ansible's own environment and the compile-time switch of its lexer (ansible-core 2.19 and later).
    from ansible._internal._templating._jinja_bits import AnsibleEnvironment, _TemplateCompileContext
except ImportError:  # another layout: no code is kept, each template compiles as Ansible does it
    AnsibleEnvironment = _TemplateCompileContext = None

ROLES = Path(__file__).resolve().parents[3] / "roles"

_FILES: dict[str, dict] = {}
_CODE: dict[tuple, object] = {}


def role_file(path: Path) -> dict:
    """PATH (a role's defaults or vars file) as the role's vars, parsed once per process; a dict of the caller's."""
    key = str(path)
    if key not in _FILES:
        _FILES[key] = DataLoader().load_from_file(key, trusted_as_template=True) or {}
    return dict(_FILES[key])


def _compile_key(env: jinja2.Environment, source: str, name, filename, defer_init) -> tuple:
    context = _TemplateCompileContext.current(optional=True)
    return (
        type(env),
        str.__str__(source),
        name,
        filename,
        defer_init,
        bool(context and context.escape_backslashes),
        env.block_start_string,
        env.block_end_string,
        env.variable_start_string,
        env.variable_end_string,
        env.comment_start_string,
        env.comment_end_string,
        env.line_statement_prefix,
        env.line_comment_prefix,
        env.trim_blocks,
        env.lstrip_blocks,
        env.newline_sequence,
        env.keep_trailing_newline,
        tuple(sorted(env.extensions)),
        env.finalize,
        env.autoescape,
        env.optimized,
        env.is_async,
        env.code_generator_class,
        getattr(env, "_debuggable_template_source", False),
    )


def _compile_once(self, source, name=None, filename=None, raw=False, defer_init=False):
    if raw or not isinstance(source, str) or getattr(self, "_debuggable_template_source", False):
        return _jinja_compile(self, source, name, filename, raw, defer_init)
    key = _compile_key(self, source, name, filename, defer_init)
    code = _CODE.get(key)
    if code is None:
        code = _CODE[key] = _jinja_compile(self, source, name, filename, raw, defer_init)
    return code


_jinja_compile = jinja2.Environment.compile


def install() -> None:
    """Keep the code of each template source Ansible's environments compile, in this process."""
    if AnsibleEnvironment is not None and AnsibleEnvironment.compile is _jinja_compile:
        AnsibleEnvironment.compile = _compile_once


def _templates(value) -> list[str]:
    if isinstance(value, str):
        return [value] if any(mark in value for mark in ("{{", "{%", "{#")) else []
    if isinstance(value, dict):
        return [text for item in value.values() for text in _templates(item)]
    if isinstance(value, list):
        return [text for item in value for text in _templates(item)]
    return []


def warm() -> None:
    """Parse every role's defaults/main.yml and vars files, and compile their templates as Ansible's templar does
    (with its backslash escaping): what each test would otherwise do again in its own process."""
    install()
    files = sorted(ROLES.glob("*/defaults/main.yml")) + sorted(ROLES.glob("*/vars/*.yml"))
    sources = {text for path in files for text in _templates(role_file(path))}
    if AnsibleEnvironment is None:
        return
    env = AnsibleEnvironment()
    with _TemplateCompileContext(escape_backslashes=True):
        for source in sorted(sources):
            with contextlib.suppress(Exception):  # it fails again where a test renders it
                env.compile(source)
