"""How large a request body the API server reads: ``K3_MAX_REQUEST_BYTES``.

vLLM 0.27.1 bounds no body: it reads one whole and parses it again, so a
1.5 GB body raised the try-out server from 3.4 to 9.2 GB resident for 18 s
before its 400, and two or three at once are an out-of-memory kill of the
API server. The drain middleware (k3rocm.container.drain) reads every body
before vLLM does and stops at the limit: a declared ``Content-Length`` over
it is answered 413 before a byte of the body is read; a chunked body is
counted as it arrives and answered 413 as soon as it passes the limit; the
connection then closes. So a request holds at most the limit in memory
while it is read. The access check runs first (ApiAccessMiddleware is the
outermost middleware): with an API key set, a client without it is answered
401 and its body is never read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import Counter

from k3rocm.common.metric_names import API_BODY_TOO_LARGE
from k3rocm.common.setting_table import MAX_REQUEST_BYTES

TOO_LARGE = Counter(
    API_BODY_TOO_LARGE,
    "HTTP requests answered 413 because their body is over K3_MAX_REQUEST_BYTES.",
)


class BodyLimit:
    """The limit of one API server process, read once."""

    def __init__(self, environ: Mapping[str, str]):
        self.bytes = MAX_REQUEST_BYTES.read(environ)

    def refuses(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether the request's declared length is over the limit (a
        malformed or absent one is left to the HTTP server and the count)."""
        for name, value in headers:
            if name.lower() == b"content-length":
                text = value.strip()
                return text.isdigit() and int(text) > self.bytes
        return False

    def passed(self, received: int) -> bool:
        return received > self.bytes

    @property
    def message(self) -> str:
        return (
            f"the request body is over {self.bytes} bytes "
            f"({MAX_REQUEST_BYTES.env}); send a smaller request, or raise "
            f"{MAX_REQUEST_BYTES.env} on the server"
        )
