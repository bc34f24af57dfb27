"""``k3rocm COMMAND [ARGS...]``: runs COMMAND's module as ``python -m``
would, with ARGS (k3rocm.cli.commands lists them)."""

from __future__ import annotations

import runpy
import sys

from k3rocm.cli.commands import BY_NAME, COMMANDS


def usage() -> str:
    width = max(len(c.name) for c in COMMANDS)
    lines = ["usage: k3rocm COMMAND [ARGS...]   (k3rocm COMMAND --help)", ""]
    lines += [f"  {c.name:<{width}}  {c.summary}" for c in COMMANDS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    command = BY_NAME.get(args[0])
    if command is None:
        # A print, not common.line_log: the command imports no wing's module.
        print(
            f"k3rocm: no command {args[0]!r}; `k3rocm --help` lists them",
            file=sys.stderr,
        )
        return 2
    sys.argv = [f"k3rocm {command.name}", *command.leading, *args[1:]]
    try:
        runpy.run_module(command.module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        return _exit_status(done.code)
    return 0


def _exit_status(code: object) -> int:
    """SystemExit's code as a process status, as the interpreter maps it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
