"""Time of one batched decode step of the default model on the CPU, by batch size and context length.

Each configuration prefills `batch` requests of `context` tokens on one `ModelRunner`, then times decode steps
(one new token per request, the KV of every earlier token read through the slot pool): the step the engine runs
for every token of a batch. Run it on two builds to compare them; the table ends with the median step.
With `--prefill N ...` it times instead one forward of a single N-token prompt (the attention's quadratic part)
and the growth of the process's peak memory over the loaded model. With `--shared P` every request's first P
context tokens are the first request's KV slots, as after a radix-cache hit; `--no-cascade` turns off the CPU
attention's shared-prefix path for an A/B, `--no-kv-copies` the per-layer K/V copies decode steps carry;
`--churn K` replaces K requests before each step by new ones (new table rows) over the same context, as the
next turn of a conversation takes over its previous turn's cached KV, and
`--plain-weights` keeps the fp32 weights out of oneDNN's packed layout. `--extend E` times instead a forward
that appends E tokens to every request (a chat turn's prefill over its cached context, undone after each
step), and `--profile` prints torch.profiler's top ops for each shape. `--threads-as caller-built` steps on a
second thread after building on the main one (so two threads hold OpenMP teams, as the engine did before it
built on a short-lived thread; `engine` is what it does now).

    python benchmarks/cpu_decode_step.py [--model PATH] [--shapes 1x500 6x500 20x700] [--steps 10] [--dtype float32]
    python benchmarks/cpu_decode_step.py --prefill 2048 8192
    python benchmarks/cpu_decode_step.py --shapes 32x1600 --shared 1500 [--no-cascade]
    python benchmarks/cpu_decode_step.py --shapes 20x700 --churn 2 [--no-kv-copies]
    python benchmarks/cpu_decode_step.py --shapes 20x300 --extend 56 --steps 3 --profile
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch


def extend(runner, rows: list[int], lens: list[int], tokens: list[list[int]]) -> torch.Tensor:
    """Append `tokens[i]` to the request in table row `rows[i]` (which holds `lens[i]` tokens; updated) in one
    forward: slots allocated, the request-to-slots table written, logits of each request's last token returned."""
    from radixgen.runtime.forward_batch import forward_batch_from_lists

    table = runner.req_to_token_pool
    slots = []
    for row, n, ids in zip(rows, lens, tokens):
        s = runner.slot_allocator.alloc(len(ids))
        table.write(row, n, s)
        slots.append(torch.from_numpy(s))
    batch = forward_batch_from_lists(tokens, list(lens), rows, table.req_to_token, torch.cat(slots))
    for i, ids in enumerate(tokens):
        lens[i] += len(ids)
    return runner.forward(batch)


def step_times(runner, batch: int, context: int, steps: int, shared: int = 0, churn: int = 0,
               new_tokens: int = 1, profile: bool = False) -> list[float]:
    """Median-able decode step times; with `shared`, every request's first `shared` context tokens are the
    first request's KV slots (a prefix shared through the radix cache); with `churn`, before each step that many
    requests are replaced by new ones (new request-table rows) over the same context, as when the next turn of a
    conversation joins the batch with its previous turn's KV from the radix cache. With `new_tokens` > 1 each
    timed forward appends that many tokens to every request (a chat turn's prefill over its cached context) and
    is undone after, so every step sees the same context; `profile` prints torch.profiler's top ops over two
    more steps."""
    table = runner.req_to_token_pool
    rows = [table.alloc() for _ in range(batch)]
    lens = [0] * batch
    for i in range(batch):  # prefill one request at a time (the step under test is the decode)
        if i and shared:
            table.write(rows[i], 0, table.req_to_token[rows[0], :shared].numpy())
            lens[i] = shared
        extend(runner, rows[i : i + 1], [lens[i]], [[1 + (k * 7 + i) % 1000 for k in range(lens[i], context)]])
        lens[i] = context
    for _ in range(2):  # warm-up
        extend(runner, rows, lens, [[5]] * batch)
    ids = [[1 + k % 50 for k in range(new_tokens)]] * batch

    def forward() -> None:
        before = list(lens)
        extend(runner, rows, lens, ids)
        if new_tokens > 1:  # undo the turn: free its slots, so the next step extends the same context
            for row, n in zip(rows, before):
                runner.slot_allocator.free(table.req_to_token[row, n : n + new_tokens].clone())
            lens[:] = before

    out = []
    for step in range(steps):
        for k in range(churn):  # the newcomer takes over the leaver's slots under a new table row
            i = (step * churn + k) % batch
            row = table.alloc()
            table.write(row, 0, table.req_to_token[rows[i], : lens[i]].clone())
            table.free(rows[i])
            rows[i] = row
        t0 = time.perf_counter()
        forward()
        out.append(time.perf_counter() - t0)
    if profile:
        from torch.profiler import profile as torch_profile

        with torch_profile() as prof:
            for _ in range(2):
                forward()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    for i, (row, n) in enumerate(zip(rows, lens)):
        runner.slot_allocator.free(table.req_to_token[row, shared if i else 0 : n].clone())
        table.free(row)
    return out


