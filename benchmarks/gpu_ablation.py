"""Kernel-time ablation of the series' metadata kernel on the lent GPU: the
kernel as committed against copies that change one thing each, the kernel
of the previous series revision, and upstream's, in interleaved rounds.

    python3 benchmarks/gpu_ablation.py     # needs .gpu/ (gpu_bundle.py)

Copies are made from the bundled source text (the edited kernel module
beside an unchanged copy of the host module, as a package of their own); a
copy whose edit no longer matches the source fails loudly rather than
measuring the unchanged kernel.
"""

import functools
import importlib
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_bench  # noqa: E402  (loads the patched bundle behind the shims)
from kda_harness import BUNDLE  # noqa: E402

SERIES_DIR = BUNDLE / "patched/vllm/models/kimi_k3/amd"
HOST_SOURCE = (SERIES_DIR / "kda_metadata_launch.py").read_text()
SOURCE = (SERIES_DIR / "kda_metadata_kernel.py").read_text()
EDITS = {
    "cu_seqlens alignment specialized": (
        ', do_not_specialize_on_alignment=["cu_seqlens"]',
        "",
    ),
    "prefix loop in every variant": (
        "    if LOOP_PAST_WIDTH:\n",
        "    if True:\n",
    ),
}


def load(name: str, text: str):
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_edited(name: str, kernel_text: str):
    """The host module over an edited kernel module, as package `name`."""
    root = Path(tempfile.mkdtemp())
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    (root / name / "kda_metadata_launch.py").write_text(HOST_SOURCE)
    (root / name / "kda_metadata_kernel.py").write_text(kernel_text)
    sys.path.insert(0, str(root))
    return importlib.import_module(f"{name}.kda_metadata_launch")


def previous_kernel_text() -> str | None:
    """The previous revision's kernel, saved by gpu_bundle.py if git had it."""
    saved = BUNDLE / "previous_kda_metadata.py"
    return saved.read_text() if saved.is_file() else None


def main() -> None:
    kernels = {"committed": gpu_bench.ours, "upstream": gpu_bench.upstream}
    for i, (name, (old, new)) in enumerate(EDITS.items()):
        if old not in SOURCE:
            sys.exit(f"edit {name!r} no longer matches the kernel source")
        module = load_edited(f"ablation_{i}", SOURCE.replace(old, new))
        kernels[name] = module.prepare_chunk_metadata_device
    previous = previous_kernel_text()
    if previous is not None:
        module = load("previous_kernel", previous)
        kernels["previous revision"] = module.prepare_chunk_metadata_device
    report = {}
    for shape in ("8x8k", "64x2k", "256 mixed", "2000x100", "1x1M"):
        seq_lens = gpu_bench.SHAPES[shape]
        report[shape] = gpu_bench.summarize(
            gpu_bench.interleaved(
                {
                    name: functools.partial(gpu_bench.kernel_round, fn, seq_lens)
                    for name, fn in kernels.items()
                }
            ),
            "committed",
            [name for name in kernels if name != "committed"],
        )
        print(
            shape,
            *(f"{n}={v['median']:.3f}" for n, v in report[shape].items()),
            flush=True,
        )
    out = Path(os.environ.get("OUT", "/tmp")) / "ablation.json"
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
