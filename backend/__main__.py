"""``python -m backend``: the same as ``oasr-server``."""

import sys

from backend.cli import server_main

sys.exit(server_main())
