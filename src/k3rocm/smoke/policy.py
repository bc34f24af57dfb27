"""The end of a run under ``K3_SMOKE_ON_FAILURE``: the verdict, the report,
the ready mark (when serving goes on), the summary line and the exit code."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from k3rocm.common.line_log import line_logger
from k3rocm.common.setting_table import FORENSICS_DIR
from k3rocm.common.smoke_report import Report, now, write_mark
from k3rocm.common.states import FailurePolicy, Verdict
from k3rocm.smoke.settings import Settings

log = line_logger("k3rocm.smoke")


def keep_report(report: Report, directory: Path, run_report: Path) -> None:
    """Write a failed run's report into ``directory`` too, where it outlives
    the run directory; ``report.kept`` says where, or ``report.not_kept``
    why not (a full cache volume, say)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = directory / f"smoke-report-{stamp}.json"
    report.kept = str(kept)
    try:
        report.write(kept)
    except OSError as err:
        report.kept = None
        report.not_kept = (
            f"report not kept: {why_not_written(err, directory)}; the failed "
            f"checks are logged above, the report is only in {run_report} until "
            "the run directory is cleared"
        )


def why_not_written(err: OSError, directory: Path) -> str:
    """The error by its name (ENOSPC, EACCES, ...) and where, saying so when
    the file system is full."""
    name = errno.errorcode.get(err.errno or 0, "no errno")
    what = f"{(err.strerror or str(err)).lower()} ({name})"
    where = f"{FORENSICS_DIR.env} {directory}"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{what} on the file system of {where}, which is full"
    return f"{what} at {where}"


def finish(report: Report, settings: Settings, serving: bool) -> int:
    """Verdict, report, ready mark (when serving goes on) and summary line."""
    failed = any(stage.status != Verdict.PASS for stage in report.stages.values())
    report.verdict = Verdict.FAIL if failed else Verdict.PASS
    report.finished_at = now()
    if failed:
        # The run directory is wiped at the next start.
        keep_report(report, FORENSICS_DIR.read(os.environ), settings.report)
    report.write(settings.report)
    if serving and (not failed or settings.policy == FailurePolicy.WARN):
        write_mark(settings.ready_mark, report.verdict)
    print(report.summary(), flush=True)
    if not failed:
        return 0
    for line in report.failures():
        log(line[:2000])
    if report.not_kept:
        log(report.not_kept)
    if settings.policy == FailurePolicy.WARN:
        log(
            "WARNING: THE SMOKE TEST FAILED, SERVING ANYWAY "
            "(K3_SMOKE_ON_FAILURE=warn); the stall-free prefill path is NOT "
            f"proven. See {settings.report}"
        )
        return 0
    log(
        "FAILED under K3_SMOKE_ON_FAILURE=stop; the container "
        f"stops. See {report.kept or settings.report}"
    )
    return 1
