"""The smoke test's settings, read from the container's environment."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from k3rocm.contract import (
    READY_MARK,
    STAGE1_GATE,
    api_base_url,
    run_dir,
    smoke_report_path,
)
from k3rocm.states import FailurePolicy


@dataclass(frozen=True)
class Settings:
    policy: FailurePolicy
    report: Path
    run_dir: Path
    base_url: str
    api_key: str | None
    stage1_timeout: float
    load_timeout: float
    stage2_timeout: float

    @property
    def ready_mark(self) -> Path:
        return self.run_dir / READY_MARK

    @property
    def stage1_gate(self) -> Path:
        return self.run_dir / STAGE1_GATE

    @classmethod
    def from_env(cls, environ: dict[str, str]) -> Settings:
        def get(name: str, default: str) -> str:
            # compose passes unset settings as empty strings.
            return environ.get(name, "").strip() or default

        policy = get("K3_SMOKE_ON_FAILURE", FailurePolicy.STOP)
        if policy not in tuple(FailurePolicy):
            raise ValueError(
                f"K3_SMOKE_ON_FAILURE={policy!r}; use one of {', '.join(FailurePolicy)}"
            )
        key_file = get("K3_API_KEY_FILE", "")
        return cls(
            policy=FailurePolicy(policy),
            report=smoke_report_path(),
            run_dir=run_dir(),
            base_url=api_base_url(environ),
            api_key=Path(key_file).expanduser().read_text().strip()
            if key_file
            else None,
            stage1_timeout=_seconds(get, "K3_SMOKE_STAGE1_TIMEOUT", "900"),
            # Loading Kimi-K3's weights takes hours; the health check's start
            # period is sized the same.
            load_timeout=_seconds(get, "K3_SMOKE_LOAD_TIMEOUT", "21600"),
            stage2_timeout=_seconds(get, "K3_SMOKE_STAGE2_TIMEOUT", "600"),
        )


def _seconds(get: Callable[[str, str], str], name: str, default: str) -> float:
    text = get(name, default)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e7:
        raise ValueError(
            f"{name}={text[:40]!r}; set a number of seconds, e.g. {default}"
        )
    return value