def make_runner(args, max_total_tokens: int, max_running_requests: int):
    from radixgen.runtime.download import default_model_path
    from radixgen.runtime.engine_config import EngineConfig
    from radixgen.runtime.model_runner import ModelRunner

    return ModelRunner(EngineConfig(model_path=args.model or str(default_model_path()), device="cpu",
                                    dtype=args.dtype, max_total_tokens=max_total_tokens,
                                    max_running_requests=max_running_requests))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file or HF folder (default: the downloaded default model)")
    ap.add_argument("--shapes", nargs="*", default=["1x500", "6x500", "20x700"], help="BATCHxCONTEXT")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prefill", nargs="*", type=int, default=None, help="time one prompt of each length instead")
    ap.add_argument("--shared", type=int, default=0, help="context tokens every request shares with the first")
    ap.add_argument("--no-cascade", action="store_true", help="read a shared prefix once per request (A/B)")
    ap.add_argument("--plain-weights", action="store_true",
                    help="keep fp32 weights unpacked (where oneDNN runs the linears, they are packed; A/B)")
    ap.add_argument("--churn", type=int, default=0, help="requests replaced by new ones before each step")
    ap.add_argument("--extend", type=int, default=1,
                    help="tokens each timed forward appends to every request (> 1: a chat turn's prefill, undone)")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler's top ops after each shape")
    ap.add_argument("--no-kv-copies", action="store_true",
                    help="gather every context from the pool at each step instead of carrying the batch's K/V (A/B)")
    ap.add_argument("--threads-as", choices=["main", "engine", "caller-built"], default="main",
                    help="main: build and step on the main thread; engine: build on a short-lived thread and step "
                         "on another, as the engine does; caller-built: build on the main thread, step on another")
    args = ap.parse_args()
    from radixgen.runtime.engine import _on_own_thread as on_thread  # the engine's own build helper

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.plain_weights:
        from radixgen import kernels

        kernels.linear_weight_packer = lambda dtype, device: None
    if args.no_cascade:
        from radixgen.kernels import attention_torch

        attention_torch.SHARED_PREFIX_MIN = 1 << 62
    if args.prefill:
        prefill_table(args)
        return
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    total = max(b * (c + args.steps + 4 + args.extend) for b, c in shapes) + 64
    built: list = []

    def build() -> None:
        built.append(make_runner(args, total, max(b for b, _ in shapes) + args.churn))

    on_thread(build) if args.threads_as == "engine" else build()
    runner = built[0]
    if args.no_kv_copies:
        runner.attention.decode_kv_copies = None
    print(f"shared prefix: {args.shared} tokens (at most context - 1), cascade: {not args.no_cascade}, "
          f"K/V copies across steps: {runner.attention.decode_kv_copies is not None}, "
          f"requests replaced per step: {args.churn}, "
          f"threads as: {args.threads_as}, tokens per request per step: {args.extend}")
    print(f"{'batch':>5} {'context':>7} {'median step ms':>14} {'min ms':>8} {'tok/s':>8}")

    def run() -> None:
        for batch, context in shapes:
            times = step_times(runner, batch, context, args.steps, min(args.shared, context - 1), args.churn,
                               args.extend, args.profile)
            med = statistics.median(times)
            print(f"{batch:>5} {context:>7} {med * 1e3:>14.1f} {min(times) * 1e3:>8.1f} "
                  f"{batch * args.extend / med:>8.1f}")

    run() if args.threads_as == "main" else on_thread(run)


def prefill_table(args) -> None:
    """One forward of a single prompt per length, shortest first (peak memory only grows)."""
    runner = make_runner(args, max(args.prefill) + 64, 2)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"{'prompt':>7} {'forward s':>9} {'tok/s':>8} {'peak RSS growth MB':>18}")
    for n in sorted(args.prefill):
        row = runner.req_to_token_pool.alloc()
        t0 = time.perf_counter()
        extend(runner, [row], [0], [[1 + (k * 7) % 1000 for k in range(n)]])
        dt = time.perf_counter() - t0
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
        print(f"{n:>7} {dt:>9.2f} {n / dt:>8.1f} {grown:>18.0f}")
        runner.slot_allocator.free(runner.req_to_token_pool.req_to_token[row, :n].clone())
        runner.req_to_token_pool.free(row)


if __name__ == "__main__":
    main()
