"""Read a small JSON file that something else writes, whatever it holds;
write one atomically.

The metrics plugin reads the smoke report on scrapes and the patch marker at
start-up; neither may hang, exhaust memory or raise past its caller because
the file is a pipe, a device, huge, binary or nested beyond Python's
recursion limit.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

# The smoke report and the patch marker are a few kB; anything near this is
# not one of them.
MAX_JSON_BYTES = 1 << 20


class UnreadableJson(Exception):
    """The file exists but holds no JSON document this reader will parse."""


def read_json_file(path: Path, max_bytes: int = MAX_JSON_BYTES) -> object:
    """The parsed document. Raises FileNotFoundError when there is no file
    and UnreadableJson for every other reason there is no document."""
    try:
        # Non-blocking, so opening a FIFO with no writer returns at once.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as err:
        raise UnreadableJson(f"cannot open it ({err})") from None
    try:
        with os.fdopen(fd, "rb") as stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                raise UnreadableJson("it is not a regular file")
            data = stream.read(max_bytes + 1)
    except OSError as err:
        raise UnreadableJson(f"cannot read it ({err})") from None
    if len(data) > max_bytes:
        raise UnreadableJson(f"it is larger than {max_bytes} bytes")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise UnreadableJson(f"it is not UTF-8 ({err})") from None
    except RecursionError:
        raise UnreadableJson("it is nested too deeply") from None
    except ValueError as err:
        raise UnreadableJson(f"it is not JSON ({err})") from None


def write_json_file(path: Path, document: object) -> None:
    """Write ``document`` whole or not at all: a temporary file beside
    ``path``, renamed over it, so a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(document) + "\n")
    os.replace(tmp, path)
