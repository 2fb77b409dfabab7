#!/usr/bin/env python3
"""torch.distributed (NCCL backend) baseline for bench/allreduce_latency.

    mpirun -np 2 $NCFSM_MPI_ENV -x MASTER_ADDR -x MASTER_PORT python3 bench/torch_allreduce.py \
        [--iters N] [--rounds R] [--quick]

Rank and world size come from Open MPI (OMPI_COMM_WORLD_RANK / _SIZE /
_LOCAL_RANK); the rendezvous is torch's TCP store on MASTER_ADDR:MASTER_PORT
(default 127.0.0.1:29517). Measures, as the C bench does:
  - 8-byte all_reduce (float32 x 2, in place) + torch.cuda.synchronize round
    trip: median and P99 over interleaved rounds, rank 0's view;
  - 256 MiB all_reduce bus bandwidth: ops submitted back to back, then one
    synchronize; busbw = algbw * 2(n-1)/n.
Rank 0 prints Markdown and "KV key value" lines for bench/run_gpu_bench.sh.
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def pct(sorted_v, p):
    k = max(1, min(len(sorted_v), int(p / 100.0 * len(sorted_v) + 0.999999)))
    return sorted_v[k - 1]


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    iters, rounds = (50, 2) if quick else (1000, 3)
    if "--iters" in args:
        iters = int(args[args.index("--iters") + 1])
    if "--rounds" in args:
        rounds = int(args[args.index("--rounds") + 1])
    bw_bytes, bw_iters, bw_rounds = ((16 << 20), 4, 2) if quick else ((256 << 20), 20, 5)

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", rank))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    ndev = torch.cuda.device_count()
    dev = torch.device("cuda", local % ndev)
    torch.cuda.set_device(dev)
    t0 = time.perf_counter()
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)

    def p0(*a):
        if rank == 0:
            print(*a, flush=True)

    nccl_v = ".".join(str(x) for x in torch.cuda.nccl.version())
    p0(f"# torch_allreduce: torch {torch.__version__}, NCCL {nccl_v} (torch.cuda.nccl.version), "
       f"{world} ranks, rank 0 on {torch.cuda.get_device_name(dev)}")
    p0(f"KV torch.version {torch.__version__}\nKV torch.nccl_version {nccl_v}")

    x = torch.zeros(2, dtype=torch.float32, device=dev)  # 8 bytes
    dist.all_reduce(x)  # connect
    torch.cuda.synchronize()
    p0(f"setup: process group and first all_reduce in {(time.perf_counter() - t0) * 1e3:.0f} ms\n")

    # ---- 8-byte round trip ----
    for _ in range(200):
        dist.all_reduce(x)
        torch.cuda.synchronize()
    samples = []
    clk = time.perf_counter_ns
    cpu_s = wall_s = 0.0
    for _ in range(rounds):
        dist.barrier(device_ids=[dev.index])
        torch.cuda.synchronize()
        c0, w0 = time.thread_time(), time.perf_counter()
        for _ in range(iters):
            t = clk()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            samples.append((clk() - t) / 1e3)
        cpu_s += time.thread_time() - c0
        wall_s += time.perf_counter() - w0
    samples.sort()
    med, p99 = statistics.median(samples), pct(samples, 99)
    p0("## torch.distributed 8-byte all_reduce + torch.cuda.synchronize, rank 0\n")
    p0("| variant | samples | median us | p99 us | min us | CPU of calling thread |")
    p0("|---|---:|---:|---:|---:|---:|")
    p0(f"| torch | {len(samples)} | {med:.1f} | {p99:.1f} | {samples[0]:.1f} | {100 * cpu_s / wall_s:.0f}% |\n")
    p0(f"KV rt.torch.median_us {med:.2f}\nKV rt.torch.p99_us {p99:.2f}")

    # ---- bandwidth ----
    big = torch.zeros(bw_bytes // 4, dtype=torch.float32, device=dev)
    factor = 2.0 * (world - 1) / world
    for _ in range(3):
        dist.all_reduce(big)
    torch.cuda.synchronize()
    bws = []
    cpu_s = wall_s = 0.0
    for _ in range(bw_rounds):
        dist.barrier(device_ids=[dev.index])
        torch.cuda.synchronize()
        c0, w0 = time.thread_time(), time.perf_counter()
        for _ in range(bw_iters):
            dist.all_reduce(big)
        torch.cuda.synchronize()
        dt = time.perf_counter() - w0
        cpu_s += time.thread_time() - c0
        wall_s += dt
        bws.append(bw_bytes / (dt / bw_iters) / 1e9 * factor)
    bws.sort()
    p0(f"## torch.distributed {bw_bytes >> 20} MiB all_reduce bus bandwidth, {bw_iters} ops per round, "
       f"{bw_rounds} rounds, rank 0\n")
    p0("| variant | median busbw GB/s | min | max | CPU of calling thread |")
    p0("|---|---:|---:|---:|---:|")
    p0(f"| torch | {statistics.median(bws):.1f} | {bws[0]:.1f} | {bws[-1]:.1f} | {100 * cpu_s / wall_s:.0f}% |\n")
    p0(f"KV bw.torch.busbw_GBps {statistics.median(bws):.2f}")

    dist.barrier(device_ids=[dev.index])
    dist.destroy_process_group()
    p0("done")


if __name__ == "__main__":
    main()
