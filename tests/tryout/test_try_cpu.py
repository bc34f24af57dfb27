"""scripts/try-cpu, the one-command CPU try-out README offers, run as a
newcomer runs it: it builds, brings up the compose stack, answers a
completion and stops cleanly with the command it printed; it says what is
missing (Compose, the engine) before building, names a monitoring image it
cannot pull, and runs without monitoring when asked.

Stand-ins (docs/testing.md): the stand-in base is the one the script itself
builds; Prometheus and Alertmanager are the images the script itself builds
from Debian's packages (--monitoring-from debian), since Docker Hub cannot
be reached (on a machine that can, auto runs compose.yaml's pinned images).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from support.docker_images import build_standin, docker, http
from support.vllm_trees import REPO
from support.workers import free_port

from k3rocm.tryout.monitoring import MonitoringError, debian_image, monitoring_image

TRY_CPU = REPO / "scripts" / "try-cpu"
PROJECT = "k3rocmtesttry"
# A registry nobody listens on: the engine's pull fails for real, at once.
UNPULLABLE = "127.0.0.1:9/k3rocm-test/absent:1"


def try_cpu(
    *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TRY_CPU), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def stop_as_printed(printed: str) -> subprocess.CompletedProcess:
    """The "stop it:" command the try-out printed, run as printed."""
    [line] = [line for line in printed.splitlines() if line.startswith("stop it:")]
    script, *args = shlex.split(line.removeprefix("stop it:"))
    assert script == "scripts/try-cpu", line
    return try_cpu(*args, timeout=600)


def containers_of(project: str) -> str:
    listed = docker(
        "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"
    )
    return listed.stdout.strip()


def test_help_lists_the_port_defaults():
    shown = try_cpu("--help", timeout=60)
    assert shown.returncode == 0, shown.stderr
    for option, what, default in (
        ("--api-port N", "the API and /metrics", 8000),
        ("--prometheus-port N", "Prometheus", 9090),
        ("--alertmanager-port N", "Alertmanager", 9093),
    ):
        line = rf"{option}\s+host port of {what} \(default: {default}\)"
        assert re.search(line, shown.stdout), shown.stdout
    assert '"nothing was running under project' in shown.stdout


def test_missing_docker_is_said_before_anything_is_built(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}
    done = try_cpu("--state-dir", str(tmp_path / "state"), timeout=60, env=env)
    assert done.returncode == 1
    assert (
        done.stderr == "try-cpu: docker is not installed (the try-out needs Docker)\n"
    )
    assert not (tmp_path / "state").exists()


def test_missing_compose_is_said_before_anything_is_built(tmp_path):
    """The real docker CLI alone on PATH: no docker-compose, and this
    machine's docker has no compose plugin (scripts/test installs Debian's
    docker-compose, not the plugin)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "docker").symlink_to(shutil.which("docker"))
    env = {**os.environ, "PATH": str(tools)}
    plugin = subprocess.run(["docker", "compose", "version"], env=env)
    if plugin.returncode == 0:
        pytest.skip("this docker has the compose plugin, which PATH cannot hide")
    done = try_cpu("--state-dir", str(tmp_path / "state"), timeout=60, env=env)
    assert done.returncode == 1
    assert done.stderr == (
        "try-cpu: Compose is missing: install the docker compose plugin (or "
        "docker-compose)\n"
    )
    assert not (tmp_path / "state").exists()


def test_an_engine_that_does_not_answer_is_said_before_anything_is_built(tmp_path):
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    done = try_cpu("--state-dir", str(tmp_path / "state"), timeout=60, env=env)
    assert done.returncode == 1
    assert done.stderr.startswith(
        "try-cpu: Docker's engine does not answer (docker info: "
    ), done.stderr
    assert "no-engine.sock" in done.stderr and "building" not in done.stderr
    assert done.stderr.endswith("; as root, scripts/docker-engine start starts one\n")
    assert not (tmp_path / "state").exists()


