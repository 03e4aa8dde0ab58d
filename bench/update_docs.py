"""Paste a benchmark run's tables into docs/benchmarks.md (between its family's markers).

    python bench/update_docs.py bench/results_whisper_ctc.json bench/results_conformer.json

Each JSON goes between ``<!-- results:<family>:begin -->`` and ``<!-- results:<family>:end -->``
(``family`` from the JSON; a run without one is a Conformer run). The header lines (date,
machine, model) come from the JSON; the tables are ``oasr.benchmarks.report.format_markdown``
of it, exactly as ``oasr bench`` printed them.
"""

import json
import sys
from pathlib import Path

from oasr import cpu
from oasr.benchmarks.report import format_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def markers(family: str) -> tuple[str, str]:
    return f"<!-- results:{family}:begin -->", f"<!-- results:{family}:end -->"


def section(result: dict) -> str:
    m = result["machine"]
    begin, end = markers(result.get("family", "conformer_ctc"))
    tables = format_markdown(result).split("\n\n", 1)[1]  # the tables, not the lines above
    return "\n".join([
        begin,
        f"- Date: {result['date_utc']} UTC, when the run finished "
        f"({'quick' if result['quick'] else 'full'} run, {result['elapsed_s']:.0f} s).",
        f"- Machine: {m['cpu_count']} vCPU {cpu.summary(m)} (shared), device {m['device']}, torch "
        f"{m['torch']}, {m['torch_threads']} intra-op thread(s); 1-minute load average "
        f"{m['load_average_1min_at_start']} when the run started.",
        f"- Model: {result['model_source']}; speed runs in dtype {result.get('dtype', 'auto')}"
        f" = {result.get('dtype_resolved', 'float32')}.",
        "",
        tables.strip(),
        end,
    ])


def main() -> int:
    paths = sys.argv[1:] or ["bench/results_conformer.json"]
    text = DOC.read_text()
    for path in paths:
        result = json.loads(Path(path).read_text())
        begin, end = markers(result.get("family", "conformer_ctc"))
        start, stop = text.index(begin), text.index(end) + len(end)
        text = text[:start] + section(result) + text[stop:]
    DOC.write_text(text)
    print(f"updated {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
