"""Reference semantics of FLA chunk metadata, independent of vLLM's code.

For sequence j of length L_j, ``chunk_indices`` holds the rows
(j, 0), (j, 1), ..., (j, ceil(L_j / chunk) - 1), sequences in order, so every
row carries its sequence's own index, wherever empty sequences sit; and
``chunk_offsets`` holds the exclusive running chunk counts, N + 1 of them.
The device kernel of the series, the smoke test and the tests compare
against this.
"""

from collections.abc import Sequence

import torch

CHUNK_SIZE = 64


def reference_chunk_metadata(
    seq_lens: Sequence[int], chunk_size: int = CHUNK_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """(chunk_indices int32 [chunks, 2], chunk_offsets int64 [N + 1])."""
    rows: list[tuple[int, int]] = []
    offsets = [0]
    for seq, length in enumerate(seq_lens):
        n_chunks = -(-int(length) // chunk_size)
        rows.extend((seq, chunk) for chunk in range(n_chunks))
        offsets.append(offsets[-1] + n_chunks)
    indices = torch.tensor(rows, dtype=torch.int32).reshape(-1, 2)
    return indices, torch.tensor(offsets, dtype=torch.int64)


def cu_seqlens_of(seq_lens: Sequence[int]) -> torch.Tensor:
    """int32 cumulative lengths with a leading 0, as vLLM's builder makes them."""
    cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(list(seq_lens), dtype=torch.int64).cumsum(0)
    return cu
