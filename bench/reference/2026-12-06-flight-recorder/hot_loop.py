"""The flight recorder's cost per collective in a hot loop: one gloo rank, 200 all-reduces of 1 KiB back to back, CPU
time (all threads), median of 20 blocks; run with TORCH_FR_BUFFER_SIZE=0, =2000, and =2000 without stack capture."""
import os, time, statistics
import torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(256)
for _ in range(300): dist.all_reduce(t)
cpu = []
for _ in range(20):
    c = time.process_time()
    for _ in range(200): dist.all_reduce(t)
    cpu.append((time.process_time() - c) / 200)
print(os.environ.get("TORCH_FR_BUFFER_SIZE"), os.environ.get("TORCH_INCLUDE_STACK_TRACE", "-"), f"CPU median {statistics.median(cpu)*1e6:.1f} us/collective")
