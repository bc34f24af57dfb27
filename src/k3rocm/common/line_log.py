"""The one way a module logs: one line on stderr per message, prefixed with
who logs it (the module's path, or the command's name), for grep; whatever
it quotes (undecodable bytes of a path, read as surrogates) is shown
escaped rather than failing to encode."""

from __future__ import annotations

import sys
from collections.abc import Callable


def line_logger(who: str) -> Callable[[str], None]:
    def log(message: str) -> None:
        encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
        line = f"{who}: {message}".encode(encoding, "backslashreplace")
        print(line.decode(encoding), file=sys.stderr, flush=True)

    return log
