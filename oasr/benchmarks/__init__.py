"""oasr's benchmarks: the batched paged engine against one-stream dense serving, per-chunk cost
as history grows, real-time capacity, arithmetic rate, K/V memory and server latency.

Run them with ``oasr bench`` (``--quick --json`` for the headline numbers).
"""

from oasr.benchmarks.runner import BenchConfig, main, run_benchmarks

__all__ = ["BenchConfig", "main", "run_benchmarks"]
