# A module run in-process for unit tests: AnsibleModule.exit_json and fail_json raise these exceptions (the
# `patched` fixture, which conftest.py offers to the tests here, installs them), so a test reads the result
# instead of the process exiting. They are SystemExit, as what the real ones raise, so a module's last resort
# (module_utils/_last_resort.py) lets them pass as it does in a real run.
from __future__ import annotations

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args


class ModuleExit(SystemExit):
    def __init__(self, result):
        super().__init__(result)
        self.result = result


class ModuleFail(SystemExit):
    def __init__(self, result):
        super().__init__(result)
        self.result = result


def _exit_json(self, **kwargs):
    kwargs.setdefault("changed", False)
    raise ModuleExit(kwargs)


def _fail_json(self, msg, **kwargs):
    kwargs["msg"] = msg
    raise ModuleFail(kwargs)


def patch_exits(monkeypatch):
    """Make exit_json and fail_json raise ModuleExit and ModuleFail."""
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail_json)


def run_module(main, args):
    """Run a module's main() with ARGS (check and diff mode as _ansible_* keys); its exit_json result."""
    with patch_module_args(args), pytest.raises(ModuleExit) as done:
        main()
    return done.value.result


def fail_module(main, args):
    """Run a module's main() with ARGS, which must fail; its fail_json result."""
    with patch_module_args(args), pytest.raises(ModuleFail) as failed:
        main()
    return failed.value.result
