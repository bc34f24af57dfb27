"""The launcher's dry runs: golden files for every profile with every feature
(alone and together), every command parsed by the installed vLLM's `vllm serve`
parser and checked against expectations written out here, and the two-node
commands agreeing on the deployment.

Regenerate the golden files after an intended change, then review the diff:

    K3_UPDATE_GOLDEN=1 .venv/bin/python -m pytest \
        tests/launcher/test_launcher_commands.py
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
import os
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from k3rocm.common.setting_table import KDA_METADATA_OFFERED
from k3rocm.common.vllm_release import TARGET
from k3rocm.launcher.__main__ import main

pytestmark = pytest.mark.every_line

# Per release line: the installed vLLM parses them, and the commands differ
# where a release moved a module (cpu-dev runs the OpenAI server module).
GOLDEN_DIR = Path(__file__).parent / "golden" / "launcher" / TARGET.version
UPDATE_GOLDEN = os.environ.get("K3_UPDATE_GOLDEN") == "1"

MASTER_ADDR = "10.1.2.3"
# Every case sees 8 GPUs, as on an MI355X node.
BASE_ENV = {"K3_GPU_COUNT": "8"}

# Written out from the recipe (FACTS.md), not taken from the launcher.
AMD_ENV = {
    "VLLM_ROCM_USE_AITER": "1",
    "SAFETENSORS_FAST_GPU": "1",
    "AITER_SITUV2_A8W4": "1",
    "AITER_BF16_FP8_MOE_BOUND": "0",
    "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
}
# Beside the recipe's: the series' metadata path (K3_KDA_METADATA's default).
KIMI_ENV = {**AMD_ENV, "K3_KDA_METADATA": "device"}
RECIPE_ARGS = {
    "model_tag": "moonshotai/Kimi-K3",
    "served_model_name": ["kimi-k3"],
    "host": "0.0.0.0",
    "port": 8000,
    "trust_remote_code": True,
    "load_format": "auto",
    "gpu_memory_utilization": 0.95,
    "max_num_batched_tokens": 4096,
    "max_num_seqs": 128,
    # The metrics plugin's flag; --disable-log-stats depends on the layout
    # (each variant's `disable_log_stats`).
    "enable_logging_iteration_details": True,
}
FEATURE_ARGS = {
    "reasoning": {"reasoning_parser": "kimi_k3"},
    "tools": {"enable_auto_tool_choice": True, "tool_call_parser": "kimi_k3"},
    "dspark": {
        "speculative_config": {
            "method": "dspark",
            "model": "Inferact/Kimi-K3-DSpark",
            "num_speculative_tokens": 7,
            "attention_backend": "TRITON_MLA",
        }
    },
    "encoder-dp": {"mm_encoder_tp_mode": "data"},
    "text-only": {"language_model_only": True},
    "fp8-kv": {"kv_cache_dtype": "fp8"},
}
ALL_FEATURES = tuple(FEATURE_ARGS)


@dataclasses.dataclass(frozen=True)
class Variant:
    """A profile as run on one node, and what vLLM must see for it."""

    name: str
    env: dict[str, str]
    layout: dict[str, object]


SINGLE = {"nnodes": 1, "node_rank": 0, "headless": False}


# `disable_log_stats`: vLLM 0.27.1 keeps the metrics plugin's feed and its
# `vllm:` scheduler metrics with --disable-log-stats only when `vllm serve`
# runs exactly one API server itself: not with data parallelism (several API
# servers by default) and not on headless nodes.
def _native(
    profile: str, rank: int, layout: dict[str, object], disable_log_stats: bool
) -> Variant:
    return Variant(
        f"{profile}-rank{rank}",
        {
            "K3_PROFILE": profile,
            "K3_NODE_RANK": str(rank),
            "K3_MASTER_ADDR": MASTER_ADDR,
        },
        {
            **layout,
            "nnodes": 2,
            "node_rank": rank,
            "master_addr": MASTER_ADDR,
            "master_port": 29501,
            "headless": rank > 0,
            "distributed_executor_backend": None,
            "data_parallel_backend": "mp",
            "disable_log_stats": disable_log_stats,
        },
    )


TEP16 = {
    "tensor_parallel_size": 16,
    "data_parallel_size": 1,
    "enable_expert_parallel": True,
}
DEP16 = {
    "tensor_parallel_size": 1,
    "data_parallel_size": 16,
    "enable_expert_parallel": True,
}
VARIANTS = (
    Variant(
        "tp8",
        {},
        {
            **SINGLE,
            "tensor_parallel_size": 8,
            "data_parallel_size": 1,
            "enable_expert_parallel": False,
            "distributed_executor_backend": None,
            "disable_log_stats": True,
        },
    ),
    Variant(
        "tep8",
        {"K3_PROFILE": "tep8"},
        {
            **SINGLE,
            "tensor_parallel_size": 8,
            "data_parallel_size": 1,
            "enable_expert_parallel": True,
            "distributed_executor_backend": None,
            "disable_log_stats": True,
        },
    ),
    _native("tep16", 0, TEP16, disable_log_stats=True),
    _native("tep16", 1, TEP16, disable_log_stats=False),
    _native("dep16", 0, DEP16, disable_log_stats=False),
    _native("dep16", 1, DEP16, disable_log_stats=False),
)
VARIANT_BY_NAME = {variant.name: variant for variant in VARIANTS}

# Golden feature sets: none, the default, each feature alone, and the two
# largest sets that go together (text-only excludes encoder-dp).
DEFAULT_FEATURES = ("reasoning", "encoder-dp")
GOLDEN_FEATURE_SETS: dict[str, tuple[str, ...] | None] = {
    "default": None,
    "none": (),
    **{name: (name,) for name in ALL_FEATURES},
    "all-vision": ("reasoning", "tools", "dspark", "encoder-dp", "fp8-kv"),
    "all-text-only": ("reasoning", "tools", "dspark", "text-only", "fp8-kv"),
}


def compatible_feature_sets() -> list[tuple[str, ...]]:
    return [
        combo
        for size in range(len(ALL_FEATURES) + 1)
        for combo in itertools.combinations(ALL_FEATURES, size)
        if not {"text-only", "encoder-dp"} <= set(combo)
    ]


def features_env(features: tuple[str, ...] | None) -> dict[str, str]:
    if features is None:
        return {}
    return {"K3_FEATURES": ",".join(features) or "none"}


def dry_run(capsys, env: dict[str, str], argv: tuple[str, ...] = ()) -> str:
    code = main(["--dry-run", *argv], {**BASE_ENV, **env})
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def replay(script: str) -> tuple[list[str], dict[str, str]]:
    """Run a dry run's text in bash with `exec` replaced by a recorder: the
    argv and the exported variables exactly as a shell would pass them."""
    recorder = 'exec() { printf "%s\\0" "$@"; printf "\\1"; env -0; }; eval "$1"'
    result = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", recorder, "replay", script],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        check=True,
    )
    argv_part, env_part = result.stdout.decode().split("\1")
    exported = dict(item.split("=", 1) for item in env_part.split("\0") if item)
    for shell_own in ("PATH", "PWD", "SHLVL", "_"):
        exported.pop(shell_own, None)
    return argv_part.split("\0")[:-1], exported


# -- vLLM's own parsers ------------------------------------------------------


@dataclasses.dataclass
class VllmParsers:
    root: typing.Any  # `vllm` with the `serve` subcommand
    serve_options: set[str]
    api_server: typing.Any  # python -m <the release's OpenAI server module>
    api_server_options: set[str]
    validate: typing.Callable


@pytest.fixture(scope="module")
def vllm_parsers() -> VllmParsers:
    from vllm.entrypoints.cli.serve import ServeSubcommand

    serve_args = importlib.import_module(TARGET.serve_args_module)
    make_arg_parser = serve_args.make_arg_parser
    validate_parsed_serve_args = serve_args.validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand().subparser_init(
        root.add_subparsers(dest="subparser", required=True)
    )
    api_server = make_arg_parser(FlexibleArgumentParser(prog="api_server"))
    return VllmParsers(
        root,
        set(serve._option_string_actions),
        api_server,
        set(api_server._option_string_actions),
        validate_parsed_serve_args,
    )


class RejectedByVllm(Exception):
    pass


def parse_with_vllm(parsers: VllmParsers, argv: list[str], capsys=None):
    """Parse a launcher argv the way vLLM 0.27.1 would; raise RejectedByVllm
    with vLLM's message for an unknown flag or a value it does not accept."""
    if argv[:2] == ["vllm", "serve"]:
        parser, options, args = (
            parsers.root,
            parsers.serve_options,
            ["serve", *argv[2:]],
        )
    elif argv[1:3] == ["-m", TARGET.openai_server_module]:
        parser, options, args = parsers.api_server, parsers.api_server_options, argv[3:]
    else:
        raise AssertionError(f"not a vLLM serve command: {argv[:3]}")
    # argparse would accept an unambiguous prefix of a flag; the launcher must
    # write every flag in full.
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag.startswith("-") and not flag.lstrip("-").replace(".", "").isdigit():
            if flag not in options:
                raise RejectedByVllm(f"{flag} is not a flag of vLLM 0.27.1")
    try:
        namespace = parser.parse_args(args)
    except SystemExit as exit_:
        message = capsys.readouterr().err if capsys else ""
        raise RejectedByVllm(f"vLLM's parser exited {exit_.code}: {message}") from None
    parsers.validate(namespace)
    return namespace


