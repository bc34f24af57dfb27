"""Generate the series' patches that only add a file from that file's source.

Patch 0002 adds one whole module to vLLM (the device chunk-metadata kernel
and its builder). Its code lives in this repository as a real, linted source
file, ``src/k3rocm/kernels/kda_metadata.py``, and the patch is written from
it, so the two cannot drift apart unnoticed (``--check``; a test runs it)::

    python -m k3rocm.patchgen            # rewrite the generated patches
    python -m k3rocm.patchgen --check    # exit 1 if one is out of date

A generated patch keeps its own description (the text before its first
``--- `` line); everything after it is made from the source. After a
change, the series id changes too: update ``K3_SERIES_ID`` in compose.yaml.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class GeneratedPatch:
    patch: str  # file name under patches/
    source: str  # the file's source, relative to the repository
    target: str  # where the patch creates it, relative to the vLLM tree

    def render(self, repo: Path = REPO) -> bytes:
        """The patch file's bytes: its description, then a diff that creates
        ``target`` with exactly the bytes of ``source``."""
        code = (repo / self.source).read_bytes()
        if not code.endswith(b"\n"):
            raise ValueError(f"{self.source} must end with a newline")
        lines = code.split(b"\n")[:-1]
        header = (
            b"--- /dev/null\n"
            + f"+++ b/{self.target}\n".encode()
            + f"@@ -0,0 +1,{len(lines)} @@\n".encode()
        )
        return (
            self.description(repo)
            + header
            + b"".join(b"+" + line + b"\n" for line in lines)
        )

    def description(self, repo: Path = REPO) -> bytes:
        current = (repo / "patches" / self.patch).read_bytes()
        cut = current.find(b"\n--- ")
        if current.startswith(b"--- ") or cut < 0:
            raise ValueError(f"patches/{self.patch} has no description")
        return current[: cut + 1]


GENERATED = (
    GeneratedPatch(
        patch="0002-kimi-k3-rocm-kda-backend.patch",
        source="src/k3rocm/kernels/kda_metadata.py",
        target="vllm/models/kimi_k3/amd/kda_metadata.py",
    ),
)


def stale(repo: Path = REPO) -> list[str]:
    """Generated patches whose committed bytes differ from their source's."""
    return [
        p.patch
        for p in GENERATED
        if (repo / "patches" / p.patch).read_bytes() != p.render(repo)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m k3rocm.patchgen")
    parser.add_argument(
        "--check", action="store_true", help="report stale patches, write nothing"
    )
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out_of_date = stale(args.repo)
    if args.check:
        for name in out_of_date:
            print(
                f"patches/{name} is out of date with its source; "
                "run: python -m k3rocm.patchgen",
                file=sys.stderr,
            )
        return 1 if out_of_date else 0
    for p in GENERATED:
        if p.patch in out_of_date:
            (args.repo / "patches" / p.patch).write_bytes(p.render(args.repo))
            print(f"wrote patches/{p.patch} from {p.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
