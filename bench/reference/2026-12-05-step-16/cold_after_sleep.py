"""What one small torch call costs right after the caller slept, spun or did neither (median of 300, us)."""
import time

import torch


def median_us(sleep_s: float = 0.0, spin_s: float = 0.0, n: int = 300) -> float:
    times = []
    for _ in range(n):
        if sleep_s:
            time.sleep(sleep_s)
        end = time.perf_counter() + spin_s
        while time.perf_counter() < end:
            pass
        start = time.perf_counter()
        torch.tensor([0, 1, 2], dtype=torch.int32)
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 2] * 1e6


for label, kwargs in (("back to back", {}), ("after a 20 ms sleep", {"sleep_s": 0.02}),
                      ("after a 20 ms busy spin", {"spin_s": 0.02}), ("after a 1 ms sleep", {"sleep_s": 0.001})):
    print(f"torch.tensor of 3 int32s, {label}: {median_us(**kwargs):.1f} us")