# -- golden files ------------------------------------------------------------


def golden_cases() -> dict[str, tuple[dict[str, str], tuple[str, ...]]]:
    cases: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {}
    for variant in VARIANTS:
        for set_name, features in GOLDEN_FEATURE_SETS.items():
            cases[f"{variant.name}--{set_name}"] = (
                {**variant.env, **features_env(features)},
                (),
            )
    cases["tp8--settings"] = (
        {
            "K3_SERVED_MODEL_NAME": "k3-prod",
            "K3_HOST": "127.0.0.1",
            "K3_PORT": "9000",
            "K3_MAX_MODEL_LEN": "262144",
            "K3_MAX_NUM_SEQS": "64",
            "K3_EXTRA_ARGS": "--enable-prefix-caching --max-num-batched-tokens 8192",
            # An operator's tuning of the recipe's a8w4 MoE path wins.
            "AITER_SITUV2_A8W4": "0",
        },
        ("--vllm-command", "/opt/venv/bin/vllm serve", "--", "--seed", "7"),
    )
    cases["tep16-rank1--four-nodes"] = (
        {**VARIANT_BY_NAME["tep16-rank1"].env, "K3_NUM_NODES": "4"},
        ("--master-port", "29600"),
    )
    cases["cpu-dev--default"] = ({"K3_PROFILE": "cpu-dev"}, ())
    for rank in (0, 1):
        cases[f"cpu-dev-2node-rank{rank}--default"] = (
            {
                "K3_PROFILE": "cpu-dev-2node",
                "K3_NODE_RANK": str(rank),
                "K3_MASTER_ADDR": MASTER_ADDR,
            },
            (),
        )
    cases["cpu-dev--settings"] = (
        {
            "K3_PROFILE": "cpu-dev",
            "K3_MODEL": "facebook/opt-125m",
            "K3_MAX_MODEL_LEN": "512",
            "K3_EXTRA_ARGS": "--load-format dummy --enforce-eager --dtype float32",
        },
        ("--port", "8123"),
    )
    return cases


