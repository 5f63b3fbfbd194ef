"""The multi-query decode kernel (rows of a few new tokens: speculative verify, multi-token rows) in the backend.

The kernel against its torch twin runs in the shared check table (`kernels/verify_cases.py`, op
`multi_query_decode_attention`: tests/test_kernels.py under the interpreter and on CUDA). Here:

- the row split: which batches the Triton backend sends whole through the kernel, and that the torch backend
  never does (it stays the reference);
- the Triton backend against the torch backend on mixed batches, graph-bucket layouts (padding rows and
  tokens), sliding windows and an FP8 pool: under TRITON_INTERPRET=1 on the CPU (a child process:
  tests/multi_query_cases.py) and on CUDA at Llama-3-8B sizes;
- capture in a CUDA graph and replay for other rows and lengths;
- the kernel's sm_90 compile (tensor-core dots, async copies, no register spills) at every tile height the
  backend launches, without a GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted
from multi_query_cases import BackendCase, Inputs, cases, graph_batch, make_inputs, reference, run_case, shape_of

from radixgen.kernels import verify
from radixgen.runtime.attention import TorchAttentionBackend, TritonAttentionBackend, split_rows
from radixgen.runtime.attention.backend import AttentionShape
from radixgen.runtime.forward_batch import ForwardMode, forward_batch_from_lists

HERE = Path(__file__).resolve().parent
SMALL = cases("small")
REAL = cases("real")


def _batch(prefix: list[int], extend: list[int]):
    width = max(p + e for p, e in zip(prefix, extend)) + 1
    table = torch.arange(len(prefix) * width, dtype=torch.int32).view(len(prefix), width) + 1
    loc = torch.cat([table[b, p : p + e].long() for b, (p, e) in enumerate(zip(prefix, extend))])
    return forward_batch_from_lists([[0] * e for e in extend], prefix, list(range(len(prefix))), table, loc)


def test_split_rows_sends_batches_of_short_rows_whole_to_the_multi_part() -> None:
    verify_step = _batch([100, 7, 0, 30], [1, 4, 8, 2])  # leading decode row, then rows of 2..8 tokens
    split = split_rows(verify_step, multi_query_max_tokens=8)
    assert split.decode is None and split.extend is None and split.multi is not None
    multi = split.multi
    assert (multi.num_tokens, multi.first_token, multi.max_extend_len) == (15, 0, 8)
    for name in ("req_pool_indices", "prefix_lens", "extend_lens", "seq_lens", "extend_start_loc"):
        assert getattr(multi, name) is getattr(verify_step, name)  # views: a captured graph replays them
    assert split_rows(verify_step, multi_query_max_tokens=4).multi is None  # one row has more tokens
    assert split_rows(verify_step).multi is None  # the default (the torch backend's): never
    with_chunk = _batch([100, 7, 0], [1, 4, 20])  # a prefill chunk: decode rows, then the extend kernel
    split = split_rows(with_chunk, multi_query_max_tokens=8)
    assert split.multi is None and split.decode is not None and split.extend is not None
    assert split.decode.num_tokens == 1 and split.extend.num_tokens == 24
    decode = _batch([5, 9], [1, 1])
    assert decode.mode is ForwardMode.DECODE
    split = split_rows(decode, multi_query_max_tokens=8)
    assert split.multi is None and split.decode is not None and split.extend is None


@pytest.mark.parametrize("decode_rows", [1, 2, 3, 4, 5])
def test_split_rows_extend_part_starts_on_16_byte_boundaries(decode_rows: int) -> None:
    # Triton compiles a variant per pointer alignment: after an odd count of decode rows a view of the per-row
    # int32 arrays starts off a 16-byte boundary and would compile (seconds) a second extend kernel mid-run
    mixed = _batch([9] * decode_rows + [0, 3], [1] * decode_rows + [20, 11])
    split = split_rows(mixed, multi_query_max_tokens=8)
    assert split.extend is not None and split.decode is not None and split.decode.num_tokens == decode_rows
    for name in ("req_pool_indices", "prefix_lens", "extend_lens", "seq_lens", "extend_start_loc"):
        part = getattr(split.extend, name)
        assert part.data_ptr() % 16 == 0, name
        whole = getattr(mixed, name)
        expect = whole[decode_rows:] - (decode_rows if name == "extend_start_loc" else 0)
        assert torch.equal(part, expect), name


def test_backends_plan_the_split_their_kernels_serve() -> None:
    shape = AttentionShape(8, 2, 64, (None,))
    verify_step = _batch([100, 7], [3, 5])
    assert TritonAttentionBackend(shape).plan(verify_step).multi is not None
    assert TritonAttentionBackend(shape, multi_query_max_tokens=0).plan(verify_step).multi is None
    assert TorchAttentionBackend(shape, torch.float32).plan(verify_step).split.multi is None


@pytest.fixture(scope="module")
def interpreted() -> dict:
    """tests/multi_query_cases.py under the Triton interpreter in a child process: case name -> result."""
    seed = int.from_bytes(os.urandom(4), "little")
    args = [str(HERE / "multi_query_cases.py"), "--device", "cpu", "--size", "small", "--seed", str(seed)]
    results = run_interpreted(args, "CUDA present: these cases run compiled in "
                                    "test_triton_backend_matches_torch_backend_on_cuda")
    return {name: dict(r, seed=seed) for name, r in results.items()}


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.name)
def test_triton_interpret_backend_matches_torch_backend(case: BackendCase, interpreted: dict) -> None:
    result = interpreted[case.name]
    tolerance = verify.TOLERANCE[case.dtype]
    assert result["error"] <= tolerance, f"{case.name}: relative error {result['error']:.3e} (seed {result['seed']})"
    assert result["path"] == ("multi" if case.multi else "split")
    calls = result["kernel_calls"]
    assert calls["multi_query_decode_attention"] == (len(case.windows) if case.multi else 0)
    if case.multi:  # the whole batch, one launch per layer: no decode or extend launch beside it
        assert calls["decode_attention"] == calls["extend_attention"] == 0


@pytest.mark.gpu
@pytest.mark.parametrize("case", REAL + SMALL, ids=lambda c: c.name)
def test_triton_backend_matches_torch_backend_on_cuda(case: BackendCase) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    error, path = run_case(case, "cuda", seed)
    tolerance = verify.TOLERANCE[case.dtype]
    assert error <= tolerance, f"{case.name}: relative error {error:.3e} > {tolerance:.0e} (seed {seed})"
    assert path == ("multi" if case.multi else "split")


# (prefix, extend) of the requests each replay holds, within the capacity of GRAPH_CASE's table rows
LAYOUTS = [
    ([3999, 100, 0, 2047, 1023, 5, 64, 3000], [8, 1, 8, 2, 4, 8, 3, 5]),
    ([500, 1], [3, 8]),  # six padding rows, most tokens padding
    ([4000] * 8, [8] * 8),
    ([7, 4001, 250], [1, 7, 2]),
]


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_multi_query_rows_replay_in_a_cuda_graph(fp8: bool) -> None:
    """The backend's plan and forward captured once over a (bucket 8, k 8) graph batch (no host sync may happen:
    the capture would fail), then replayed for other rows, lengths and padding: each replay equals the torch
    backend on that layout."""
    case = BackendCase("graph-capacity", (32, 8), 128, (4000,) * 8, (8,) * 8, (None, 512), torch.bfloat16, fp8,
                       graph=(8, 8), context=8192)
    gen = torch.Generator().manual_seed(0)
    x = make_inputs(case, torch.device("cuda"), gen)
    backend = TritonAttentionBackend(shape_of(case))
    static, q = x.batch, x.q

    def forward() -> list[torch.Tensor]:
        plan = backend.plan(static)
        assert plan.multi is not None
        return [backend.forward(q, x.k_cache, x.v_cache, layer, plan, x.kv_scales) for layer in range(2)]

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = forward()
    rows = static.req_pool_indices.clone()
    for prefix, extend in LAYOUTS:
        n = len(prefix)
        layout = graph_batch(static.req_to_token, rows[:n], torch.tensor(prefix, device="cuda"),
                             torch.tensor(extend, device="cuda"), 8, 8, case.context)
        for name in ("req_pool_indices", "prefix_lens", "extend_lens", "seq_lens", "extend_start_loc"):
            getattr(static, name).copy_(getattr(layout, name))
        q.copy_(torch.randn(q.shape, generator=gen).to(q))
        graph.replay()
        want = reference(case, Inputs(layout, q, x.k_cache, x.v_cache, x.kv_scales, sum(extend)))
        for layer, (got, ref) in enumerate(zip(outs, want)):
            error = verify.rel_error(got[: sum(extend)], ref[: sum(extend)])
            assert error <= verify.TOLERANCE[torch.bfloat16], f"{extend} layer {layer}: relative error {error:.3e}"


# (GROUP_P2, BLOCK_M) the backend launches: Llama-3-8B's group 4 with 1-4 and 8 new tokens, group 8 with 8,
# group 8 with 16 (a 16-token row limit)
TILES = [(4, 16), (4, 32), (8, 64), (8, 128)]


@pytest.mark.parametrize(("group_p2", "block_m"), TILES, ids=[f"g{g}-m{m}" for g, m in TILES])
def test_multi_query_kernel_compiles_for_h200_without_spills(group_p2: int, block_m: int) -> None:
    triton = pytest.importorskip("triton")
    from test_kernels_compile import H200, _source

    from radixgen.kernels import multi_query_decode_triton as mq

    config = mq.default_multi_query_config(block_m)
    constexprs = {"GROUP": group_p2, "GROUP_P2": group_p2, "BLOCK_M": block_m, "D": 128,
                  "BLOCK_N": config.block_n, "DIRECT_OUT": False, "HAS_WINDOW": True, "FP8": False}
    compiled = triton.compile(_source(mq._multi_query_split_kernel, constexprs), target=H200,
                              options={"num_warps": config.num_warps, "num_stages": config.num_stages})
    ptx = compiled.asm["ptx"]
    assert "mma" in ptx and "cp.async" in ptx
    assert compiled.metadata.shared <= 227 * 1024
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        cuobjdump = Path(shutil.which("cuobjdump") or "/nonexistent")
    if not cuobjdump.exists():
        pytest.skip("no cuobjdump to read the register usage with")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([str(cuobjdump), "-res-usage", cubin.name], capture_output=True, text=True,
                               check=True).stdout
    line = next(ln for ln in usage.splitlines() if "REG:" in ln)
    assert "STACK:0 " in line and "LOCAL:0 " in line, f"register spills at {block_m} rows: {line.strip()}"


def test_tile_rows_pad_the_group_and_the_tokens() -> None:
    mq = pytest.importorskip("radixgen.kernels.multi_query_decode_triton")
    assert mq.tile_rows(4, 1) == (4, 16)  # at least 16 rows for the tensor cores
    assert mq.tile_rows(4, 4) == (4, 16)  # Llama-3-8B, a 4-token verify row: the decode kernel's tile
    assert mq.tile_rows(4, 8) == (4, 32)
    assert mq.tile_rows(3, 5) == (4, 32)  # SmolLM2's group 3 pads to 4 heads, 5 tokens to 8
    assert mq.tile_rows(8, 32)[1] > mq.MAX_TILE_ROWS  # the extend kernel takes such launches


def test_multi_query_merge_compiles_for_h200() -> None:
    triton = pytest.importorskip("triton")
    from test_kernels_compile import H200, _source

    from radixgen.kernels import multi_query_decode_triton as mq

    compiled = triton.compile(_source(mq._multi_query_merge_kernel, {"BLOCK_S": 32, "D": 128}), target=H200,
                              options={"num_warps": 4})
    assert "ld.global.v4" in compiled.asm["ptx"]  # each split's partial row read 16 bytes at a time
