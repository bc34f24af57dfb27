"""The A/B of the series' metadata path on the operator's own compose service
(``scripts/accept-ab``): the service runs with K3_KDA_METADATA=device and
=legacy in turn, each round runs ``python -m k3rocm.accept`` in it once per
path, and the figures are compared per concurrency (device against legacy,
round by round). Rounds alternate their order (device first, then legacy
first, ...), so a machine that drifts over the hours does not favour one
path; consecutive runs of one path share a server (a model load less). At
the end the service is brought back to the operator's own setting.

Host side, stdlib only: it drives ``docker compose`` (or ``docker-compose``)
and ``docker inspect``; nothing of vLLM is needed here."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from k3rocm.accept.bench import FIGURES
from k3rocm.accept.compose import AbError, Compose, default_compose
from k3rocm.common.line_log import line_logger
from k3rocm.common.setting_table import KDA_METADATA, KDA_METADATA_PATHS

DEVICE, LEGACY = KDA_METADATA_PATHS
IN_CONTAINER_DIR = "/tmp/k3rocm-accept"
# A paired change smaller than this counts as no change, whatever its sign.
DEFAULT_MIN_CHANGE = 0.01


log = line_logger("k3rocm.accept-ab")


def orders(rounds: int, first: str) -> list[tuple[str, str]]:
    """Each round's order: the operator's own path first in round 1, then
    alternating (ABBA...), so consecutive runs of one path share a server."""
    other = LEGACY if first == DEVICE else DEVICE
    return [(first, other) if r % 2 == 0 else (other, first) for r in range(rounds)]


@dataclass(frozen=True)
class Row:
    concurrency: int
    key: str
    name: str
    unit: str
    device: float  # medians over the rounds
    legacy: float
    changes: tuple[float, ...]  # per round, (device - legacy) / legacy
    verdict: str


def judge(changes: tuple[float, ...], higher_is_better: bool, floor: float) -> str:
    """``better`` / ``worse`` when every round moved the same way by more than
    the floor, else ``same``."""
    signed = [c if higher_is_better else -c for c in changes]
    if all(s > floor for s in signed):
        return "better"
    if all(s < -floor for s in signed):
        return "worse"
    return "same"


def compare(runs: dict[str, list[dict]], floor: float) -> list[Row]:
    """Rows of figure x concurrency from each path's reports (one per round,
    in round order)."""
    rows = []
    device_runs, legacy_runs = runs[DEVICE], runs[LEGACY]
    concurrencies = [r["concurrency"] for r in device_runs[0]["bench"]["runs"]]
    for index, concurrency in enumerate(concurrencies):
        for key, name, unit, higher in FIGURES:
            d = [r["bench"]["runs"][index]["figures"][key] for r in device_runs]
            g = [r["bench"]["runs"][index]["figures"][key] for r in legacy_runs]
            changes = tuple(
                (a - b) / b if b else 0.0 for a, b in zip(d, g, strict=True)
            )
            rows.append(
                Row(
                    concurrency, key, name, unit,
                    statistics.median(d), statistics.median(g), changes,
                    judge(changes, higher, floor),
                )
            )  # fmt: skip
    return rows


def table(rows: list[Row], rounds: int) -> str:
    lines = [
        f"A/B of K3_KDA_METADATA over {rounds} round(s): device against legacy, "
        "medians over the rounds; change = median of the per-round changes "
        "(spread: lowest to highest)",
        "",
        "| concurrency | figure | device | legacy | change | spread | verdict |",
        "|---:|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        spread = f"{min(row.changes):+.1%} to {max(row.changes):+.1%}"
        lines.append(
            f"| {row.concurrency} | {row.name} ({row.unit}) | {row.device:.2f} | "
            f"{row.legacy:.2f} | {statistics.median(row.changes):+.1%} | "
            f"{spread} | {row.verdict} |"
        )
    return "\n".join(lines) + "\n"


def accuracy_line(runs: dict[str, list[dict]]) -> tuple[str, bool]:
    parts, passed = [], True
    for path in (DEVICE, LEGACY):
        gates = [r["accuracy"] for r in runs[path] if r.get("accuracy")]
        if not gates:
            parts.append(f"{path}: not run")
            continue
        correct = sum(g["correct"] for g in gates)
        total = sum(g["problems"] for g in gates)
        passed &= all(g["passed"] for g in gates)
        parts.append(
            f"{path}: {correct}/{total} right ({correct / total:.1%}), "
            + ("every run passed" if all(g["passed"] for g in gates) else "FAILED")
        )
    return "accuracy gate: " + "; ".join(parts), passed


# How each verdict of an accurate run begins (the tests read them here).
SLOWER, FASTER, NO_DIFFERENCE = (
    "device path SLOWER: ",
    "device path faster: ",
    "no difference ",
)


def verdict(rows: list[Row], accurate: bool, rounds: int) -> str:
    better = [r for r in rows if r.verdict == "better"]
    worse = [r for r in rows if r.verdict == "worse"]
    if not accurate:
        return "FAIL: the accuracy gate failed (see above)"
    if worse:
        return (
            f"{SLOWER}{len(worse)} figure(s) worse in all {rounds} "
            "round(s) (" + ", ".join(f"{r.name} at {r.concurrency}" for r in worse)
            + ")"
        )  # fmt: skip
    if better:
        return (
            f"{FASTER}{len(better)} figure(s) better in all "
            f"{rounds} round(s), none worse"
        )
    return (
        f"{NO_DIFFERENCE}beyond the noise in {rounds} round(s) (none better or "
        "worse in every round); expected where both paths are the same code, "
        "as on a CPU"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scripts/accept-ab",
        description="A/B of K3_KDA_METADATA (device against legacy) on the compose "
        "service: python -m k3rocm.accept in each, rounds in alternating order, "
        "then the side-by-side table and a verdict. Arguments after -- go to "
        "python -m k3rocm.accept.",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="rounds, each one run per path (default 2)",
    )
    p.add_argument(
        "--compose",
        help="the compose command, split like a shell would "
        "(default: docker compose, else docker-compose)",
    )
    p.add_argument("--service", default="kimi-k3", help="(default kimi-k3)")
    p.add_argument(
        "--healthy-timeout",
        type=float,
        default=8 * 3600,
        help="seconds a (re)started service may take to be "
        "healthy (default 28800: loading takes hours)",
    )
    p.add_argument(
        "--run-timeout",
        type=float,
        default=6 * 3600,
        help="seconds one acceptance run may take (default 21600)",
    )
    p.add_argument(
        "--min-change",
        type=float,
        default=DEFAULT_MIN_CHANGE,
        help="a per-round change smaller than this counts as none (default 0.01)",
    )
    p.add_argument(
        "--output-dir",
        type=Path,
        help="where the reports go (default ./k3rocm-ab-<UTC time>)",
    )
    return p  # fmt: skip


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    own, passed_on = split_arguments(argv)
    args = parser().parse_args(own)
    if not 1 <= args.rounds <= 50:
        log("cannot start: --rounds must be from 1 to 50")
        return 2
    compose = Compose(
        shlex.split(args.compose) if args.compose else default_compose(), args.service
    )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.output_dir or Path(f"k3rocm-ab-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    own_env = dict(environ)
    try:
        # The operator's own setting: bring the service up as it is.
        log("bringing the service up with your settings ...")
        compose.up(own_env)
        original = compose.path_of(compose.wait_healthy(args.healthy_timeout))
        runs: dict[str, list[dict]] = {DEVICE: [], LEGACY: []}
        failed = False
        try:
            for number, order in enumerate(orders(args.rounds, original), 1):
                for path in order:
                    env = own_env if path == original else own_env | {
                        KDA_METADATA.env: path}  # fmt: skip
                    log(f"round {number}/{args.rounds}: {path} ...")
                    compose.up(env)
                    cid = compose.wait_healthy(args.healthy_timeout)
                    if compose.path_of(cid) != path:
                        raise AbError(f"the service did not take {path}")
                    name = f"round{number}-{path}"
                    status, document = compose.accept(
                        passed_on, f"{IN_CONTAINER_DIR}/{name}", args.run_timeout
                    )
                    if document is None or status not in (0, 1):
                        raise AbError(
                            f"acceptance with {path} in round {number} failed "
                            f"(exit {status}); its log is above"
                        )
                    failed |= status != 0
                    (out / f"{name}.json").write_text(json.dumps(document, indent=2))
                    runs[path].append(document)
        finally:
            log(f"restoring your setting ({KDA_METADATA.env}={original}) ...")
            compose.up(own_env)
        if not runs[DEVICE][0]["bench"]["runs"]:
            raise AbError("no benchmark figures to compare (--no-bench?)")
        rows = compare(runs, args.min_change)
    except AbError as err:
        log(f"stopped: {err}")
        with contextlib.suppress(OSError):
            out.rmdir()  # only if no round got as far as a report
        return 2
    accuracy, accurate = accuracy_line(runs)
    text = "\n".join(
        [table(rows, args.rounds), accuracy,
         f"rounds: {args.rounds} (orders: "
         + ", ".join("/".join(o) for o in orders(args.rounds, original)) + ")",
         "verdict: " + verdict(rows, accurate, args.rounds), ""]
    )  # fmt: skip
    (out / "ab.md").write_text(text)
    sys.stdout.write(text)
    log(f"reports in {out}")
    return 0 if accurate and not failed else 1


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """Its own arguments, and those after ``--`` (for k3rocm.accept)."""
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []
