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

from dataclasses import dataclass


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