GOLDEN_CASES = golden_cases()


def normalized(text: str) -> str:
    # cpu-dev runs this interpreter, whose path differs between machines.
    return text.replace(shlex.quote(sys.executable), "PYTHON")


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_dry_run_matches_golden(case, capsys):
    env, argv = GOLDEN_CASES[case]
    text = normalized(dry_run(capsys, env, argv))
    path = GOLDEN_DIR / f"{case}.txt"
    if UPDATE_GOLDEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with K3_UPDATE_GOLDEN=1"
    assert text == path.read_text(), (
        f"dry run of {case} differs from {path}; if intended, regenerate with "
        "K3_UPDATE_GOLDEN=1 and review the diff"
    )


def test_the_dry_run_shows_the_legacy_metadata_path(capsys):
    """Where the release has a stalling path to compare with (0.27.1); 0.32.0
    has none, and an operator who asks for it is told so."""
    code = main(["--dry-run"], {**BASE_ENV, "K3_KDA_METADATA": "legacy"})
    if TARGET.legacy_kda_backend is None:
        assert code == 2
        err = capsys.readouterr().err
        assert "K3_KDA_METADATA is 'legacy'; set one of device (default device)" in err
    else:
        assert code == 0
        assert "export K3_KDA_METADATA=legacy\n" in capsys.readouterr().out


