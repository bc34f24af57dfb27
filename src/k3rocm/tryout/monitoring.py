"""The try-out's Prometheus and Alertmanager images: compose.yaml's pinned
ones from Docker Hub where this host has them or can pull them, else built
here from Debian's packages (`prometheus`, `prometheus-alertmanager`) on the
stand-in base's Debian, so a host that cannot reach Docker Hub still sees
the step metrics scraped and the alert rules loaded.

    --monitoring-from auto    the pinned image, else one built from Debian
    --monitoring-from hub     the pinned image, or stop and say so
    --monitoring-from debian  built from Debian, without asking Docker Hub

An image given with --prometheus-image / --alertmanager-image is used as
given (here, or pulled) in every mode. The container tests build their
monitoring images with ``debian_image`` too. Once the stack is up, the
try-out waits for each server's readiness and for Prometheus to answer a
query of the step-latency metric with data.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from k3rocm.common.metric_names import STEP_DURATION

SOURCES = ("auto", "hub", "debian")
# Each service's Debian package and the server it installs.
DEBIAN_SERVERS = {
    "prometheus": ("prometheus", "/usr/bin/prometheus"),
    "alertmanager": ("prometheus-alertmanager", "/usr/bin/prometheus-alertmanager"),
}
IMAGE_REPO = "kimi-k3-rocm-cpu"
REPO = Path(__file__).resolve().parents[3]
# Prometheus scrapes every 15 s (monitoring/prometheus.yml).
QUERY_SECONDS = 90


class MonitoringError(Exception):
    """A monitoring image that cannot be had, in one line."""


def debian_dockerfile(os_image: str, service: str) -> str:
    package, server = DEBIAN_SERVERS[service]
    return (
        f"FROM {os_image}\n"
        "RUN apt-get update -qq \\\n"
        " && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        f"--no-install-recommends {package} \\\n"
        " && rm -rf /var/lib/apt/lists/*\n"
        f'ENTRYPOINT ["{server}"]\n'
    )


def debian_image(os_image: str, service: str) -> str:
    """``service``'s image from its Debian package on ``os_image`` (built once
    per Dockerfile; apt reaches Debian through the host's network)."""
    dockerfile = debian_dockerfile(os_image, service)
    key = hashlib.sha256(dockerfile.encode()).hexdigest()[:12]
    ref = f"{IMAGE_REPO}-{service}:debian-{key}"
    if not _here(ref):
        built = subprocess.run(
            ["docker", "build", "--network", "host", "--tag", ref, "-"],
            input=dockerfile,
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            tail = (built.stderr or built.stdout).strip().splitlines()[-5:]
            raise MonitoringError(
                f"building {service} from Debian's package {DEBIAN_SERVERS[service][0]}"
                f" failed (Debian must be reachable): {' / '.join(tail)}"
            )
    return ref


def _here(ref: str) -> bool:
    inspect = ["docker", "image", "inspect", ref]
    return subprocess.run(inspect, capture_output=True).returncode == 0


def _pull(ref: str) -> str | None:
    """None when pulled, else why not."""
    pulled = subprocess.run(["docker", "pull", ref], capture_output=True, text=True)
    if pulled.returncode == 0:
        return None
    return (pulled.stderr.strip().splitlines() or ["no reason given"])[-1]


def monitoring_image(
    service: str,
    ref: str,
    *,
    given: bool,
    source: str,
    os_image: Callable[[], str],
    log: Callable[[str], None],
) -> str:
    """The image ``service`` runs: ``ref`` (compose.yaml's pinned image, or
    the one the operator ``given``) where it is here or can be pulled, or
    one built from Debian as ``source`` allows."""
    if source == "debian" and not given:
        log(f"building {service} from Debian's package ...")
        return debian_image(os_image(), service)
    if _here(ref):
        return ref
    log(f"pulling {ref} ({service}) ...")
    why = _pull(ref)
    if why is None:
        return ref
    if given or source == "hub":
        raise MonitoringError(
            f"cannot pull {ref}, the image of {service} ({why}); give one this "
            f"host has or can pull with --{service}-image REF, build it from "
            "Debian with --monitoring-from debian, or try it without "
            "monitoring: --no-monitoring"
        )
    log(f"cannot pull {ref} ({why}); building {service} from Debian's package ...")
    return debian_image(os_image(), service)


def standin_os_image() -> str:
    """The stand-in base's Debian (scripts/standin-base), to build the
    monitoring servers on."""
    standin = REPO / "scripts" / "standin-base"
    built = subprocess.run(
        [sys.executable, str(standin), "build", "--variant", "os"],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        tail = built.stderr.strip().splitlines()[-3:]
        raise MonitoringError(f"the stand-in's Debian image: {' / '.join(tail)}")
    return built.stdout.strip().splitlines()[-1]


def settle_monitoring(
    state: Path, services: tuple[str, ...], args, log: Callable[[str], None]
) -> None:
    """Each monitoring service's image, here, pulled or built from Debian as
    --monitoring-from allows (k3rocm.tryout.monitoring), written into the
    stack; says where each came from."""
    stack = json.loads((state / "compose.json").read_text())
    for service in services:
        ref = stack["services"][service]["image"]
        chosen = monitoring_image(
            service,
            ref,
            given=bool(getattr(args, f"{service}_image")),
            source=args.monitoring_from,
            os_image=standin_os_image,
            log=log,
        )
        if chosen != ref:
            log(f"{service} runs {chosen}, built from Debian's package")
        stack["services"][service]["image"] = chosen
    (state / "compose.json").write_text(json.dumps(stack, indent=1) + "\n")


def wait_ready(compose: list[str], service: str, url: str, timeout: float) -> None:
    """A monitoring server's readiness endpoint answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            logs = subprocess.run(
                [*compose, "logs", "--tail", "20", service],
                capture_output=True,
                text=True,
            )
            raise MonitoringError(
                f"{service} is not ready at {url} after {timeout:.0f} s; its last "
                f"lines:\n{logs.stdout}{logs.stderr}"
            )
        time.sleep(2)


def step_query(prometheus: str) -> str:
    """A query of the step-latency metric that answers with data, once
    Prometheus has scraped the server after the completion."""
    query = f"{prometheus}/api/v1/query?query={STEP_DURATION}_count"
    deadline = time.monotonic() + QUERY_SECONDS
    while True:
        try:
            with urllib.request.urlopen(query, timeout=10) as response:
                if json.load(response)["data"]["result"]:
                    return query
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise MonitoringError(
                f"Prometheus has no {STEP_DURATION} after {QUERY_SECONDS} s: "
                f"{prometheus}/targets shows why (the server's target down?)"
            )
        time.sleep(3)
