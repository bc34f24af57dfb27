"""The container's exit codes, with their meanings: the guard, supervise,
the watchdog and the launcher exit with these, and README's table is
generated from them (tests/common/test_exit_codes.py)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    STOPPED = 0
    SETTINGS = 2
    VLLM = 3
    SMOKE = 4
    STALL = 5
    # The launcher alone, run outside the container: a shell's code for a
    # command it cannot find (the container never exits with it: inside, a
    # vLLM that cannot start is a failed start, 3).
    NOT_FOUND = 127


MEANINGS = {
    ExitCode.STOPPED: "stopped on request (after the drain)",
    ExitCode.SETTINGS: "a malformed or refused setting (the launcher's or the "
    "container's), an API key file uid 1000 cannot read, a place that must be "
    "writable and is not, or a smoke test that could not run; the lines "
    "before the exit line say which",
    ExitCode.VLLM: "vLLM could not be kept running: it exited unasked, with any "
    "status, more than `K3_VLLM_MAX_RESTARTS` times, or failed to start; on "
    "two nodes any vLLM death, or node 0 lost",
    ExitCode.SMOKE: "the smoke test failed under `K3_SMOKE_ON_FAILURE=stop`",
    ExitCode.STALL: 'the engine stalled ("When the engine stalls")',
}
# Not ours to choose: what a shell reports for a killed supervisord.
KILLED = ("`128+N`", "supervisord was killed by signal N")


def exit_codes_table() -> str:
    """README's table of the container's exit codes."""
    lines = ["| code | meaning |", "|---|---|"]
    lines += [f"| `{int(code)}` | {meaning} |" for code, meaning in MEANINGS.items()]
    lines.append(f"| {KILLED[0]} | {KILLED[1]} |")
    return "\n".join(lines) + "\n"
