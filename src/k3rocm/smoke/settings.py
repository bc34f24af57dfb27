"""The smoke test's settings, read from the container's environment (their
defaults: k3rocm.common.setting_table)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from k3rocm.common.api_address import api_base_url
from k3rocm.common.api_key import api_key_from_env
from k3rocm.common.profiles import PROFILES
from k3rocm.common.run_files import READY_MARK, STAGE1_GATE, run_dir, smoke_report_path
from k3rocm.common.setting_table import (
    FEATURES_SETTING,
    PROFILE,
    SMOKE_LOAD_TIMEOUT,
    SMOKE_ON_FAILURE,
    SMOKE_STAGE1_TIMEOUT,
    SMOKE_STAGE2_TIMEOUT,
)
from k3rocm.common.states import FailurePolicy


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
    # The KDA heads of one rank of the profile: the layer's own head count,
    # at which stage 1 checks the KDA kernels.
    kda_heads: int
    # `dspark` is on: stage 2 wants the engine speculating.
    speculative: bool

    @property
    def ready_mark(self) -> Path:
        return self.run_dir / READY_MARK

    @property
    def stage1_gate(self) -> Path:
        return self.run_dir / STAGE1_GATE

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        return cls(
            policy=FailurePolicy(SMOKE_ON_FAILURE.read(environ)),
            report=smoke_report_path(environ),
            run_dir=run_dir(environ),
            base_url=api_base_url(environ),
            api_key=api_key_from_env(environ),
            stage1_timeout=SMOKE_STAGE1_TIMEOUT.read(environ),
            load_timeout=SMOKE_LOAD_TIMEOUT.read(environ),
            stage2_timeout=SMOKE_STAGE2_TIMEOUT.read(environ),
            kda_heads=PROFILES[PROFILE.read(environ)].kda_heads_per_rank,
            speculative="dspark" in FEATURES_SETTING.read(environ),
        )
