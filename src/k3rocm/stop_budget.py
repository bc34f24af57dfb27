"""The container's stop budget: one number, K3_STOP_GRACE_SECONDS, from which
every wait of a stop is derived.

It is the time Docker gives the container between SIGTERM and SIGKILL
(compose's ``stop_grace_period``; ``docker run --stop-timeout``). Within it:

1. drain: new requests are refused (HTTP 503), requests already accepted run
   to completion; up to ``drain_seconds``;
2. teardown: vLLM is sent SIGTERM with ``--shutdown-timeout
   vllm_shutdown_timeout`` (what is still running then was told it is cut
   off), and supervisord SIGKILLs what is left after ``stopwait_seconds``.

The teardown reserve is a quarter of the budget, 10 to 60 s: enough for vLLM
to stop its engine processes, short enough to leave most of the budget to
requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from k3rocm.setting_table import STOP_GRACE_SECONDS

GRACE_ENV = STOP_GRACE_SECONDS.env
DEFAULT_GRACE_SECONDS = STOP_GRACE_SECONDS.default
MIN_GRACE_SECONDS = 20
MAX_GRACE_SECONDS = 24 * 3600


class InvalidGrace(ValueError):
    """K3_STOP_GRACE_SECONDS is not a usable number; the message says how to fix it."""


@dataclass(frozen=True)
class StopBudget:
    grace_seconds: int

    @property
    def teardown_seconds(self) -> int:
        return min(60, max(10, self.grace_seconds // 4))

    @property
    def drain_seconds(self) -> int:
        return self.grace_seconds - self.teardown_seconds

    @property
    def vllm_shutdown_timeout(self) -> int:
        """vLLM's --shutdown-timeout: its own drain of what is left."""
        return self.teardown_seconds // 3

    @property
    def stopwait_seconds(self) -> int:
        """supervisord's SIGTERM-to-SIGKILL wait for vLLM; 5 s stay for
        supervisord and the wrapper to exit before Docker's SIGKILL."""
        return self.teardown_seconds - 5


def parse_grace(text: str | None) -> StopBudget:
    if text is None or not text.strip():
        return StopBudget(DEFAULT_GRACE_SECONDS)
    text = text.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 6) or not (
        MIN_GRACE_SECONDS <= int(text) <= MAX_GRACE_SECONDS
    ):
        raise InvalidGrace(
            f"{GRACE_ENV} is {text[:40]!r}, not a whole number of seconds from "
            f"{MIN_GRACE_SECONDS} to {MAX_GRACE_SECONDS}; set it to Docker's stop "
            f"timeout for the container, e.g. {DEFAULT_GRACE_SECONDS}."
        )
    return StopBudget(int(text))


def budget_from_env(environ: Mapping[str, str]) -> StopBudget:
    return parse_grace(environ.get(GRACE_ENV))
