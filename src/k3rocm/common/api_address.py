"""Where vLLM's API server listens (the launcher's K3_HOST / K3_PORT), as
the processes in the same container reach it."""

from __future__ import annotations

from collections.abc import Mapping

from k3rocm.common.setting_kinds import SettingError
from k3rocm.common.setting_table import HOST, PORT

# Listening on every address: the other processes reach it on loopback.
_ANY_ADDRESS = {"", "0.0.0.0", "::", "[::]"}


class BadAddress(ValueError):
    """K3_HOST / K3_PORT cannot be turned into a URL; the message says why."""


def api_base_url(environ: Mapping[str, str]) -> str:
    """``http://HOST:PORT`` of the API server (api_url of K3_HOST and
    K3_PORT)."""
    host = HOST.read(environ)
    try:
        port = PORT.read(environ)
    except SettingError as err:
        raise BadAddress(str(err)) from None
    return api_url(host, port)


def api_url(host: str, port: int) -> str:
    """``http://HOST:PORT`` of an API server listening on host and port:
    loopback when it listens on every address, else the address it listens
    on."""
    if host in _ANY_ADDRESS:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"
