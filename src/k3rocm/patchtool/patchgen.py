"""Generate the series' patches that only add a file from that file's source.

The 0.27.1 line's patch 0002 adds three whole modules to vLLM: the device
chunk-metadata kernel (``kda_metadata_kernel.py``), its host side
(``kda_metadata_launch.py``: the compiled launches, their warm-up and the
call a step makes) and the builder and backend (``kda_metadata.py``); the
0.32.0 line's patch 0001 adds the first two (0.32.0 has its own builder);
patch 0005 of 0.27.1 adds the precompiled KDA launches
(``kda_chunk_launch.py``, which the other patches import, and the modules
it re-exports from, one job each); the 0.32.0 line's 0006 its recurrent
warm-up and 0008 its direct recurrent launch, with 0.27.1's
``kda_direct_launch.py`` (one source, two lines' trees). Their code lives
in this repository as real, linted source files under
``src/k3rocm/kernels/``, and the patch is written from them, so the two
cannot drift apart unnoticed (``--check``; a test runs it)::

    k3rocm patchgen            # rewrite the generated patches
    k3rocm patchgen --check    # exit 1 if one is out of date

A generated patch keeps its own description (the text before its first
``--- `` line); everything after it is made from the source. After a
change, the series id changes too: update ``K3_SERIES_ID`` in compose.yaml.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from k3rocm.common.line_log import line_logger

log = line_logger("k3rocm.patchtool.patchgen")

REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class GeneratedFile:
    source: str  # the file's source, relative to the repository
    target: str  # where the patch creates it, relative to the vLLM tree

    def diff(self, repo: Path) -> bytes:
        """A diff that creates ``target`` with exactly the bytes of ``source``."""
        code = (repo / self.source).read_bytes()
        if not code.endswith(b"\n"):
            raise ValueError(f"{self.source} must end with a newline")
        lines = code.split(b"\n")[:-1]
        header = (
            b"--- /dev/null\n"
            + f"+++ b/{self.target}\n".encode()
            + f"@@ -0,0 +1,{len(lines)} @@\n".encode()
        )
        return header + b"".join(b"+" + line + b"\n" for line in lines)


@dataclass(frozen=True)
class GeneratedPatch:
    line: str  # the release line (its folder under patches/)
    patch: str  # the patch's file name in that folder
    files: tuple[GeneratedFile, ...]  # created in this order

    @property
    def path(self) -> str:
        """The patch file, relative to the repository."""
        return f"patches/{self.line}/{self.patch}"

    def render(self, repo: Path = REPO) -> bytes:
        """The patch file's bytes: its description, then one diff per file."""
        return self.description(repo) + b"".join(f.diff(repo) for f in self.files)

    def description(self, repo: Path = REPO) -> bytes:
        current = (repo / self.path).read_bytes()
        cut = current.find(b"\n--- ")
        if current.startswith(b"--- ") or cut < 0:
            raise ValueError(f"{self.path} has no description")
        return current[: cut + 1]


def _metadata_modules(*names: str) -> tuple[GeneratedFile, ...]:
    return tuple(
        GeneratedFile(
            source=f"src/k3rocm/kernels/{name}",
            target=f"vllm/models/kimi_k3/amd/{name}",
        )
        for name in names
    )


GENERATED = (
    GeneratedPatch(
        line="0.27.1",
        patch="0002-kimi-k3-rocm-kda-backend.patch",
        files=_metadata_modules(
            "kda_metadata_kernel.py", "kda_metadata_launch.py", "kda_metadata.py"
        ),
    ),
    # 0.32.0 has its own builder (amd/kda_metadata.py); the line's 0002 edits it.
    GeneratedPatch(
        line="0.32.0",
        patch="0001-kimi-k3-rocm-kda-metadata-kernel.patch",
        files=_metadata_modules("kda_metadata_kernel.py", "kda_metadata_launch.py"),
    ),
    GeneratedPatch(
        line="0.32.0",
        patch="0006-kimi-k3-rocm-kda-recurrent-warm-up.patch",
        files=_metadata_modules("kda_recurrent_warm_up.py"),
    ),
    GeneratedPatch(
        line="0.32.0",
        patch="0008-kimi-k3-rocm-kda-recurrent-direct-launch-module.patch",
        files=_metadata_modules("kda_direct_launch.py", "kda_recurrent_launch.py"),
    ),
    GeneratedPatch(
        line="0.27.1",
        patch="0005-amd-kda-chunk-launch-module.patch",
        # The facade first (its docstring maps the rest), then the modules in
        # the order they build on each other.
        files=tuple(
            GeneratedFile(
                source=f"src/k3rocm/kernels/{name}",
                target=f"vllm/models/kimi_k3/amd/ops/third_party/kda/{name}",
            )
            for name in (
                "kda_chunk_launch.py",
                "kda_direct_launch.py",
                "kda_chunk_forward.py",
                "kda_chunk_plans.py",
                "kda_recurrent_plans.py",
                "kda_launch_entry.py",
                "kda_launch_warm_up.py",
            )
        ),
    ),
)


def stale(repo: Path = REPO) -> list[str]:
    """Generated patches whose committed bytes differ from their source's."""
    return [p.path for p in GENERATED if (repo / p.path).read_bytes() != p.render(repo)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="k3rocm patchgen")
    parser.add_argument(
        "--check", action="store_true", help="report stale patches, write nothing"
    )
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out_of_date = stale(args.repo)
    if args.check:
        for path in out_of_date:
            log(f"{path} is out of date with its source; run: k3rocm patchgen")
        return 1 if out_of_date else 0
    for p in GENERATED:
        if p.path in out_of_date:
            (args.repo / p.path).write_bytes(p.render(args.repo))
            sources = ", ".join(f.source for f in p.files)
            print(f"wrote {p.path} from {sources}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
