"""The one way a module logs: one line on stderr per message, prefixed with
who logs it (the module's path, or the command's name), for grep."""

from __future__ import annotations

import sys
from collections.abc import Callable


def line_logger(who: str) -> Callable[[str], None]:
    def log(message: str) -> None:
        print(f"{who}: {message}", file=sys.stderr, flush=True)

    return log
