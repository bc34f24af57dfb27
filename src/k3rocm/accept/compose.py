"""The host side's handle on the compose service: bring it up with given
settings, wait for it to be healthy, read its K3_KDA_METADATA, and run
``python -m k3rocm.accept`` in it (``compose exec``), reading its JSON report
back. Stdlib only."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

from k3rocm.accept.report import REPORT_JSON
from k3rocm.common.setting_kinds import SettingError
from k3rocm.common.setting_table import KDA_METADATA


class AbError(Exception):
    """Something the operator has to look at; one line."""


@dataclass
class Compose:
    command: list[str]
    service: str
    docker: str = "docker"

    def run(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(
                [*self.command, *args],
                env=None if env is None else dict(env),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except OSError as err:
            raise AbError(f"cannot run {self.command[0]!r}: {err}") from None
        except subprocess.TimeoutExpired:
            raise AbError(f"{' '.join(args[:3])} ran past {timeout:.0f} s") from None

    def up(self, env: Mapping[str, str]) -> None:
        """Bring the service to ``env``'s settings: compose recreates it only
        when they differ from the running container's."""
        done = self.run("up", "-d", "--no-deps", self.service, env=env, timeout=3600)
        if done.returncode != 0:
            raise AbError(f"compose up failed: {last_line(done)}")

    def container(self) -> str:
        done = self.run("ps", "-q", self.service)
        cid = done.stdout.strip()
        if done.returncode != 0 or not cid:
            raise AbError(f"no running container of {self.service}: {last_line(done)}")
        return cid.splitlines()[-1]

    def inspect(self, cid: str) -> dict:
        try:
            done = subprocess.run(
                [self.docker, "inspect", cid], capture_output=True, text=True
            )
        except OSError as err:
            raise AbError(f"cannot run {self.docker!r}: {err}") from None
        if done.returncode != 0:
            raise AbError(f"docker inspect {cid[:12]} failed: {last_line(done)}")
        return json.loads(done.stdout)[0]

    def wait_healthy(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            cid = self.container()
            state = self.inspect(cid)["State"]
            health = state.get("Health", {}).get("Status", "none")
            if not state.get("Running"):
                raise AbError(
                    f"{self.service} stopped (exit {state.get('ExitCode')}); "
                    f"see `docker logs {cid[:12]}`"
                )
            if health == "healthy":
                return cid
            if time.monotonic() > deadline:
                raise AbError(f"{self.service} not healthy after {timeout:.0f} s")
            time.sleep(10)

    def path_of(self, cid: str) -> str:
        """The container's K3_KDA_METADATA (its default when unset); AbError
        when it holds no metadata path."""
        env = dict(
            item.split("=", 1) for item in self.inspect(cid)["Config"]["Env"] or ()
        )
        try:
            return str(KDA_METADATA.read(env))
        except SettingError as error:
            raise AbError(f"the service's {error}") from None

    def accept(
        self, args: list[str], directory: str, timeout: float
    ) -> tuple[int, dict | None]:
        done = self.run(
            "exec", "-T", self.service, "python3", "-m", "k3rocm.accept",
            "--output-dir", directory, *args, timeout=timeout,
        )  # fmt: skip
        sys.stderr.write(done.stderr)
        shown = self.run(
            "exec", "-T", self.service, "cat", f"{directory}/{REPORT_JSON}"
        )
        try:
            return done.returncode, json.loads(shown.stdout)
        except ValueError:
            return done.returncode, None


def last_line(done: subprocess.CompletedProcess) -> str:
    lines = (done.stderr or done.stdout or "").strip().splitlines()
    return lines[-1][:300] if lines else f"exit {done.returncode}"


def default_compose() -> list[str]:
    try:
        plugin = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False
        ).returncode
    except OSError:
        plugin = 1
    return ["docker", "compose"] if plugin == 0 else ["docker-compose"]
