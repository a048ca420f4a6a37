"""torch's own NCCL path, the counterpart of worker/nccl_check: init_process_group("nccl") on
the rank's GPU (LOCAL_RANK), the same all-reduce and broadcast with the same values, the same
checksum, and the bandwidth of ITERATIONS all-reduces of ELEMENTS floats after two warm-up ones.
Run under launch or torchrun:

    launch --nproc_per_node=1 tests/gpu/torch_nccl_check.py [ELEMENTS [ITERATIONS]]
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    elements = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 24
    iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    start = time.perf_counter()
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    pattern = (torch.arange(elements, device=device) % 1000).float()
    x = pattern * (rank + 1)
    dist.all_reduce(x)  # the communicator is made lazily, at the first collective
    torch.cuda.synchronize()
    init_ms = (time.perf_counter() - start) * 1e3
    wrong = int((x != pattern * (world * (world + 1) // 2)).sum())
    checksum = float(x.double().sum())
    y = pattern.clone() if rank == 0 else torch.zeros_like(pattern)
    dist.broadcast(y, 0)
    wrong_b = int((y != pattern).sum())
    nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    print(f"torch_nccl_check rank {rank}/{world} on GPU {local} of {torch.cuda.device_count()}, "
          f"torch {torch.__version__}, NCCL {nccl}: init and first all_reduce {init_ms:.0f} ms; "
          f"all_reduce of {elements} floats {'exact' if wrong == 0 else f'WRONG in {wrong} places'} "
          f"(checksum {checksum:.17g}); broadcast {'exact' if wrong_b == 0 else 'WRONG'}", flush=True)
    ok = wrong == 0 and wrong_b == 0
    if ok and iterations > 0:
        del x, y
        z = torch.zeros(elements, device=device)
        for _ in range(2):
            dist.all_reduce(z)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(z)
            torch.cuda.synchronize()  # as nccl_check waits for each
        secs = time.perf_counter() - t0
        size = elements * 4
        algbw = size * iterations / secs / 1e9
        print(f"torch_nccl_check rank {rank}/{world}: all_reduce of {size / (1 << 30):.3f} GiB x "
              f"{iterations}: {secs * 1e3 / iterations:.3f} ms each, algbw {algbw:.1f} GB/s, "
              f"busbw {algbw * 2 * (world - 1) / world:.1f} GB/s", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
