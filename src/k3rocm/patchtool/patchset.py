"""Apply, check and report the kimi-k3-rocm patch series on a vLLM tree: the
series of the release line for the tree's vLLM version (patches/<version>/,
k3rocm.patchtool.lines), or the one --series names.

    python -m k3rocm.patchtool.patchset {check,apply,status} --target DIR [--json]

DIR holds the ``vllm/`` package (site-packages or a source tree); without
``--target`` the installed vLLM is used. ``apply`` is all or nothing and
idempotent. Runs on one tree take turns (a lock file in DIR), and each first
finishes an apply that a crash interrupted (see ``k3rocm.patchtool.journal``).
Exit codes: 0 done (or already applied), 1 refused or failed
(the message says why and what to do), 2 usage error, 3 the tree already
contains the upstream change (nothing to apply).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from k3rocm.common.line_log import line_logger
from k3rocm.common.states import PatchState
from k3rocm.patchtool.lines import line_for_version
from k3rocm.patchtool.lock import Refusal
from k3rocm.patchtool.patching import (
    DEFAULT_LOCK_TIMEOUT,
    AlreadyUpstream,
    apply,
    check,
    find_installed_target,
    read_vllm_version,
    require_vllm_package,
    status,
)
from k3rocm.patchtool.series import Series, SeriesError

EXIT_OK, EXIT_REFUSED, EXIT_UPSTREAM = 0, 1, 3

_APPLIED = "series {series_id} on vLLM {vllm_version} in {target}"
_MESSAGES = {  # command -> outcome -> message
    "apply": {
        "done": "applied series {series_id} to vLLM {vllm_version} in {target}",
        PatchState.APPLIED: "already applied: " + _APPLIED,
    },
    "check": {
        PatchState.PRISTINE: "series {series_id} applies cleanly to vLLM "
        "{vllm_version} in {target}",
        PatchState.APPLIED: "already applied: " + _APPLIED,
    },
    "status": {
        PatchState.PRISTINE: "not applied: vLLM {vllm_version} in {target} is pristine",
        PatchState.APPLIED: "applied: " + _APPLIED,
        PatchState.UPSTREAM: "upstream: vLLM {vllm_version} in {target} already "
        "has the change",
    },
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3rocm.patchtool.patchset", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("command", choices=["check", "apply", "status"])
    parser.add_argument(
        "--target",
        type=Path,
        help="directory that holds vllm/ (default: the installed vLLM)",
    )
    parser.add_argument(
        "--series",
        type=Path,
        help="series directory (default: the release line of the target's vLLM)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--lock-timeout",
        type=float,
        default=DEFAULT_LOCK_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait for another run on the same tree (default: 60)",
    )
    args = parser.parse_args(argv)

    def say_waiting(lock: Path) -> None:
        line_logger("k3rocm.patchtool.patchset")(
            f"waiting for another run on this tree ({lock})"
        )

    try:
        target = (args.target or find_installed_target()).resolve()
        if args.series:
            series = Series(args.series)
        else:
            require_vllm_package(target)
            series = line_for_version(read_vllm_version(target))
        action = {"check": check, "apply": apply, "status": status}[args.command]
        state = action(target, series, args.lock_timeout, say_waiting)
    except AlreadyUpstream as err:
        return _report(
            args,
            {"ok": False, "state": PatchState.UPSTREAM, "message": str(err)},
            EXIT_UPSTREAM,
        )
    except (Refusal, SeriesError) as err:
        return _report(
            args,
            {"ok": False, "state": PatchState.REFUSED, "message": str(err)},
            EXIT_REFUSED,
        )
    except OSError as err:  # an unreadable file anywhere: say which, no traceback
        message = f"cannot read or write {err.filename or 'the tree'} ({err})"
        return _report(
            args,
            {"ok": False, "state": PatchState.REFUSED, "message": message},
            EXIT_REFUSED,
        )
    outcome = "done" if state.changed else state.state
    message = _MESSAGES[args.command][outcome].format(**asdict(state))
    if state.recovered:
        message += f" ({state.recovered} first)"
    return _report(args, {"ok": True, **asdict(state), "message": message}, EXIT_OK)


def _report(args: argparse.Namespace, result: dict, code: int) -> int:
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        stream = sys.stdout if code == EXIT_OK else sys.stderr
        prefix = "" if code == EXIT_OK else "k3rocm.patchtool.patchset: "
        print(prefix + result["message"], file=stream)
    return code


if __name__ == "__main__":
    sys.exit(main())
