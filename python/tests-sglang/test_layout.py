"""How SGLang's host pools lay out pages, read through the pools' own
``get_page_buffer_meta``: the runs the backend copies, and that a page's
runs in order are SGLang's flat data page (so the zero-copy and flat-page
paths store the same bytes)."""

from __future__ import annotations

import pytest
import torch
from conftest import HEAD_DIM, HEADS, KV_LORA_RANK, LAYERS, PAGE, ROPE_DIM, mha_pool, mla_pool, pool_of

from kvtier.sglang import LayoutError, PageLayout

F32 = 4
MHA_RUN = PAGE * HEADS * HEAD_DIM * F32
MLA_RUN = PAGE * (KV_LORA_RANK + ROPE_DIM) * F32


@pytest.mark.parametrize(
    ("kind", "layout", "runs", "run_bytes"),
    [
        ("mha", "layer_first", 2 * LAYERS, MHA_RUN),
        ("mha", "page_first", 2, LAYERS * MHA_RUN),
        ("mha", "page_first_direct", 2, LAYERS * MHA_RUN),
        ("mla", "layer_first", LAYERS, MLA_RUN),
        ("mla", "page_first", 1, LAYERS * MLA_RUN),
        ("mla", "page_first_direct", 1, LAYERS * MLA_RUN),
    ],
)
def test_runs_of_a_page_are_sglangs_flat_page(kind: str, layout: str, runs: int, run_bytes: int) -> None:
    pool = pool_of(kind, layout)
    lay = PageLayout.of(pool)
    assert (lay.runs, lay.run_bytes, lay.page_size) == (runs, run_bytes, PAGE)
    assert lay.pages == pool.size // PAGE
    raw = pool.kv_buffer.reshape(-1).view(torch.uint8)
    base = pool.kv_buffer.data_ptr()
    for page in (0, 1, lay.pages - 1):
        joined = b"".join(
            bytes(raw[a - base + page * lay.stride : a - base + page * lay.stride + lay.run_bytes].numpy())
            for a in lay.bases
        )
        flat = pool.get_data_page(page * PAGE, flat=True).contiguous()
        assert joined == bytes(flat.view(torch.uint8).numpy())


def test_node_geometry_holds_the_page() -> None:
    lay = PageLayout.of(mha_pool("layer_first", torch.bfloat16))
    g = lay.node_geometry()
    assert g == {
        "preset": "deepseek-v3",
        "layers": str(2 * LAYERS),
        "latent_dim": str(HEADS * HEAD_DIM),
        "dtype": "bf16",
        "tokens_per_block": str(PAGE),
    }
    assert lay.node_env()["KVTIER_GEOMETRY__LATENT_DIM"] == str(HEADS * HEAD_DIM)
    assert int(g["latent_dim"]) * PAGE * 2 == lay.run_bytes


def test_block_ids_are_page_indices() -> None:
    lay = PageLayout.of(mla_pool("page_first"))
    idx = torch.cat([torch.arange(5 * PAGE, 6 * PAGE), torch.arange(2 * PAGE, 3 * PAGE)])
    assert lay.block_ids(idx, 2) == [5, 2]
    with pytest.raises(ValueError, match="host slots"):
        lay.block_ids(idx, 3)
    with pytest.raises(ValueError, match="page-aligned"):
        lay.block_ids(idx + 1, 2)


def test_unsupported_layouts_are_refused() -> None:
    pool = mha_pool("page_head")
    with pytest.raises(LayoutError, match="page_head"):
        PageLayout.of(pool)
