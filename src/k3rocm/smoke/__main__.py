"""``python -m k3rocm.smoke [--stage 1]``: the smoke test's run, stage by
stage, each under its timeout (see the package's docstring)."""

from __future__ import annotations

import argparse
import os
import sys

import k3rocm.smoke
from k3rocm.common.line_log import line_logger
from k3rocm.common.node import headless_node
from k3rocm.common.smoke_report import Report, Stage, write_mark
from k3rocm.common.states import FailurePolicy, Verdict
from k3rocm.patchtool.lines import installed_line_dir
from k3rocm.patchtool.series import Series
from k3rocm.smoke.headless import run_headless_stage2
from k3rocm.smoke.policy import finish
from k3rocm.smoke.settings import Settings
from k3rocm.smoke.stage1 import run_stage1
from k3rocm.smoke.stage2 import run_stage2
from k3rocm.smoke.timeouts import exit_code, run_with_timeout

log = line_logger("k3rocm.smoke")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3rocm.smoke",
        description=(k3rocm.smoke.__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--stage", choices=["1"], help="run stage 1 only")
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env(dict(os.environ))
    except (ValueError, OSError) as err:
        log(str(err))
        return 2
    series = Series(installed_line_dir())
    report = Report(policy=settings.policy, series_id=series.series_id)
    report.stages["stage1"] = stage1 = Stage()
    report.write(settings.report)

    stage1_in_time = run_with_timeout(
        lambda stage: run_stage1(
            stage, series, settings.kda_heads, settings.speculative
        ),
        stage1,
        settings.stage1_timeout,
    )
    report.write(settings.report)
    if args.stage:
        return exit_code(finish(report, settings, serving=False), stage1_in_time)
    if stage1.status == Verdict.FAIL and settings.policy == FailurePolicy.STOP:
        return exit_code(finish(report, settings, serving=True), stage1_in_time)
    # vLLM may start now (see `python -m k3rocm.container.supervise serve`).
    write_mark(settings.stage1_gate, stage1.status)

    report.stages["stage2"] = stage2 = Stage()
    # A headless node has no API to ask; it proves that it joined node 0.
    node = headless_node(os.environ)
    stage2_in_time = run_with_timeout(
        lambda stage: (
            run_stage2(stage, settings)
            if node is None
            else run_headless_stage2(stage, settings, node)
        ),
        stage2,
        settings.load_timeout + settings.stage2_timeout,
    )
    code = finish(report, settings, serving=True)
    return exit_code(code, stage1_in_time and stage2_in_time)


if __name__ == "__main__":
    sys.exit(main())
