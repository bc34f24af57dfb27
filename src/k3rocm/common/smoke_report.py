"""What the smoke test hands over, one schema each: its report (checks,
stages and the verdict, as JSON), read back by the metrics plugin's verdict
gauge and the container's start-up metrics through ``verdict_number``, the
one verdict-to-number mapping; and its two marks in the run directory, the
stage-1 gate and the ready mark, each one verdict word. A reader gets an
answer for any content: a report of any size or type is at worst "no
verdict"."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from k3rocm.common.states import FailurePolicy, Verdict

# A verdict as a gauge shows it.
VERDICT_PASS, VERDICT_FAIL, VERDICT_PENDING = 1, 0, -1
_NUMBERS = {Verdict.PASS: VERDICT_PASS, Verdict.FAIL: VERDICT_FAIL}


class CheckName(StrEnum):
    """Every check the smoke test reports, by the name its report carries
    (the container's tests and an operator's jq read checks by it)."""

    PATCH_MARKER = "patch marker"
    KDA_METADATA_PATH = "kda metadata path"
    KIMI_BACKEND = "kimi backend"
    DEVICE_KERNEL = "device kernel"
    NO_DEVICE_SYNC = "no device sync"
    KDA_NUMERICS = "kda numerics"
    KDA_SPEC_NUMERICS = "kda spec numerics"
    HEALTH = "health"
    COMPLETION = "completion"
    SAMPLED_COMPLETION = "sampled completion"
    PREFILL_METRICS = "prefill metrics"
    SPECULATIVE_DECODING = "speculative decoding"
    JOINED = "joined"
    CRASHED = "crashed"
    TIMEOUT = "timeout"


@dataclass
class Check:
    name: str
    status: Verdict  # pass | fail | skip
    detail: str


@dataclass
class Stage:
    status: Verdict = Verdict.RUNNING  # running | pass | fail
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)

    def add(self, name: CheckName, status: Verdict, detail: str) -> bool:
        self.checks.append(Check(name, status, detail))
        return status != Verdict.FAIL

    @property
    def failed(self) -> bool:
        return any(check.status == Verdict.FAIL for check in self.checks)


@dataclass
class Report:
    policy: FailurePolicy
    series_id: str
    verdict: Verdict = Verdict.RUNNING  # running | pass | fail
    started_at: str = field(default_factory=lambda: now())
    finished_at: str | None = None
    stages: dict[str, Stage] = field(default_factory=dict)
    # A failed run's report outlives the run directory in K3_FORENSICS_DIR:
    # where it was kept, or why it could not be (the guard's exit line says).
    kept: str | None = None
    not_kept: str | None = None

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
            os.replace(tmp, path)
        except OSError:
            # A full disk leaves no partial file behind.
            tmp.unlink(missing_ok=True)
            raise

    def failures(self) -> list[str]:
        """One line per failed check: its stage, name and detail."""
        return [
            f'{name}: check "{check.name}" failed: {check.detail}'
            for name, stage in self.stages.items()
            for check in stage.checks
            if check.status == Verdict.FAIL
        ]

    def summary(self) -> str:
        parts = []
        for name, stage in self.stages.items():
            checks = ", ".join(f"{c.name} {c.status}" for c in stage.checks)
            parts.append(f"{name}={stage.status} ({checks})")
        return (
            f"k3rocm.smoke: verdict={self.verdict} policy={self.policy} "
            f"series={self.series_id} " + " ".join(parts)
        )


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def verdict_number(status: object) -> int:
    """1 pass, 0 fail, -1 anything else (running, absent, malformed)."""
    return _NUMBERS.get(status, VERDICT_PENDING) if isinstance(status, str) else -1


def reported_verdict(document: object, stage: str | None = None) -> int:
    """The verdict number of a parsed report, or of one of its stages."""
    if not isinstance(document, dict):
        return VERDICT_PENDING
    if stage is None:
        return verdict_number(document.get("verdict"))
    stages = document.get("stages")
    found = stages.get(stage) if isinstance(stages, dict) else None
    return verdict_number(found.get("status") if isinstance(found, dict) else None)


def write_mark(path: Path, verdict: Verdict) -> None:
    """A verdict mark (the stage-1 gate, the ready mark): one word."""
    path.write_text(verdict + "\n")


def read_mark(path: Path) -> str:
    """A verdict mark's word, as written (a mark of any size reads short);
    OSError when there is none."""
    return path.read_bytes()[:200].decode(errors="replace").strip()
