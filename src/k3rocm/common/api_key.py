"""The API key file, read in one place: the launcher hands the key to vLLM
(as VLLM_API_KEY), and the smoke test, the stall watchdog's probe and the
acceptance run send it. Strict for all of them alike: `~` expanded, a file
no other user can read, one printable key without spaces."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from k3rocm.common.setting_kinds import shown
from k3rocm.common.setting_table import API_KEY_FILE

# Far beyond any API key; a larger file is something else.
MAX_KEY_FILE_BYTES = 64 * 1024


class ApiKeyFileError(ValueError):
    """One line: what is wrong with the key file and how to fix it."""


def read_api_key(path: Path, setting: str = API_KEY_FILE.env) -> str:
    """The key in `path`; `setting` is how messages name the setting that
    points at it. Raises ApiKeyFileError."""
    path = path.expanduser()
    where = f"{setting} {shown(str(path))}"
    fix = f"create it with the key as its only content and `chmod 600 {path}`"
    try:
        is_file = path.is_file()
        mode = path.stat().st_mode if is_file else 0
    except (OSError, ValueError) as error:
        raise ApiKeyFileError(
            f"{setting} is {shown(str(path))}, which cannot be examined on this "
            f"node ({_reason(error)}); make every directory on the way enterable "
            "(and the file readable) for this user, or point the setting elsewhere."
        ) from None
    if not is_file:
        raise ApiKeyFileError(
            f"{setting} is {shown(str(path))}, which is not an existing file; "
            f"{fix}, or unset the setting to serve without a key."
        )
    if mode & stat.S_IROTH:
        raise ApiKeyFileError(
            f"{where} is readable by every user; restrict it: `chmod o-rwx "
            f"{path}` (or `chmod 600 {path}`)."
        )
    try:
        with path.open("rb") as file:
            data = file.read(MAX_KEY_FILE_BYTES + 1)
        if len(data) > MAX_KEY_FILE_BYTES:
            raise ValueError(f"more than {MAX_KEY_FILE_BYTES} bytes")
        key = data.decode().strip()
    except (OSError, ValueError) as error:  # UnicodeDecodeError included
        # Say why without quoting the content: it may be the key.
        raise ApiKeyFileError(
            f"{where} cannot be read as text ({_reason(error)}); {fix}."
        ) from None
    if not key or any(char.isspace() for char in key):
        raise ApiKeyFileError(
            f"{where} must hold exactly one key without spaces; {fix}."
        )
    if not key.isprintable():
        # A NUL byte cannot go into VLLM_API_KEY; other control characters
        # would make a key no client can type.
        raise ApiKeyFileError(
            f"{where} holds a control character (a NUL byte, for example) in "
            f"its key; {fix}."
        )
    return key


def api_key_from_env(environ: Mapping[str, str]) -> str | None:
    """The key K3_API_KEY_FILE points at; None where it is unset. Raises
    ApiKeyFileError (and ValueError for a malformed setting)."""
    path = API_KEY_FILE.read(environ)
    return read_api_key(path) if path is not None else None


def _reason(error: Exception) -> str:
    if isinstance(error, UnicodeDecodeError):
        return "not UTF-8 text"
    errno = getattr(error, "errno", None)
    return os.strerror(errno) if errno else str(error)
