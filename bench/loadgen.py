"""The websocket load generator on its own (``python bench/loadgen.py SPEC.json OUT.json``).

``oasr bench`` starts it as a separate process; SPEC is a JSON `LoadSpec`
(oasr/benchmarks/loadgen.py): url, num_clients, audio_dir, seconds, deadline_s, expected.
Only point it at a server on 127.0.0.1 that you started.
"""

import sys

from oasr.benchmarks.loadgen import main

if __name__ == "__main__":
    sys.exit(main())
