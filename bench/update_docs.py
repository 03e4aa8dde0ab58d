"""Paste a benchmark run's tables into docs/benchmarks.md (between the results markers).

    python bench/update_docs.py bench/results.json

The header lines (date, machine, model) come from the JSON; the tables are
``oasr.benchmarks.report.format_markdown`` of it, exactly as ``oasr bench`` printed them.
"""

import json
import sys
from pathlib import Path

from oasr.benchmarks.report import format_markdown

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def section(result: dict) -> str:
    m = result["machine"]
    tables = format_markdown(result).split("\n", 2)[2]  # drop the "Model:" line
    return "\n".join([
        BEGIN,
        f"- Date: {result['date_utc']} UTC, when the run finished "
        f"({'quick' if result['quick'] else 'full'} run, {result['elapsed_s']:.0f} s).",
        f"- Machine: {m['cpu_count']} vCPU {m['cpu']} (shared), device {m['device']}, torch "
        f"{m['torch']}, {m['torch_threads']} intra-op thread(s); 1-minute load average "
        f"{m['load_average_1min_at_start']} when the run started.",
        f"- Model: {result['model_source']}.",
        "",
        tables.strip(),
        END,
    ])


def main() -> int:
    result = json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results.json")
                        .read_text())
    text = DOC.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    DOC.write_text(text[:start] + section(result) + text[end:])
    print(f"updated {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
