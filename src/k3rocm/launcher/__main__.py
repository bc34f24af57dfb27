"""`python -m k3rocm.launcher`: check the settings, then print (--dry-run) or
exec vLLM. Exit 2 for invalid settings, with nothing started."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from k3rocm.launcher.command import build_launch, dry_run_text
from k3rocm.launcher.settings import InvalidSettings, raw_settings, resolve
from k3rocm.launcher.validation import check_machine

EXIT_INVALID_SETTINGS = 2
# What a shell returns for a command it cannot find.
EXIT_NOT_FOUND = 127


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    raw, passthrough = raw_settings(argv, environ)
    try:
        settings = resolve(raw, passthrough)
        api_key = check_machine(settings, environ)
    except InvalidSettings as invalid:
        for problem in invalid.problems:
            print(f"serve-kimi-k3: error: {problem}", file=sys.stderr)
        print("serve-kimi-k3: nothing started.", file=sys.stderr)
        return EXIT_INVALID_SETTINGS
    launch = build_launch(settings, environ, api_key)
    if settings.dry_run:
        sys.stdout.write(dry_run_text(launch))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    argv_out = launch.argv
    try:
        # Replace this process, so signals from the container runtime reach
        # vLLM itself.
        os.execvpe(argv_out[0], argv_out, launch.exec_env(environ))
    except OSError as error:
        print(
            f"serve-kimi-k3: error: cannot start {argv_out[0]!r} ({error}); install "
            "vLLM there or set K3_VLLM_COMMAND (--vllm-command) to the command "
            "that runs `vllm serve`.",
            file=sys.stderr,
        )
        return EXIT_NOT_FOUND


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], os.environ))
