"""The autotune half of vLLM PR #50649 in the patched vLLM 0.27.1 tree
(patch 0008) and the guard of the precompiled launches (patch 0005): no
configuration outside a kernel's autotune list, the racy one above all,
ever reaches a plan.

The expected list is #50649's (num_warps 2, 4, 8 by num_stages 2, 3), written
out here, not read from the patch. The guard runs on CPU tensors: the
launches themselves need a GPU, so ``DIRECT`` and the GPU-only check of
``_handled`` are turned on by hand and the vendored call is a recorder.
"""

import importlib.util

import pytest
import torch
import vllm.models.kimi_k3.amd.ops.third_party.kda.chunk as chunk
import vllm.models.kimi_k3.amd.ops.third_party.kda.kda_chunk_launch as launch
from support.vllm_trees import installed_root
from triton import Config
from vllm.models.kimi_k3.amd.ops.third_party.kda import (
    kda_chunk_plans,
    kda_launch_entry,
)

from k3rocm.smoke.chunk_reference import cu_seqlens_of, reference_chunk_metadata

FIXED = {(warps, stages) for warps in (2, 4, 8) for stages in (2, 3)}
RACY = Config({}, num_warps=4, num_stages=4)


def autotuned(kernel) -> set[tuple[int, int]]:
    _, tuner = launch.unwrap(kernel)
    return {(c.num_warps, c.num_stages) for c in tuner.configs}


def pristine_chunk_module():
    """vLLM 0.27.1's own chunk.py, loaded beside the patched package (its
    relative imports resolve to the patched package's other modules)."""
    path = installed_root() / "vllm/models/kimi_k3/amd/ops/third_party/kda/chunk.py"
    name = "vllm.models.kimi_k3.amd.ops.third_party.kda._pristine_chunk"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recompute_w_u_autotunes_only_the_stable_configurations():
    assert autotuned(chunk.recompute_w_u_fwd_kernel) == FIXED


def test_vllm_0271s_list_holds_the_racy_configuration():
    """The same check fails on the unpatched kernel: 0.27.1 autotunes
    num_stages 4 too."""
    racy = autotuned(pristine_chunk_module().recompute_w_u_fwd_kernel)
    assert racy != FIXED and (4, 4) in racy


def call(seq_lens=(5, 64)) -> tuple:
    """chunk_kda_with_fused_gate's arguments for a small batch on the CPU."""
    total, heads, dim = sum(seq_lens), 2, 32
    g = torch.Generator().manual_seed(0)
    shape = (1, total, heads, dim)
    indices, offsets = reference_chunk_metadata(seq_lens)
    return (
        *(torch.randn(*shape, generator=g) for _ in range(4)),
        torch.randn(1, total, heads, generator=g), torch.randn(heads),
        torch.randn(heads * dim), None,
        torch.randn(len(seq_lens), heads, dim, dim), True, -5.0, True,
        cu_seqlens_of(seq_lens), indices, offsets,
    )  # fmt: skip


@pytest.fixture
def racy_choice(monkeypatch):
    """recompute_w_u's autotuner answers the racy configuration while its
    list is the fixed one (an answer from elsewhere, e.g. an old cache)."""
    _, tuner = launch.unwrap(chunk.recompute_w_u_fwd_kernel)
    monkeypatch.setattr(tuner, "best_config", RACY, raising=False)
    for site in launch.SITES:
        _, other = launch.unwrap(launch.site_kernel(site, -5.0))
        if other is not None and other is not tuner:
            monkeypatch.setattr(other, "best_config", other.configs[0], raising=False)
    return tuner


def test_a_configuration_outside_the_list_is_named(racy_choice):
    outside = kda_chunk_plans.outside_allowed_configs(
        kda_chunk_plans.chosen_configs(-5.0), -5.0
    )
    assert len(outside) == 1 and outside[0].startswith("recompute_w_u: ")
    assert "num_stages: 4" in outside[0]


def test_every_configuration_on_the_list_passes(racy_choice, monkeypatch):
    monkeypatch.setattr(racy_choice, "best_config", racy_choice.configs[-1])
    assert (
        kda_chunk_plans.outside_allowed_configs(
            kda_chunk_plans.chosen_configs(-5.0), -5.0
        )
        == []
    )


def test_a_kind_with_such_a_configuration_gets_no_plan_and_runs_vllm(
    racy_choice, monkeypatch
):
    """The call runs the vendored path, the kind is refused once (counted)
    and never planned, and later calls of it are vendored without another
    attempt."""
    monkeypatch.setattr(kda_launch_entry, "DIRECT", True)
    monkeypatch.setattr(kda_launch_entry, "_handled", lambda prepared: True)
    monkeypatch.setattr(kda_launch_entry, "_REFUSED", set())
    monkeypatch.setattr(
        kda_launch_entry, "STATS", dict.fromkeys(kda_launch_entry.STATS, 0)
    )
    attempts = []
    make_plan = kda_launch_entry._make_plan
    monkeypatch.setattr(
        kda_launch_entry, "_make_plan", lambda p: attempts.append(1) or make_plan(p)
    )
    vendored = []

    def run_vendored(*args):
        vendored.append(args)
        return "vendored"

    args = call()
    for _ in range(3):
        assert kda_launch_entry.chunk_kda_launched(run_vendored, *args) == "vendored"
    assert len(vendored) == 3 and len(attempts) == 1
    assert kda_launch_entry.STATS == {
        "vendored_calls": 3,
        "plans_made": 0,
        "plans_refused": 1,
    }
    assert kda_launch_entry._REFUSED == {kda_chunk_plans.call_kind(args)}
    assert kda_chunk_plans.call_kind(args) not in kda_launch_entry._PLANS
