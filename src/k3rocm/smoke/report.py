"""The smoke test's report: checks, stages, the verdict, as JSON on disk and
one summary line."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from k3rocm.states import FailurePolicy, Verdict


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

    def add(self, name: str, status: Verdict, detail: str) -> bool:
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

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)

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
