"""Claims about vLLM 0.27.1 that decisions of patches/0.27.1/upstream-triage.toml
rest on, read from the patched 0.27.1 tree the suite builds (the syntax trees
only: nothing is imported or run). Each test names the triage entry whose
reason cites it; if a test fails, that decision must be made again."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from support.vllm_trees import patched_tree

from k3rocm.patchtool.lines import default_line_dir

GDN_ATTN = "vllm/v1/attention/backends/gdn_attn.py"
BASE_BUILDER = "vllm/v1/attention/backend.py"
KIMI_BUILDERS = (
    "vllm/models/kimi_k3/amd/kda_metadata.py",
    "vllm/models/kimi_k3/nvidia/kda_metadata.py",
)
RESPONSES_SERVING = "vllm/entrypoints/openai/responses/serving.py"
REASONING_BASE = "vllm/reasoning/abs_reasoning_parsers.py"
KIMI_K3_REASONING = "vllm/reasoning/kimi_k3_reasoning_parser.py"


@pytest.fixture(scope="module")
def tree() -> Path:
    return patched_tree()


@functools.cache
def sources(root: Path) -> dict[str, str]:
    """Every Python file under root/vllm, by its path from root."""
    return {
        path.relative_to(root).as_posix(): path.read_text()
        for path in sorted((root / "vllm").rglob("*.py"))
    }


def module(root: Path, rel: str) -> ast.Module:
    return ast.parse((root / rel).read_text(), filename=rel)


def top_class(tree_: ast.Module, name: str) -> ast.ClassDef:
    for node in tree_.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"no class {name}")


def method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"{cls.name} has no method {name}")


def self_attributes(node: ast.AST, ctx: type) -> set[str]:
    """The attributes of ``self`` that ``node`` reads (ast.Load) or sets
    (ast.Store)."""
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        and isinstance(n.ctx, ctx)
    }


def calls_super_init(function: ast.FunctionDef) -> bool:
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "__init__"
        and isinstance(n.func.value, ast.Call)
        and isinstance(n.func.value.func, ast.Name)
        and n.func.value.func.id == "super"
        for n in ast.walk(function)
    )


def gdn_builder_gaps(root: Path) -> tuple[set[str], dict[str, set[str]]]:
    """What the base builder's __init__ sets that 0.27.1's GDN builder does
    not, and which of those the GDN builders (0.27.1's and the Kimi-K3 ones
    deriving from it) read."""
    base = method(
        top_class(module(root, BASE_BUILDER), "AttentionMetadataBuilder"), "__init__"
    )
    gdn = top_class(module(root, GDN_ATTN), "GDNAttentionMetadataBuilder")
    gdn_init = method(gdn, "__init__")
    assert not calls_super_init(gdn_init), "the premise: 0.27.1 sets them itself"
    missing = self_attributes(base, ast.Store) - self_attributes(gdn_init, ast.Store)
    read = {GDN_ATTN: self_attributes(gdn, ast.Load) & missing}
    for rel in KIMI_BUILDERS:
        for node in module(root, rel).body:
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id == "GDNAttentionMetadataBuilder"
                for b in node.bases
            ):
                read[f"{rel}::{node.name}"] = self_attributes(node, ast.Load) & missing
    return missing, read


def builder_attribute_reads(root: Path, names: set[str]) -> list[str]:
    """Places outside the builders that read one of ``names`` off a metadata
    builder (``...builder.device``, ``get_metadata_builder().layer_names``)."""
    pattern = re.compile(
        r"(builder\w*|get_metadata_builder\([^)]*\))\.(" + "|".join(names) + r")\b"
    )
    return [
        f"{rel}:{number}"
        for rel, text in sources(root).items()
        for number, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]


def test_the_gdn_builder_needs_nothing_the_base_init_would_add(tree):
    """Triage entry (0.30.0) "GDN metadata builder's __init__ calls the base
    builder's __init__": 0.27.1's GDN builder sets vllm_config and
    kv_cache_spec itself and leaves layer_names and device unset, which no
    GDN builder and no caller reads, so calling the base __init__ changes
    nothing 0.27.1 or the series does."""
    missing, read = gdn_builder_gaps(tree)
    assert missing == {"layer_names", "device"}
    assert read == {place: set() for place in read}
    assert len(read) == 1 + len(KIMI_BUILDERS)
    assert builder_attribute_reads(tree, missing) == []


def count_reasoning_tokens_callers(root: Path) -> set[str]:
    """Files that call ``.count_reasoning_tokens(...)`` other than from a
    ``count_reasoning_tokens`` of their own (a parser delegating to another)."""
    callers = set()
    for rel, text in sources(root).items():
        if "count_reasoning_tokens(" not in text:
            continue
        parsed = ast.parse(text)
        delegating = {
            id(call)
            for function in ast.walk(parsed)
            if isinstance(function, ast.FunctionDef)
            and function.name == "count_reasoning_tokens"
            for call in ast.walk(function)
        }
        for node in ast.walk(parsed):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "count_reasoning_tokens"
                and id(node) not in delegating
            ):
                callers.add(rel)
    return callers


def test_only_the_responses_api_counts_reasoning_tokens(tree):
    """Triage entry (0.31.0) "Kimi-K3 reasoning parser counts reasoning
    tokens": in 0.27.1 only the Responses API asks a reasoning parser for
    the count, and Kimi-K3's parser answers with the base class's 0."""
    assert count_reasoning_tokens_callers(tree) == {RESPONSES_SERVING}
    kimi = top_class(module(tree, KIMI_K3_REASONING), "KimiK3ReasoningParser")
    assert [ast.unparse(b) for b in kimi.bases] == ["ReasoningParser"]
    assert "count_reasoning_tokens" not in {
        n.name for n in kimi.body if isinstance(n, ast.FunctionDef)
    }
    base = method(
        top_class(module(tree, REASONING_BASE), "ReasoningParser"),
        "count_reasoning_tokens",
    )
    returns = [n.value for n in ast.walk(base) if isinstance(n, ast.Return)]
    assert [ast.literal_eval(r) for r in returns] == [0]


# Names and files newer releases build on that neither 0.27.1 nor the series
# has (triage entry -> what it would need). A not-applicable or not-carried
# reason that says "0.27.1 has no ..." cites the case of its entry.
ABSENT = {
    "input-quant-keys-0.32.0": (("get_input_quant_key",), ()),
    "tool-choice-custom-0.32.0": (("ToolChoiceCustom",), ()),
    "adaptive-verification-0.33.0": (
        (
            "supports_device_cpu_query_lens_mismatch",
            "get_varlen_cudagraph_max_query_len",
        ),
        (),
    ),
    "latent-moe-runner-0.31.0": ((), ("vllm/models/kimi_k3/amd/latent_moe_runner.py",)),
    "amd-kda-layer-0.34.0": ((), ("vllm/models/kimi_k3/amd/kda.py",)),
    "token-buffer-0.34.0": (("rfind_token_sequences",), ("vllm/v1/token_buffer.py",)),
    "scatter-states-0.34.0": (("scatter_states",), ()),
}


def occurrences(root: Path, names: tuple[str, ...]) -> list[str]:
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return [
        rel
        for rel, text in sources(root).items()
        if any(name in text for name in names) and pattern.search(text)
    ]


@pytest.mark.parametrize("case", sorted(ABSENT))
def test_0271_has_nothing_the_newer_change_builds_on(tree, case):
    names, files = ABSENT[case]
    if names:
        assert occurrences(tree, names) == []
    assert [f for f in files if (tree / f).exists()] == []


def assigned_strings(tree_: ast.Module, name: str) -> set[str]:
    """The string constants in the value of the top-level assignment to
    ``name`` (a frozenset literal, say)."""
    for node in tree_.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return {
                n.value
                for n in ast.walk(node.value)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
    raise AssertionError(f"no assignment to {name}")


def files_setting(root: Path, variable: str) -> list[str]:
    """The files that make up the served image and its start (the source,
    the image build, the deployments, the scripts, the compose files and the
    env example) that mention ``variable``."""
    places = [root / "src", root / "docker", root / "deploy", root / "scripts"]
    places += sorted(root.glob("compose*.yaml")) + sorted(root.glob("*.env.example"))
    found = []
    for place in places:
        for path in [place] if place.is_file() else sorted(place.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                if variable in path.read_text(errors="replace"):
                    found.append(path.relative_to(root).as_posix())
    return found


def test_kimi_k3_runs_the_v1_model_runner_on_rocm(tree):
    """Triage entries (0.31.0, 0.34.0) on the GDN builder's model runner V2
    paths: 0.27.1 has the V2 runner, but on ROCm Kimi-K3 defaults to V1 (the
    V2 runner faults in its profile run) and the distribution never sets
    VLLM_USE_V2_MODEL_RUNNER: without dspark (the next test), the builder's
    V2-only paths are not reached."""
    excluded = assigned_strings(
        module(tree, "vllm/config/vllm.py"),
        "ROCM_EXCLUDED_V2_MODEL_RUNNER_ARCHITECTURES",
    )
    assert "KimiK3ForConditionalGeneration" in excluded
    repo = Path(__file__).resolve().parents[2]
    assert files_setting(repo, "VLLM_USE_V2_MODEL_RUNNER") == []


def test_dspark_forces_the_v2_model_runner_even_for_kimi_k3_on_rocm(tree):
    """Triage entries (0.31.0, 0.34.0) on the V2 builder paths: 0.27.1's
    VllmConfig.use_v2_model_runner returns True for a dspark speculative
    config before it reaches the architectures that default to V1 on ROCm,
    so the dspark feature serves Kimi-K3 on model runner V2."""
    config = top_class(module(tree, "vllm/config/vllm.py"), "VllmConfig")
    choice = method(config, "use_v2_model_runner")
    forced = [
        node.lineno
        for node in ast.walk(choice)
        if isinstance(node, ast.If)
        and "dspark" in ast.unparse(node.test)
        and any(
            isinstance(stmt, ast.Return) and ast.unparse(stmt.value) == "True"
            for stmt in node.body
        )
    ]
    by_architecture = [
        node.lineno
        for node in ast.walk(choice)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).endswith("_is_default_v2_model_runner_model")
    ]
    assert forced and by_architecture
    assert min(forced) < min(by_architecture)


CITED = re.compile(r"(tests/[\w/]+\.py)::(\w+)(?:\[([\w.-]+)\])?")


def test_every_test_a_triage_reason_cites_exists():
    """A reason that rests on a test names it as tests/...::name[case]; the
    file, the function and (for this file's cases) the case must exist."""
    repo = Path(__file__).resolve().parents[2]
    text = (default_line_dir(repo / "patches") / "upstream-triage.toml").read_text()
    cited = CITED.findall(text.replace("\\\n", ""))
    assert cited
    for path, name, case in cited:
        source = (repo / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name}"
        if case:
            assert path.endswith("test_triage_claims.py") and case in ABSENT, case


def test_every_prefill_backend_builds_its_chunks_in_the_override_point(tree):
    """Triage entry (0.32.0) "GDN builder refuses a prefill backend that would
    bypass a subclass's _build_chunk_metadata override": with 0001, 0.27.1's
    build() makes its chunk metadata only by calling _build_chunk_metadata,
    whose default holds every backend's branch (cutedsl's and FLA's), so an
    override (0002's) sees every prefill backend."""
    gdn = top_class(module(tree, GDN_ATTN), "GDNAttentionMetadataBuilder")
    helpers = {
        "prepare_metadata_cutedsl",
        "prepare_chunk_indices",
        "prepare_chunk_offsets",
    }

    def names(node: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
        }

    build = method(gdn, "build")
    assert "_build_chunk_metadata" in self_attributes(build, ast.Load)
    assert names(build) & helpers == set()
    assert names(method(gdn, "_build_chunk_metadata")) >= helpers
    others = [
        node.name
        for node in gdn.body
        if isinstance(node, ast.FunctionDef)
        and node.name != "_build_chunk_metadata"
        and names(node) & helpers
    ]
    assert others == []
