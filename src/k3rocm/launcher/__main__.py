"""`python -m k3rocm.launcher`: check the settings, then print (--dry-run) or
exec vLLM. Exit 2 for invalid settings, with nothing started."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from k3rocm.common.exit_codes import ExitCode
from k3rocm.common.line_log import line_logger
from k3rocm.launcher.command import build_launch, dry_run_text
from k3rocm.launcher.preflight import check

log = line_logger("serve-kimi-k3")


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    settings, api_key, problems = check(argv, environ)
    if problems:
        for problem in problems:
            log(f"error: {problem}")
        log("nothing started.")
        return ExitCode.SETTINGS
    launch = build_launch(settings, environ, api_key)
    if settings.dry_run:
        _write_script(dry_run_text(launch))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    argv_out = launch.argv
    try:
        # Replace this process, so signals from the container runtime reach
        # vLLM itself.
        os.execvpe(argv_out[0], argv_out, launch.exec_env(environ))
    except (OSError, ValueError) as error:
        log(
            f"error: cannot start {argv_out[0]!r} ({error}); install "
            "vLLM there or set K3_VLLM_COMMAND (--vllm-command) to the command "
            "that runs `vllm serve`."
        )
        return ExitCode.NOT_FOUND


def _write_script(text: str) -> None:
    """The dry run's script, byte for byte what was given: undecodable bytes
    of a setting (read from the environment as surrogates) go back out as
    the same bytes, as the exec would pass them."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a text-only stream (tests): it takes any str
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    buffer.write(
        text.encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())
    )
    buffer.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], os.environ))
