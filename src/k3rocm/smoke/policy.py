"""The end of a run under ``K3_SMOKE_ON_FAILURE``: the verdict, the report,
the ready mark (when serving goes on), the summary line and the exit code."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from k3rocm.container.forensics import forensics_dir
from k3rocm.smoke.settings import Settings
from k3rocm.smoke_report import Report, now, write_mark
from k3rocm.states import FailurePolicy, Verdict


def keep_report(report: Path, directory: Path) -> Path:
    """A copy of a failed run's report in ``directory``; the report itself
    where the copy cannot be made (said in one line)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    try:
        directory.mkdir(parents=True, exist_ok=True)
        kept = directory / f"smoke-report-{stamp}.json"
        shutil.copyfile(report, kept)
    except OSError as err:
        print(
            f"k3rocm.smoke: cannot keep the report in {directory} ({err})",
            file=sys.stderr,
            flush=True,
        )
        return report
    return kept


def finish(report: Report, settings: Settings, serving: bool) -> int:
    """Verdict, report, ready mark (when serving goes on) and summary line."""
    failed = any(stage.status != Verdict.PASS for stage in report.stages.values())
    report.verdict = Verdict.FAIL if failed else Verdict.PASS
    report.finished_at = now()
    report.write(settings.report)
    if serving and (not failed or settings.policy == FailurePolicy.WARN):
        write_mark(settings.ready_mark, report.verdict)
    print(report.summary(), flush=True)
    if not failed:
        return 0
    # The reason in the log, and the report where it outlives the container
    # (the run directory is wiped at the next start).
    for line in report.failures():
        print(f"k3rocm.smoke: {line}"[:2000], file=sys.stderr, flush=True)
    kept = keep_report(settings.report, forensics_dir(os.environ))
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
        f"stops. See {kept}",
        file=sys.stderr,
        flush=True,
    )
    return 1
