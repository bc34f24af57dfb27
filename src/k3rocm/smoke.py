"""Start-up smoke test: proves the stall-free prefill path is the one serving.

    python -m k3rocm.smoke            stage 1, then stage 2 (the container's)
    python -m k3rocm.smoke --stage 1  stage 1 only (no server needed)

Stage 1 runs before vLLM starts (the ``vllm`` program waits for its gate
file): the patch marker matches the series this k3rocm carries; on ROCm the
Kimi KDA layer resolves to ``KIMI_K3_KDA_ROCM``; the device kernel equals the
reference on a fixed battery of batches (on the GPU, or on the CPU under
``TRITON_INTERPRET=1``); and under ``torch.cuda.set_sync_debug_mode("error")``
our metadata build raises nothing while the legacy path does (GPU only).

Stage 2 runs once ``/health`` answers: a real completion whose prompt spans
several 64-token chunks, then ``/metrics`` shows new prefill step samples from
the k3rocm metrics plugin.

Outputs: the JSON report (``K3_SMOKE_REPORT``; the metrics plugin's verdict
gauge reads it), the ready mark (``$K3_RUN_DIR/ready``) and one summary line.
``K3_SMOKE_ON_FAILURE=stop`` (default) exits 1 on failure, and the container
stops; ``warn`` logs loudly, writes the ready mark and keeps serving. Every
stage runs under a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from k3rocm import patchset
from k3rocm.chunk_reference import CHUNK_SIZE, cu_seqlens_of, reference_chunk_metadata
from k3rocm.contract import (
    READY_MARK,
    STAGE1_GATE,
    api_base_url,
    run_dir,
    smoke_report_path,
)
from k3rocm.series import Series, default_series_dir

BACKEND_NAME = "KIMI_K3_KDA_ROCM"
POLICIES = ("stop", "warn")
# The completion's prompt spans at least this many 64-token chunks.
PROMPT_CHUNKS = 4
PROMPT_SENTENCE = "the quick brown fox jumps over the lazy dog and runs far away "
# The metrics plugin's step histogram; steps that prefill are `prefill` or
# `mixed` (prefill and decode together).
STEP_COUNT_METRIC = "k3rocm_engine_step_duration_seconds_count"
PREFILL_KINDS = ("prefill", "mixed")

# Sequence lengths of the kernel battery: what the upstream reviewers asked
# about (empty sequences anywhere, mixed prefill/decode batches, more
# sequences than one tile and than the kernel's narrowest prefix load of 128
# lanes, one prompt longer than a chunk block) and chunk-boundary lengths.
KERNEL_BATTERY: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("one token", (1,)),
    ("chunk boundaries", (63, 64, 65, 128, 129)),
    ("mixed prefill and decode", (1, 1, 300, 1, 130, 1)),
    ("empty sequences front, middle, back", (0, 100, 0, 0, 64, 0)),
    ("all empty", (0, 0, 0)),
    ("130 sequences", tuple(1 + (i * 37) % 200 for i in range(130))),
    ("long prompt over several chunk blocks", (64 * 300 + 7, 3)),
)


@dataclass(frozen=True)
class Settings:
    policy: str
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

        policy = get("K3_SMOKE_ON_FAILURE", "stop")
        if policy not in POLICIES:
            raise ValueError(
                f"K3_SMOKE_ON_FAILURE={policy!r}; use one of {', '.join(POLICIES)}"
            )
        key_file = get("K3_API_KEY_FILE", "")
        return cls(
            policy=policy,
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


@dataclass
class Check:
    name: str
    status: str  # pass | fail | skip
    detail: str


@dataclass
class Stage:
    status: str = "running"  # running | pass | fail
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: str, detail: str) -> bool:
        self.checks.append(Check(name, status, detail))
        return status != "fail"


@dataclass
class Report:
    policy: str
    series_id: str
    verdict: str = "running"  # running | pass | fail
    started_at: str = field(default_factory=lambda: _now())
    finished_at: str | None = None
    stages: dict[str, Stage] = field(default_factory=dict)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, path)

    def summary(self) -> str:
        parts = []
        for name, stage in self.stages.items():
            checks = ", ".join(f"{c.name} {c.status}" for c in stage.checks)
            parts.append(f"{name}={stage.status} ({checks})")
        return (
            f"k3rocm.smoke: verdict={self.verdict} policy={self.policy} "
            f"series={self.series_id} " + " ".join(parts)
        )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# ---------------------------------------------------------------- stage 1


def check_patch_marker(stage: Stage, series: Series, target: Path) -> bool:
    """The vLLM tree in ``target`` carries exactly this series."""
    try:
        state = patchset.inspect(target, series)
    except patchset.Refusal as err:
        return stage.add("patch marker", "fail", str(err))
    if state.state != "applied":
        return stage.add(
            "patch marker",
            "fail",
            f"vLLM {state.vllm_version} in {target} is {state.state}: no "
            f"{series.series_id} patch marker; the image was not built by "
            "docker/build-steps.sh, or vLLM was reinstalled over it",
        )
    return stage.add(
        "patch marker",
        "pass",
        f"series {series.series_id} on vLLM {state.vllm_version} in {target}",
    )


def check_kimi_backend(stage: Stage) -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_rocm():
        return stage.add(
            "kimi backend",
            "skip",
            f"platform is {current_platform.device_type or 'unknown'}, not ROCm: "
            f"{BACKEND_NAME} is selected on ROCm only",
        )
    from vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn import (
        KimiGatedDeltaNetAttention as Layer,
    )

    # get_attn_backend reads nothing from the layer on ROCm; a bare instance
    # (no weights, no config) asks the real method the real question.
    name = Layer.get_attn_backend(Layer.__new__(Layer)).get_name()
    if name != BACKEND_NAME:
        return stage.add(
            "kimi backend", "fail", f"the Kimi KDA layer resolves to {name} on ROCm"
        )
    return stage.add("kimi backend", "pass", f"the Kimi KDA layer resolves to {name}")


MetadataBuilder = Callable[..., tuple]


def kernel_device() -> str | None:
    """Where the device kernel can run here: the GPU, the Triton interpreter
    on the CPU, or nowhere."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") == "1":
        # Off the GPU vllm.triton_utils hides Triton (no active driver); the
        # CPU development profile binds the real modules so the kernel runs
        # in the interpreter. Must happen before the kernel module is imported.
        import triton
        import triton.language as tl
        import vllm.triton_utils as triton_utils

        triton_utils.triton, triton_utils.tl, triton_utils.HAS_TRITON = (
            triton,
            tl,
            True,
        )
        return "cpu"
    return None