def test_the_dry_run_refuses_what_the_container_start_refuses(capsys):
    """K3_KDA_METADATA=sideways (and any container setting the start would
    refuse) fails the dry run too, with the start's message, exit 2."""
    env = {**BASE_ENV, "K3_KDA_METADATA": "sideways", "K3_STALL_SECONDS": "-1"}
    assert main(["--dry-run"], env) == 2
    err = capsys.readouterr().err
    paths = ", ".join(KDA_METADATA_OFFERED)
    assert f"K3_KDA_METADATA is 'sideways'; set one of {paths}" in err
    assert "K3_STALL_SECONDS" in err
    assert "export K3_KDA_METADATA" not in err


def test_no_stale_golden_files():
    on_disk = {path.stem for path in GOLDEN_DIR.glob("*.txt")}
    assert on_disk == set(GOLDEN_CASES)


# -- every profile and feature combination through vLLM's parser -------------


def test_every_profile_and_feature_combination_parses(vllm_parsers, capsys):
    feature_sets = compatible_feature_sets()
    # 2**6 sets less the 16 with both text-only and encoder-dp.
    assert len(feature_sets) == 48
    defaults = parse_with_vllm(vllm_parsers, ["vllm", "serve", "some/model"])
    for variant in VARIANTS:
        for features in feature_sets:
            script = dry_run(capsys, {**variant.env, **features_env(features)})
            argv, exported = replay(script)
            args = vars(parse_with_vllm(vllm_parsers, argv, capsys))
            where = f"{variant.name} with {features}"
            assert exported == KIMI_ENV, where
            expected = {**RECIPE_ARGS, **variant.layout}
            for name in ALL_FEATURES:
                for key, value in FEATURE_ARGS[name].items():
                    expected[key] = value if name in features else vars(defaults)[key]
            assert {key: args[key] for key in expected} == expected, where


def test_default_features_are_the_recipes(vllm_parsers, capsys):
    argv, _ = replay(dry_run(capsys, {}))
    args = vars(parse_with_vllm(vllm_parsers, argv, capsys))
    assert args["reasoning_parser"] == "kimi_k3"
    assert args["mm_encoder_tp_mode"] == "data"
    assert not args["enable_auto_tool_choice"]
    assert args["speculative_config"] is None


def test_cpu_dev_parses_as_a_plain_api_server(vllm_parsers, capsys):
    env, argv = GOLDEN_CASES["cpu-dev--settings"]
    replayed, exported = replay(dry_run(capsys, env, argv))
    assert replayed[:3] == [sys.executable, "-m", TARGET.openai_server_module]
    args = vars(parse_with_vllm(vllm_parsers, replayed, capsys))
    assert exported == {}
    assert args["model"] == "facebook/opt-125m"
    assert args["port"] == 8123
    assert args["max_model_len"] == 512
    assert args["load_format"] == "dummy"
    assert args["enable_logging_iteration_details"] and args["disable_log_stats"]
    assert not args["trust_remote_code"]
    assert args["tensor_parallel_size"] == 1
    assert args["reasoning_parser"] in ("", None)


