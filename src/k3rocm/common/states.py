"""The named states more than one module compares: the smoke test's verdicts
and failure policies, a vLLM tree's patch state, an engine step's kind.

Each is a ``StrEnum``: a member equals its string, so it goes into JSON, the
run directory's marks and metric labels unchanged, and a string read back from
any of them compares equal to the member.
"""

from enum import StrEnum


class Verdict(StrEnum):
    """Of a smoke check, a stage and the whole smoke report."""

    RUNNING = "running"
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"  # a check that cannot run here (no GPU, not ROCm)


class FailurePolicy(StrEnum):
    """``K3_SMOKE_ON_FAILURE``: what a failed smoke test does."""

    STOP = "stop"  # exit 1, and the container stops
    WARN = "warn"  # log loudly, write the ready mark, keep serving


class PatchState(StrEnum):
    """What ``k3rocm.patchtool.patchset`` finds in a vLLM tree."""

    PRISTINE = "pristine"  # the vLLM release the series is made for, untouched
    APPLIED = "applied"  # carries this series (its marker vouches for it)
    UPSTREAM = "upstream"  # a later vLLM that already has the change
    REFUSED = "refused"  # anything else: the message says why


class StepKind(StrEnum):
    """The ``kind`` label of the metrics plugin's engine step metrics."""

    PREFILL = "prefill"  # only requests still in their prompt
    DECODE = "decode"  # only requests generating
    MIXED = "mixed"  # both in one step
    DUMMY = "dummy"  # an idle data-parallel engine's padding step


# Steps that prefill (what the smoke test's stage 2 looks for).
PREFILL_KINDS = (StepKind.PREFILL, StepKind.MIXED)