def compare_with_reference(
    build: MetadataBuilder,
    device: str,
    battery: Sequence[tuple[str, tuple[int, ...]]] = KERNEL_BATTERY,
) -> list[str]:
    """Names of the batches where ``build(cu_seqlens, cu_seqlens_cpu)``
    differs from the reference."""
    import torch

    mismatches = []
    for name, seq_lens in battery:
        cu_cpu = cu_seqlens_of(seq_lens)
        indices, offsets = build(cu_cpu.to(device), cu_cpu)
        want_indices, want_offsets = reference_chunk_metadata(seq_lens, CHUNK_SIZE)
        if not (
            torch.equal(indices.cpu().to(torch.int32), want_indices)
            and torch.equal(offsets.cpu().to(torch.int64), want_offsets)
        ):
            mismatches.append(f"{name} {list(seq_lens)[:8]}")
    return mismatches


def check_kernel_battery(stage: Stage, device: str | None) -> bool:
    if device is None:
        return stage.add(
            "device kernel",
            "skip",
            "no GPU, and TRITON_INTERPRET is not 1: nowhere to run the kernel",
        )
    from vllm.models.kimi_k3.amd.kda_metadata import prepare_chunk_metadata_device

    mismatches = compare_with_reference(prepare_chunk_metadata_device, device)
    if mismatches:
        return stage.add(
            "device kernel",
            "fail",
            f"differs from the reference on {device} for: " + "; ".join(mismatches),
        )
    return stage.add(
        "device kernel",
        "pass",
        f"equals the reference on {len(KERNEL_BATTERY)} batches on {device}",
    )


