"""scripts/try-cpu's command line (its description and epilog are the
docstring of k3rocm.tryout.cli)."""

from __future__ import annotations

import argparse
from pathlib import Path

from k3rocm.tryout.monitoring import SOURCES

REPO = Path(__file__).resolve().parents[3]
DEFAULT_STATE_DIR = REPO / ".cache" / "try-cpu"
DEFAULT_PROJECT = "k3rocm-try"


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scripts/try-cpu",
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n")[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--down", action="store_true", help="stop the try-out")
    p.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help="where the model, the stack and its settings are kept "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--project",
        default=DEFAULT_PROJECT,
        help="Compose project name (default: %(default)s)",
    )
    p.add_argument(
        "--api-port",
        type=int,
        default=8000,
        metavar="N",
        help="host port of the API and /metrics (default: %(default)s)",
    )
    p.add_argument(
        "--prometheus-port",
        type=int,
        default=9090,
        metavar="N",
        help="host port of Prometheus (default: %(default)s)",
    )
    p.add_argument(
        "--alertmanager-port",
        type=int,
        default=9093,
        metavar="N",
        help="host port of Alertmanager (default: %(default)s)",
    )
    p.add_argument(
        "--prometheus-image",
        metavar="REF",
        help="instead of compose.yaml's pinned one (from Docker Hub)",
    )
    p.add_argument(
        "--alertmanager-image",
        metavar="REF",
        help="instead of compose.yaml's pinned one (from Docker Hub)",
    )
    p.add_argument(
        "--monitoring-from",
        choices=SOURCES,
        default="auto",
        help="compose.yaml's pinned monitoring images from Docker Hub, else "
        "built from Debian's packages (auto); only from Docker Hub (hub); or "
        "built from Debian without asking Docker Hub (debian) "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--no-monitoring",
        action="store_true",
        help="start the server alone, without Prometheus and Alertmanager",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=1200,
        metavar="SECONDS",
        help="seconds the server may take to become healthy (default: %(default)s)",
    )
    return p  # fmt: skip
