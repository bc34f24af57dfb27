"""Every flag the release table spells (k3rocm.common.vllm_release) is one
the installed vLLM's own parsers take, in each spelling: `vllm serve`'s for
the flags the launcher, the recipe and the try-out write, `vllm bench
serve`'s for the acceptance run's. A release entry with a renamed or
misspelled flag fails here, before any command is built from it."""

from __future__ import annotations

import importlib
from dataclasses import fields

import pytest

from k3rocm.common.vllm_release import TARGET, VllmFlag

pytestmark = pytest.mark.every_line


def _options(add_arguments) -> dict[str, str]:
    """Each option string of a parser built by ``add_arguments``, with the
    destination it stores to."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(add_help=False)
    add_arguments(parser)
    return {
        option: action.dest
        for action in parser._actions
        for option in action.option_strings
    }


def _serve_parser(parser) -> None:
    make_arg_parser = importlib.import_module(TARGET.serve_args_module).make_arg_parser

    make_arg_parser(parser)


def _bench_parser(parser) -> None:
    from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand

    BenchmarkServingSubcommand.add_cli_args(parser)


def _flags(table) -> list[tuple[str, VllmFlag]]:
    return [(field.name, getattr(table, field.name)) for field in fields(table)]


@pytest.mark.parametrize(
    ("table", "add_arguments"),
    [(TARGET.serve, _serve_parser), (TARGET.bench, _bench_parser)],
    ids=["vllm serve", "vllm bench serve"],
)
def test_each_flag_is_the_parsers_in_every_spelling(table, add_arguments):
    options = _options(add_arguments)
    wrong = [
        f"{name}: {spelling}"
        for name, flag in _flags(table)
        for spelling in flag.spellings
        if options.get(spelling) != flag.dest
    ]
    assert not wrong, f"not options of the installed vLLM's parser: {wrong}"


def test_the_table_knows_every_spelling_of_its_flags():
    """An alias vLLM adds to an owned flag would slip past the launcher's
    check where no vLLM answers (it reads the table's spellings)."""
    options = _options(_serve_parser)
    missing = [
        f"{name}: {option}"
        for name, flag in _flags(TARGET.serve)
        for option, dest in options.items()
        if dest == flag.dest
        and option not in flag.spellings
        and not option.startswith("--no-")
    ]
    assert not missing, missing