def sync_check(build: MetadataBuilder, legacy: MetadataBuilder) -> tuple[str, str]:
    """(status, detail): ``build`` must not synchronise the host with the
    device, ``legacy`` must (else the detector proves nothing here)."""
    import torch

    cu_cpu = cu_seqlens_of((5, 300, 0, 64, 1))
    cu_device = cu_cpu.to("cuda")
    build(cu_device, cu_cpu)  # compile outside the debug mode
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        try:
            build(cu_device, cu_cpu)
        except RuntimeError as err:
            return "fail", f"building the metadata synchronised: {err}"
        try:
            legacy(cu_device, cu_cpu)
        except RuntimeError:
            return "pass", (
                "our metadata build raised nothing under sync debug mode "
                "'error'; the legacy .tolist() path raised (negative control)"
            )
        return "fail", (
            "the legacy path raised nothing under sync debug mode 'error': "
            "the detector does not work here, so the check proves nothing"
        )
    finally:
        torch.cuda.set_sync_debug_mode(0)


def check_no_sync(stage: Stage, device: str | None) -> bool:
    if device != "cuda":
        return stage.add(
            "no device sync",
            "skip",
            "no GPU: torch.cuda.set_sync_debug_mode needs a device",
        )
    from vllm.models.kimi_k3.amd.kda_metadata import prepare_chunk_metadata_device
    from vllm.third_party.flash_linear_attention.ops.index import (
        prepare_chunk_indices,
    )

    status, detail = sync_check(
        prepare_chunk_metadata_device,
        lambda cu, _cu_cpu: prepare_chunk_indices(cu, CHUNK_SIZE),
    )
    return stage.add("no device sync", status, detail)


def run_stage1(stage: Stage, series: Series) -> None:
    # The vLLM this interpreter imports, as vLLM itself will.
    if not check_patch_marker(stage, series, patchset.find_installed_target()):
        return  # without the series, the other checks have nothing to check
    check_kimi_backend(stage)
    device = kernel_device()
    check_kernel_battery(stage, device)
    check_no_sync(stage, device)


# ---------------------------------------------------------------- stage 2


class Http:
    def __init__(self, base_url: str, api_key: str | None):
        self.base_url = base_url
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def get(self, path: str, timeout: float = 10) -> tuple[int, str]:
        request = urllib.request.Request(self.base_url + path, headers=self.headers)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()

    def post(self, path: str, body: dict, timeout: float) -> dict:
        request = urllib.request.Request(
            self.base_url + path, data=json.dumps(body).encode(), headers=self.headers
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())


