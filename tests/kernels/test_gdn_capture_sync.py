"""Patch 0013 (vLLM #55404): the GDN builder builds cudagraph-capture
metadata with speculative decoding without reading the device.

``build_for_cudagraph_capture`` is not capture-only: a data-parallel rank
with nothing scheduled (dep16) runs it on every dummy step. vLLM 0.27.1's
derives the draft counts with ``(num_accepted_tokens - 1).cpu()``, a
device-to-host copy that waits for the device each time.

Here (no GPU) the tensors that live on the GPU in vLLM (the common
metadata's device tensors, the builder's persistent buffers, and whatever
is computed from them) are marked as device tensors (``OnDevice``), and
every read of a marked tensor's values on the host is recorded: ``.cpu()``,
``.item()``, ``.tolist()``, ``.numpy()``, ``.to()`` another device, Python
``bool``/``int``/``float``/index conversions, ``nonzero``, and indexing or
``repeat_interleave`` whose output size depends on a marked tensor. Reads
of host tensors (``query_start_loc_cpu`` and what the builder computes from
it: the ``.item()`` calls in ``build``) are not syncs and are not recorded.
"""

import dataclasses
import importlib.util
from typing import ClassVar

import pytest
import torch
from support.gdn_batches import NUM_SPEC, Batch, make_builder
from support.vllm_trees import installed_root
from vllm.config import CUDAGraphMode
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

K1 = NUM_SPEC + 1
RELATIVE = "vllm/v1/attention/backends/gdn_attn.py"
# Host reads of a tensor's values, whatever its arguments.
READS = {
    "cpu", "item", "tolist", "numpy", "nonzero", "__bool__", "__int__",
    "__float__", "__index__",
}  # fmt: skip


class OnDevice(torch.Tensor):
    """A CPU tensor standing in for a GPU-resident one: results computed
    from it are ``OnDevice`` too; a host read of its values is recorded in
    ``OnDevice.reads`` and returns a plain (host) tensor or value."""

    reads: ClassVar[list[str]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", repr(func))
        marked = bool(args) and isinstance(args[0], OnDevice)
        read = marked and (
            name in READS
            or (name == "to" and _to_host(args[1:], kwargs))
            or (name == "repeat_interleave" and "output_size" not in kwargs)
        )
        read = read or (
            name in ("__getitem__", "__setitem__", "index_put_")
            and _marked_bool_index(args[1] if len(args) > 1 else None)
        )
        if read:
            cls.reads.append(name)
            with torch._C.DisableTorchFunctionSubclass():
                result = func(*args, **kwargs)
            # On a CPU ``.cpu()`` returns the tensor itself: the copy is a
            # host tensor.
            if isinstance(result, torch.Tensor):
                return result.as_subclass(torch.Tensor)
            return result
        return super().__torch_function__(func, types, args, kwargs)


def _to_host(args, kwargs) -> bool:
    """``.to(...)`` naming the host ("cpu") as its device: a device-to-host
    copy for a GPU tensor."""
    for value in (*args, kwargs.get("device")):
        if isinstance(value, (str, torch.device)) and torch.device(value).type == "cpu":
            return True
    return False


def _marked_bool_index(index) -> bool:
    """A boolean mask that lives on the device: indexing with it sizes the
    result from its values (a nonzero on the device)."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, OnDevice) and p.dtype == torch.bool for p in parts)


def on_device(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(OnDevice)


def builder_of(cls):
    """``cls`` with speculation (NUM_SPEC tokens) in FULL_AND_PIECEWISE mode,
    its persistent buffers marked as device tensors."""
    builder = make_builder(cls, NUM_SPEC)
    builder.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    builder.use_full_cuda_graph = True
    for name, value in vars(builder).items():
        if isinstance(value, torch.Tensor):
            setattr(builder, name, on_device(value))
    return builder


def capture_metadata(batch: Batch):
    """The common metadata of a uniform spec-decode batch as the model runner
    hands it to ``build_for_cudagraph_capture``: device tensors marked, the
    ``_cpu`` copies plain."""
    common = batch.metadata(NUM_SPEC)
    return dataclasses.replace(
        common,
        query_start_loc=on_device(common.query_start_loc),
        seq_lens=on_device(common.seq_lens),
        block_table_tensor=on_device(common.block_table_tensor + 1),
        slot_mapping=on_device(common.slot_mapping),
    )


def unpatched_builder_class():
    """vLLM 0.27.1's own GDN builder (the installed wheel's gdn_attn.py)."""
    spec = importlib.util.spec_from_file_location(
        "unpatched_gdn_attn", installed_root() / RELATIVE
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GDNAttentionMetadataBuilder


def build_recording(cls, batch: Batch):
    """(metadata, the host reads of device tensors made while building it)."""
    builder = builder_of(cls)
    OnDevice.reads = []
    metadata = builder.build_for_cudagraph_capture(capture_metadata(batch))
    return metadata, OnDevice.reads


# Capture batches: uniform spec decodes, a request's 1 + NUM_SPEC tokens.
BATCHES = {
    "one": Batch([K1], 0, [], 0, [5]),
    "four": Batch([K1] * 4, 0, [], 0, [5, 9, 2, 7]),
}


@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
def test_capture_metadata_reads_nothing_back_from_the_device(batch):
    metadata, reads = build_recording(GDNAttentionMetadataBuilder, batch)
    assert reads == []
    assert metadata.num_spec_decodes == len(batch.query_lens)
    assert metadata.num_prefills == metadata.num_decodes == 0


@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
def test_vllm_0_27_1_reads_the_draft_counts_back(batch):
    """0.27.1's builder: one device-to-host copy (the draft counts); the
    patched builder's metadata is the same."""
    want, reads = build_recording(unpatched_builder_class(), batch)
    assert reads == ["cpu"]
    got, _ = build_recording(GDNAttentionMetadataBuilder, batch)
    for field in dataclasses.fields(want):
        a, b = getattr(want, field.name), getattr(got, field.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), field.name
        else:
            assert a == b, field.name


def test_the_recorder_sees_a_device_read():
    """The recorder itself: reads of a marked tensor are recorded, reads of
    a host tensor and device-side arithmetic are not."""
    OnDevice.reads = []
    x = on_device(torch.arange(4))
    host = torch.arange(4)
    y = (x - 1).sum()
    assert isinstance(y, OnDevice) and OnDevice.reads == []
    host.sum().item(), host.tolist(), x[host > 1]
    assert OnDevice.reads == []
    y.item(), x.tolist(), (x - 1).cpu(), x.to("cpu"), x[x > 1], bool(x[0])
    assert OnDevice.reads == [
        "item", "tolist", "cpu", "to", "__getitem__", "__bool__",
    ]  # fmt: skip
