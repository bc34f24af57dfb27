"""The end of a run under ``K3_SMOKE_ON_FAILURE``: the verdict, the report,
the ready mark (when serving goes on), the summary line and the exit code."""

from __future__ import annotations

import sys

from k3rocm.smoke.report import Report, now
from k3rocm.smoke.settings import Settings
from k3rocm.states import FailurePolicy, Verdict


def finish(report: Report, settings: Settings, serving: bool) -> int:
    """Verdict, report, ready mark (when serving goes on) and summary line."""
    failed = any(stage.status != Verdict.PASS for stage in report.stages.values())
    report.verdict = Verdict.FAIL if failed else Verdict.PASS
    report.finished_at = now()
    report.write(settings.report)
    if serving and (not failed or settings.policy == FailurePolicy.WARN):
        settings.ready_mark.write_text(report.verdict + "\n")
    print(report.summary(), flush=True)
    if not failed:
        return 0
    if settings.policy == FailurePolicy.WARN:
        print(
            "k3rocm.smoke: WARNING: THE SMOKE TEST FAILED, SERVING ANYWAY "
            "(K3_SMOKE_ON_FAILURE=warn); the stall-free prefill path is NOT "
            f"proven. See {settings.report}",
            file=sys.stderr,
            flush=True,
        )
        return 0
    print(
        f"k3rocm.smoke: FAILED under K3_SMOKE_ON_FAILURE=stop; the container "
        f"stops. See {settings.report}",
        file=sys.stderr,
        flush=True,
    )
    return 1
