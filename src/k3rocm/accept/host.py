"""``scripts/accept``: the acceptance run inside the compose service, its
reports copied to this host."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from k3rocm.accept.ab import split_arguments
from k3rocm.accept.compose import AbError, Compose, default_compose
from k3rocm.accept.report import markdown, write
from k3rocm.common.line_log import line_logger

log = line_logger("k3rocm.accept")

IN_CONTAINER_DIR = "/tmp/k3rocm-accept"


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    own, passed_on = split_arguments(argv)
    p = argparse.ArgumentParser(
        prog="scripts/accept",
        description="python -m k3rocm.accept in the compose service (options "
        "after -- go to it); its reports are copied here.",
    )
    p.add_argument("--compose", help="the compose command (default: docker compose)")
    p.add_argument("--service", default="kimi-k3", help="(default kimi-k3)")
    p.add_argument("--output-dir", type=Path, help="(default ./k3rocm-accept-<time>)")
    p.add_argument("--timeout", type=float, default=6 * 3600, help="seconds")
    args = p.parse_args(own)
    compose = Compose(
        shlex.split(args.compose) if args.compose else default_compose(), args.service
    )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.output_dir or Path(f"k3rocm-accept-{stamp}")
    try:
        status, document = compose.accept(
            passed_on, f"{IN_CONTAINER_DIR}/{stamp}", args.timeout
        )
    except AbError as err:
        log(str(err))
        return 2
    if document is None:
        return status or 2
    write(document, out)
    sys.stdout.write(markdown(document))
    log(f"reports in {out}")
    return status
