# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The last resort of every module's main(): an exception nothing expected still reaches Ansible as fail_json.

Every error a module expects is already one sentence naming what and where. Anything else is a bug: it is
reported as one sentence naming the module and the exception, with the traceback in the result's
``exception`` field (what ``-vvv`` shows), instead of a traceback on the module's stderr, which Ansible (and
Mitogen, which reports it as a deserialization error) shows as a "MODULE FAILURE"."""

from __future__ import annotations

import traceback


def unexpected_error_message(module_name, exc):
    """One sentence for an exception the module did not expect."""
    detail = str(exc).strip().rstrip(".") or "no detail"
    return (
        f"{module_name} failed on an unexpected {type(exc).__name__} ({detail}); "
        "this is a bug in the module, and -vvv shows where."
    )


def run_or_fail(module, module_name, body):
    """Run ``body(module)``; an unexpected exception ends the module with fail_json and one sentence.

    exit_json and fail_json end the module with SystemExit, which is not an Exception and passes through."""
    try:
        body(module)
    except Exception as exc:  # pylint: disable=broad-exception-caught  # the last resort, by design
        module.fail_json(msg=unexpected_error_message(module_name, exc), exception=traceback.format_exc())