@pytest.mark.parametrize("rank", [0, 1])
def test_cpu_dev_2node_parses_as_vllm_serve_over_two_nodes(vllm_parsers, capsys, rank):
    """`vllm serve`, not the OpenAI server module: only the former runs a
    headless node."""
    env, argv = GOLDEN_CASES[f"cpu-dev-2node-rank{rank}--default"]
    replayed, exported = replay(dry_run(capsys, env, argv))
    assert replayed[:2] == ["vllm", "serve"]
    args = vars(parse_with_vllm(vllm_parsers, replayed, capsys))
    assert exported == {}
    assert (args["tensor_parallel_size"], args["nnodes"]) == (2, 2)
    assert (args["node_rank"], args["headless"]) == (rank, rank == 1)
    assert args["master_addr"] == MASTER_ADDR
    assert not args["trust_remote_code"]


def test_settings_and_extra_args_reach_vllm(vllm_parsers, capsys):
    env, argv = GOLDEN_CASES["tp8--settings"]
    replayed, exported = replay(dry_run(capsys, env, argv))
    assert replayed[:2] == ["/opt/venv/bin/vllm", "serve"]
    args = vars(parse_with_vllm(vllm_parsers, ["vllm", *replayed[1:]], capsys))
    assert exported["AITER_SITUV2_A8W4"] == "0"
    assert args["served_model_name"] == ["k3-prod"]
    assert (args["host"], args["port"]) == ("127.0.0.1", 9000)
    assert (args["max_model_len"], args["max_num_seqs"]) == (262144, 64)
    assert args["enable_prefix_caching"] is True
    assert args["seed"] == 7
    # Extra arguments come last, so they override the recipe's 4096.
    assert args["max_num_batched_tokens"] == 8192


# -- the checker itself must catch mistakes -----------------------------------


@pytest.mark.parametrize(
    ("good", "bad"),
    [
        ("--enable-expert-parallel", "--enable-expert-paralel"),  # misspelt
        ("--enable-expert-parallel", "--enable-expert"),  # abbreviated
        ("--trust-remote-code", "--trust-remote-codes"),
    ],
)
def test_misspelt_flag_is_caught(vllm_parsers, capsys, good, bad):
    argv, _ = replay(dry_run(capsys, {"K3_PROFILE": "tep8"}))
    parse_with_vllm(vllm_parsers, argv, capsys)
    assert good in argv
    broken = [bad if arg == good else arg for arg in argv]
    with pytest.raises(RejectedByVllm):
        parse_with_vllm(vllm_parsers, broken, capsys)


@pytest.mark.parametrize(
    ("flag", "bad_value"),
    [
        ("--kv-cache-dtype", "fp9"),
        ("--mm-encoder-tp-mode", "dp"),
        ("--speculative-config", '{"method": "dspark", "model": '),
        ("--tensor-parallel-size", "eight"),
        ("--gpu-memory-utilization", "most"),
    ],
)
def test_unaccepted_value_is_caught(vllm_parsers, capsys, flag, bad_value):
    argv, _ = replay(dry_run(capsys, {"K3_FEATURES": "dspark,fp8-kv,encoder-dp"}))
    index = argv.index(flag) + 1
    broken = [*argv[:index], bad_value, *argv[index + 1 :]]
    with pytest.raises(RejectedByVllm):
        parse_with_vllm(vllm_parsers, broken, capsys)


# -- what the flags refer to exists in vLLM 0.27.1 ----------------------------


def test_parsers_and_speculative_settings_exist_in_vllm():
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert ReasoningParserManager.get_reasoning_parser("kimi_k3")
    assert ToolParserManager.get_tool_parser("kimi_k3")
    dspark = FEATURE_ARGS["dspark"]["speculative_config"]
    assert set(dspark) <= {
        field.name for field in dataclasses.fields(SpeculativeConfig)
    }
    assert dspark["method"] in typing.get_args(SpeculativeMethod)
    assert AttentionBackendEnum[dspark["attention_backend"]]


