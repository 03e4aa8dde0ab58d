"""Synthesise the hotword sentences (``bench/data/hotword_sentences.tsv``) with several voices.

Each sentence is spoken by two voices of a rotation of espeak-ng variants and flite voices
(the engines of ``shared/notes/offline-assets.md``), converted with sox to 16 kHz mono s16le
WAV, and listed in ``manifest.tsv`` (file, set, name, voice, sentence) in the output folder.

    python bench/hotword_audio.py --out /tmp/oasr_hotwords
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SENTENCES = Path(__file__).resolve().parent / "data" / "hotword_sentences.tsv"
# (engine, voice) pairs; each sentence takes two consecutive ones of this rotation
VOICES = (
    ("espeak-ng", "en-us"),
    ("flite", "slt"),
    ("espeak-ng", "en-gb+m3"),
    ("flite", "kal16"),
    ("espeak-ng", "en-us+f3"),
    ("flite", "rms"),
    ("espeak-ng", "en+m7"),
    ("flite", "awb"),
)
VOICES_PER_SENTENCE = 2


@dataclass(frozen=True)
class Sentence:
    set: str
    name: str
    text: str


def read_sentences(path: Path = SENTENCES) -> list[Sentence]:
    """The sentences of the list (comment lines start with #)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, name, text = line.split("\t")
        rows.append(Sentence(kind, name, text))
    return rows


def synthesise(engine: str, voice: str, text: str, out: Path) -> None:
    """``text`` spoken by ``voice`` into ``out`` (16 kHz mono s16le)."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.wav"
        if engine == "espeak-ng":
            subprocess.run(["espeak-ng", "-v", voice, "-s", "160", "-w", str(raw), text],
                           check=True)
        else:
            subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(raw)], check=True)
        subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)],
                       check=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "oasr_hotwords")
    args = p.parse_args(argv)
    for tool in ("espeak-ng", "flite", "sox"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt-get install {tool})")
    args.out.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, sentence in enumerate(read_sentences()):
        for j in range(VOICES_PER_SENTENCE):
            engine, voice = VOICES[(i * VOICES_PER_SENTENCE + j) % len(VOICES)]
            name = f"{sentence.set}_{i:02d}_{voice.replace('+', '_')}.wav"
            synthesise(engine, voice, sentence.text, args.out / name)
            lines.append("\t".join([name, sentence.set, sentence.name, f"{engine}:{voice}",
                                    sentence.text]))
    (args.out / "manifest.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines)} files in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