def test_without_dockerd_the_packages_to_install_are_named(tmp_path):
    """docker and Compose on PATH, no dockerd and no engine: the next step
    is Debian's packages, then the repository's starter."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("docker", "docker-compose"):
        (tools / name).symlink_to(shutil.which(name))
    env = {
        **os.environ,
        "PATH": str(tools),
        "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",
    }
    done = try_cpu("--state-dir", str(tmp_path / "state"), timeout=60, env=env)
    assert done.returncode == 1
    assert done.stderr.endswith(
        "; dockerd is not installed: apt-get install docker.io iptables, then as "
        "root, scripts/docker-engine start starts one\n"
    ), done.stderr


@pytest.mark.docker
def test_try_cpu_brings_up_the_stack_answers_and_stops(standin, image, tmp_path):
    """Offline, as a host that cannot reach Docker Hub: the monitoring
    servers are built from Debian's packages (--monitoring-from debian, so
    the test never asks Docker Hub), the whole stack comes up, and the
    printed step query answers with data."""
    api, prometheus_port, alertmanager_port = free_port(), free_port(), free_port()
    where = ["--state-dir", str(tmp_path / "state"), "--project", PROJECT]
    printed = ""
    try:
        up = try_cpu(
            *where,
            *("--api-port", str(api), "--prometheus-port", str(prometheus_port)),
            *("--alertmanager-port", str(alertmanager_port)),
            *("--monitoring-from", "debian"),
            timeout=3000,
        )
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-5000:]
        printed = up.stdout
        assert "completion of 'The stall-free prefill path': '" in printed, printed
        for url in (
            f"http://127.0.0.1:{api}/v1",
            f"http://127.0.0.1:{api}/metrics",
            f"Prometheus:   http://127.0.0.1:{prometheus_port}",
            f"Alertmanager: http://127.0.0.1:{alertmanager_port}",
            f"targets:      http://127.0.0.1:{prometheus_port}/targets",
        ):
            assert url in printed, (url, printed)
        for service in ("prometheus", "alertmanager"):
            assert f"try-cpu: building {service} from Debian's package" in up.stderr
        [query] = [line for line in printed.splitlines() if line.startswith("step")]
        status, answer = http(query.removeprefix("step query:").strip())
        assert status == 200 and json.loads(answer)["data"]["result"], answer
        # What it printed answers: the smoke verdict is a pass on /metrics, the
        # API completes a request of our own, the monitoring servers are up.
        _, metrics = http(f"http://127.0.0.1:{api}/metrics")
        assert "\nk3rocm_smoke_verdict 1.0" in metrics
        body = {"model": "kimi-k3", "prompt": "a b c", "max_tokens": 3}
        status, answer = http(f"http://127.0.0.1:{api}/v1/completions", body)
        assert status == 200 and json.loads(answer)["usage"]["completion_tokens"] == 3
        assert http(f"http://127.0.0.1:{prometheus_port}/-/ready")[0] == 200
        assert http(f"http://127.0.0.1:{alertmanager_port}/-/ready")[0] == 200
        # The stop command names this project and state directory.
        down = stop_as_printed(printed)
    finally:
        if containers_of(PROJECT):
            try_cpu(*where, "--down", timeout=600)
    assert down.returncode == 0, down.stderr[-3000:]
    assert down.stderr == f"try-cpu: stopped the try-out of project {PROJECT}\n"
    assert containers_of(PROJECT) == ""
    again = stop_as_printed(printed)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr == f"try-cpu: nothing was running under project {PROJECT}\n"


@pytest.mark.docker
def test_an_unpullable_monitoring_image_is_named_and_no_monitoring_runs_alone(
    image, tmp_path
):
    """A pull that fails for real (a registry address nobody listens on) is
    named with the options that avoid it, before anything starts; then the
    server alone, while `--down` of another project stops nothing and says
    which project runs."""
    project = f"{PROJECT}solo"
    api = free_port()
    where = ["--state-dir", str(tmp_path / "state"), "--project", project]
    failed = try_cpu(
        *where, "--api-port", str(api), "--prometheus-image", UNPULLABLE, timeout=3000
    )
    assert failed.returncode == 1, failed.stderr[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"try-cpu: cannot pull {UNPULLABLE}, the image of prometheus ("
    ), failed.stderr[-3000:]
    assert last.endswith(
        "); give one this host has or can pull with --prometheus-image REF, "
        "build it from Debian with --monitoring-from debian, or try it without "
        "monitoring: --no-monitoring"
    ), last
    assert containers_of(project) == ""
    printed = ""
    try:
        up = try_cpu(*where, "--api-port", str(api), "--no-monitoring", timeout=3000)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-5000:]
        printed = up.stdout
        assert f"http://127.0.0.1:{api}/v1" in printed
        assert "Prometheus" not in printed and "Alertmanager" not in printed
        services = docker(
            "ps", "--filter", f"label=com.docker.compose.project={project}",
            "--format", '{{.Label "com.docker.compose.service"}}',
        ).stdout.split()  # fmt: skip
        assert services == ["kimi-k3"]
        body = {"model": "kimi-k3", "prompt": "a b c", "max_tokens": 3}
        assert http(f"http://127.0.0.1:{api}/v1/completions", body)[0] == 200

        other = try_cpu(
            "--down", "--state-dir", str(tmp_path / "other"), "--project", "nosuch",
            timeout=120,
        )  # fmt: skip
        assert other.returncode == 1
        assert other.stderr == (
            "try-cpu: nothing was running under project nosuch\n"
            f"try-cpu: a try-out runs under project {project}: scripts/try-cpu "
            f"--down --state-dir {tmp_path / 'state'} --project {project}\n"
        )
        assert containers_of(project) != ""
        down = stop_as_printed(printed)
    finally:
        if containers_of(project):
            try_cpu(*where, "--down", timeout=600)
    assert down.returncode == 0, down.stderr[-3000:]
    assert containers_of(project) == ""


@pytest.mark.docker
def test_auto_builds_from_debian_only_what_cannot_be_pulled():
    """--monitoring-from auto on a pinned image whose pull fails for real
    builds the service from Debian (the image the other tests built, reused)
    and says why; hub, or an image the operator named, stops with the way
    out instead."""
    said: list[str] = []
    os_image = build_standin("os")
    ref = monitoring_image(
        "prometheus",
        UNPULLABLE,
        given=False,
        source="auto",
        os_image=lambda: os_image,
        log=said.append,
    )
    assert ref == debian_image(os_image, "prometheus")
    assert said[-1].startswith(f"cannot pull {UNPULLABLE} (")
    assert said[-1].endswith("); building prometheus from Debian's package ...")
    for given, source in ((False, "hub"), (True, "auto"), (True, "debian")):
        with pytest.raises(MonitoringError, match="--monitoring-from debian"):
            monitoring_image(
                "prometheus",
                UNPULLABLE,
                given=given,
                source=source,
                os_image=lambda: os_image,
                log=said.append,
            )