def wait_for_health(http: Http, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http.get("/health", timeout=5)[0] == 200:
                return True
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(2)
    return False


def prefill_step_samples(metrics_text: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if (
                sample.name == STEP_COUNT_METRIC
                and sample.labels.get("kind") in PREFILL_KINDS
            ):
                total += sample.value
    return total


def long_prompt(http: Http, model: str, min_tokens: int) -> tuple[str, int]:
    """A prompt the server's own tokenizer counts at least min_tokens for."""
    prompt = PROMPT_SENTENCE
    while True:
        tokens = http.post("/tokenize", {"model": model, "prompt": prompt}, 30)
        if tokens["count"] >= min_tokens:
            return prompt, tokens["count"]
        prompt += PROMPT_SENTENCE


def run_stage2(stage: Stage, settings: Settings) -> None:
    http = Http(settings.base_url, settings.api_key)
    if not wait_for_health(http, settings.load_timeout):
        stage.add(
            "health",
            "fail",
            f"{settings.base_url}/health did not answer 200 within "
            f"{settings.load_timeout:.0f} s (K3_SMOKE_LOAD_TIMEOUT)",
        )
        return
    stage.add("health", "pass", f"{settings.base_url}/health answers 200")
    try:
        model = json.loads(http.get("/v1/models")[1])["data"][0]["id"]
        before = prefill_step_samples(http.get("/metrics")[1])
        prompt, prompt_tokens = long_prompt(
            http, model, (PROMPT_CHUNKS - 1) * CHUNK_SIZE + 1
        )
        answer = http.post(
            "/v1/completions",
            {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0},
            timeout=settings.stage2_timeout,
        )
    except (OSError, urllib.error.URLError, KeyError, ValueError) as err:
        stage.add("completion", "fail", f"request to {settings.base_url}: {err!r}")
        return
    served = answer.get("usage", {}).get("prompt_tokens", 0)
    chunks = -(-served // CHUNK_SIZE)
    if not answer.get("choices") or chunks < PROMPT_CHUNKS:
        stage.add(
            "completion",
            "fail",
            f"answer with {len(answer.get('choices', []))} choices for a "
            f"{served}-token prompt; wanted a completion over {PROMPT_CHUNKS}+ "
            "chunks",
        )
        return
    stage.add(
        "completion",
        "pass",
        f"{model} completed a {prompt_tokens}-token prompt ({chunks} chunks)",
    )
    # The plugin records a step when the engine reports it: allow a moment.
    after = before
    for _ in range(20):
        after = prefill_step_samples(http.get("/metrics")[1])
        if after > before:
            break
        time.sleep(0.5)
    if after <= before:
        stage.add(
            "prefill metrics",
            "fail",
            f"/metrics shows no new {STEP_COUNT_METRIC} sample for kind "
            f"{'/'.join(PREFILL_KINDS)} (still {before:.0f}): is the k3rocm "
            "metrics plugin loaded (the launcher's metrics flags)?",
        )
        return
    stage.add(
        "prefill metrics",
        "pass",
        f"{after - before:.0f} new prefill step samples on /metrics",
    )


# ---------------------------------------------------------------- driver


def run_with_timeout(
    run: Callable[[Stage], None], stage: Stage, timeout: float
) -> bool:
    """Run a stage in a thread; False if it did not finish in time (its
    thread is then abandoned: the caller exits the process)."""
    started = time.monotonic()

    def body() -> None:
        try:
            run(stage)
        except Exception as err:  # any crash is a failed check, not a hang
            stage.add("crashed", "fail", f"{type(err).__name__}: {err}")

    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    worker.join(timeout)
    stage.seconds = round(time.monotonic() - started, 2)
    if worker.is_alive():
        stage.add("timeout", "fail", f"did not finish within {timeout:.0f} s")
        stage.status = "fail"
        return False
    failed = any(check.status == "fail" for check in stage.checks)
    stage.status = "fail" if failed else "pass"
    return True


def finish(report: Report, settings: Settings, serving: bool) -> int:
    """Verdict, report, ready mark (when serving goes on) and summary line."""
    failed = any(stage.status != "pass" for stage in report.stages.values())
    report.verdict = "fail" if failed else "pass"
    report.finished_at = _now()
    report.write(settings.report)
    if serving and (not failed or settings.policy == "warn"):
        settings.ready_mark.write_text(report.verdict + "\n")
    print(report.summary(), flush=True)
    if not failed:
        return 0
    if settings.policy == "warn":
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3rocm.smoke", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--stage", choices=["1"], help="run stage 1 only")
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env(dict(os.environ))
    except (ValueError, OSError) as err:
        print(f"k3rocm.smoke: {err}", file=sys.stderr)
        return 2
    series = Series(default_series_dir())
    report = Report(policy=settings.policy, series_id=series.series_id)
    report.stages["stage1"] = stage1 = Stage()
    report.write(settings.report)

    stage1_in_time = run_with_timeout(
        lambda stage: run_stage1(stage, series), stage1, settings.stage1_timeout
    )
    report.write(settings.report)
    if args.stage:
        return _exit(finish(report, settings, serving=False), stage1_in_time)
    if stage1.status == "fail" and settings.policy == "stop":
        return _exit(finish(report, settings, serving=True), stage1_in_time)
    # vLLM may start now (see `python -m k3rocm.supervise serve`).
    settings.stage1_gate.write_text(stage1.status + "\n")

    report.stages["stage2"] = stage2 = Stage()
    stage2_in_time = run_with_timeout(
        lambda stage: run_stage2(stage, settings),
        stage2,
        settings.load_timeout + settings.stage2_timeout,
    )
    code = finish(report, settings, serving=True)
    return _exit(code, stage1_in_time and stage2_in_time)


def _exit(code: int, in_time: bool) -> int:
    """A stage thread that overran is stuck, maybe in a device call that
    would keep the interpreter from exiting: leave without waiting for it."""
    if not in_time:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
