"""Every engine benchmark in one run (the same as ``oasr bench``); see docs/benchmarks.md.

    nice -n 10 python bench/bench_engine.py --threads 1 --out bench/results.json \
        --markdown bench/results.md
    python bench/bench_engine.py --quick --json
"""

import sys

from oasr.benchmarks.runner import main

if __name__ == "__main__":
    sys.exit(main())