# -- two nodes ---------------------------------------------------------------


@pytest.mark.parametrize("profile", ["tep16", "dep16"])
def test_two_node_commands_agree(vllm_parsers, capsys, profile):
    per_rank = []
    for rank in (0, 1):
        argv, exported = replay(
            dry_run(capsys, VARIANT_BY_NAME[f"{profile}-rank{rank}"].env)
        )
        per_rank.append((vars(parse_with_vllm(vllm_parsers, argv, capsys)), exported))
    (rank0, env0), (rank1, env1) = per_rank
    world = [
        args["tensor_parallel_size"]
        * args["data_parallel_size"]
        * args["pipeline_parallel_size"]
        for args in (rank0, rank1)
    ]
    assert world == [16, 16]
    for key in ("nnodes", "master_addr", "master_port"):
        assert rank0[key] == rank1[key], key
    assert (rank0["nnodes"], rank0["master_addr"]) == (2, MASTER_ADDR)
    assert (rank0["node_rank"], rank1["node_rank"]) == (0, 1)
    # Node 0 serves the API; node 1 runs only engines or workers.
    assert (rank0["headless"], rank1["headless"]) == (False, True)
    # Only the node serving the API drains it on stop and guards its routes
    # (the access check outermost: added last).
    assert rank0["middleware"] == [
        "k3rocm.container.drain.DrainMiddleware",
        "k3rocm.container.api_access.ApiAccessMiddleware",
    ]
    assert rank1["middleware"] == []
    # ... and keeps the probes' requests out of its access log.
    quiet = "disable_access_log_for_endpoints"
    assert (rank0[quiet], rank1[quiet]) == ("/health,/metrics", None)
    # Everything else, the model and the recipe included, is the same, but
    # for --disable-log-stats, which only tep16's node 0 (one API server) has.
    differing = {key for key in rank0 if rank0[key] != rank1[key]} - {
        "middleware",
        quiet,
    }
    if profile == "tep16":
        assert differing == {"node_rank", "headless", "disable_log_stats"}
        assert (rank0["disable_log_stats"], rank1["disable_log_stats"]) == (
            True,
            False,
        )
    else:
        assert differing == {"node_rank", "headless"}
        assert not rank0["disable_log_stats"] and not rank1["disable_log_stats"]
    assert env0 == env1 == KIMI_ENV


@pytest.mark.parametrize(
    ("extra_args", "disable_log_stats"),
    [
        ("--api-server-count 2", False),
        ("--api-server-count=4", False),
        ("-asc 2", False),
        ("--api-server-count 1", True),
        ("--api-server-count 4 --api-server-count 1", True),  # the last wins
        ("--api-server-count 1 --api-server-count=2", False),
        ("--enable-prefix-caching", True),
    ],
)
def test_api_server_count_in_extra_args_decides_disable_log_stats(
    vllm_parsers, capsys, extra_args, disable_log_stats
):
    # With several API servers vLLM 0.27.1 would take --disable-log-stats
    # literally and the metrics plugin would get no feed.
    for profile in ("tp8", "cpu-dev"):
        env = {"K3_PROFILE": profile, "K3_EXTRA_ARGS": extra_args}
        argv, _ = replay(dry_run(capsys, env))
        args = vars(parse_with_vllm(vllm_parsers, argv, capsys))
        assert args["enable_logging_iteration_details"], (profile, extra_args)
        assert args["disable_log_stats"] is disable_log_stats, (profile, extra_args)


def test_dspark_config_is_json_vllm_reads_back(vllm_parsers, capsys):
    argv, _ = replay(dry_run(capsys, {"K3_FEATURES": "dspark"}))
    raw = argv[argv.index("--speculative-config") + 1]
    args = vars(parse_with_vllm(vllm_parsers, argv, capsys))
    assert args["speculative_config"] == json.loads(raw)
