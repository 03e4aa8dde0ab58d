"""recipes.whisper_ctc.run: stage selection, each round's training arguments against the
documented commands, skipping finished rounds, the stage loop and its timing log (no real training)."""

import re
import shlex
from pathlib import Path

import pytest

from recipes.stages import parse_stages, run_stages, stage_line
from recipes.whisper_ctc import train as train_recipe
from recipes.whisper_ctc.run import (
    ROUNDS,
    STAGES,
    Layout,
    Round,
    parse_args,
    train_argv,
    train_rounds,
)

# the augmentation flags of <data>/wctc/logs/train_s3.cmd and train_s5d.cmd, verbatim
DOCUMENTED_AUGMENT = """--snapshot-interval-s 900 \
  --freq-masks 2 --freq-width 15 --time-masks 3 --time-width 40 \
  --warp-prob 0.7 --warp-range 0.88 1.12 --band-limit-prob 0.15 --gain-prob 0.5 --max-gain-db 6 \
  --lead-silence-prob 0.3 --trail-silence-prob 0.3 --max-silence-frames 60 --trim-prob 0.3"""
DOCUMENTED = {
    "top2": "--train-layers 2 --freeze-stem --total-steps 4000",
    "s3": "--init-ckpt S3_INIT --train-layers 2 --freeze-stem --body-lr 1e-4 --head-lr 1e-3 "
          "--warmup-steps 100 --total-steps 5000 " + DOCUMENTED_AUGMENT,
    "s5d": "--train-splits train train_digits --threads 1 --init-ckpt S5_INIT --train-layers 2 "
           "--freeze-stem --body-lr 1e-4 --head-lr 1e-3 --warmup-steps 100 --total-steps 5000 "
           "--seed 2 --distill-layers 2 " + DOCUMENTED_AUGMENT,
}


def flags(argv: list[str]) -> dict[str, tuple[str, ...]]:
    """``--name v1 v2 --other`` -> {"--name": ("v1", "v2"), "--other": ()}."""
    out: dict[str, tuple[str, ...]] = {}
    name = None
    for item in argv:
        if item.startswith("--"):
            name = item
            assert name not in out, f"{name} given twice"
            out[name] = ()
        else:
            assert name is not None, f"value {item} before any flag"
            out[name] += (item,)
    return out


def test_stage_selection_keeps_order_and_rejects_unknown() -> None:
    assert parse_stages("lm, train", STAGES) == ["lm", "train"]
    assert parse_stages(",".join(STAGES), STAGES) == list(STAGES)
    with pytest.raises(SystemExit, match="unknown stages \\['trian'\\]"):
        parse_stages("feats,trian", STAGES)
    with pytest.raises(SystemExit, match="no stages"):
        parse_stages(" , ", STAGES)
    with pytest.raises(SystemExit, match="unknown stages"):
        parse_args(["--stages", "train,conformer"])


def test_defaults_export_outside_the_repo(tmp_path: Path) -> None:
    from oasr.models.checkpoint import DEFAULT_MODEL_DIR

    args = parse_args(["--data", str(tmp_path)])
    assert args.stage_list == list(STAGES)
    assert args.layout.out == tmp_path / "wctc" / "export"
    assert args.layout.out.resolve() != DEFAULT_MODEL_DIR.resolve()
    assert args.layout.feats == tmp_path / "wctc" / "feats_s5"
    assert (args.num_train, args.workers) == (10000, 2)
    assert parse_args(["--out", "oasr/assets/default_model"]).layout.out == Path(
        "oasr/assets/default_model")
    with pytest.raises(SystemExit):
        parse_args(["--max-hours", "0"])


@pytest.mark.parametrize("r", ROUNDS, ids=lambda r: r.name)
def test_round_arguments_match_the_documented_commands(r: Round, tmp_path: Path) -> None:
    layout = Layout(tmp_path, tmp_path / "out")
    got = flags(train_argv(r, layout))
    want = flags(shlex.split(DOCUMENTED[r.name]))
    want.setdefault("--train-splits", ("train",))
    inits = {"S3_INIT": str(layout.final("top2")), "S5_INIT": str(layout.final("s3"))}
    if "--init-ckpt" in want:
        want["--init-ckpt"] = (inits[want["--init-ckpt"][0]],)
    want["--ckpt"] = (str(tmp_path / "wctc" / f"ckpt_{r.name}"),)
    want["--feats"] = (str(tmp_path / "wctc" / "feats_s5"),)
    want["--max-hours"] = (str(r.max_hours),)
    if r.max_steps:
        want["--max-steps"] = (str(r.max_steps),)
    assert got == want


def test_lineage_init_splits_and_distillation_only_in_round_5(tmp_path: Path) -> None:
    layout = Layout(tmp_path, tmp_path / "out")
    top2, s3, s5d = (flags(train_argv(r, layout)) for r in ROUNDS)
    assert "--init-ckpt" not in top2
    assert s3["--init-ckpt"] == (str(tmp_path / "wctc" / "ckpt_top2" / "final.pt"),)
    assert s5d["--init-ckpt"] == (str(tmp_path / "wctc" / "ckpt_s3" / "final.pt"),)
    assert top2["--train-splits"] == s3["--train-splits"] == ("train",)
    assert s5d["--train-splits"] == ("train", "train_digits")
    assert "--distill-layers" not in top2 and "--distill-layers" not in s3
    assert s5d["--distill-layers"] == ("2",)
    assert flags(train_argv(ROUNDS[1], layout, max_hours=0.25))["--max-hours"] == ("0.25",)


def test_train_parses_round_5_into_the_documented_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real recipes.whisper_ctc.train argument parser, with only the training loop and the
    init load replaced by recorders."""
    seen: dict = {}
    monkeypatch.setattr(train_recipe, "load_checkpoint_model",
                        lambda path: (seen.setdefault("init", path), {}))
    monkeypatch.setattr(train_recipe, "run", lambda paths, cfg, **kw: seen.update(
        paths=paths, cfg=cfg, **kw))
    layout = Layout(tmp_path, tmp_path / "out")
    train_recipe.main(train_argv(ROUNDS[2], layout))
    cfg = seen["cfg"]
    assert seen["init"] == layout.final("s3")
    assert seen["paths"] == train_recipe.Paths(layout.feats, layout.ckpt("s5d"),
                                             ("train", "train_digits"))
    assert (seen["max_hours"], seen["max_steps"]) == (1.45, 0)
    assert (cfg.body_lr, cfg.head_lr, cfg.warmup_steps, cfg.total_steps) == (1e-4, 1e-3, 100, 5000)
    assert (cfg.train_layers, cfg.freeze_stem, cfg.seed, cfg.num_threads) == (2, True, 2, 1)
    assert cfg.distill.layers == 2 and cfg.snapshot_interval_s == 900
    assert (cfg.spec.num_freq_masks, cfg.spec.max_freq_width) == (2, 15)
    assert (cfg.spec.num_time_masks, cfg.spec.max_time_width) == (3, 40)
    a = cfg.augment
    assert (a.warp_prob, a.warp_min, a.warp_max, a.band_limit_prob) == (0.7, 0.88, 1.12, 0.15)
    assert (a.gain_prob, a.max_gain_db, a.max_silence_frames) == (0.5, 6, 60)
    assert (a.lead_silence_prob, a.trail_silence_prob, a.trim_prob) == (0.3, 0.3, 0.3)


class Recorder:
    """A cheap stand-in for recipes.whisper_ctc.train.main: records argv, writes a latest.pt naming the round."""

    def __init__(self, write: bool = True) -> None:
        self.calls: list[list[str]] = []
        self.write = write

    def __call__(self, argv: list[str]) -> None:
        self.calls.append(argv)
        ckpt = Path(argv[argv.index("--ckpt") + 1])
        ckpt.mkdir(parents=True, exist_ok=True)
        if self.write:
            (ckpt / "latest.pt").write_text(ckpt.name)


def test_rounds_chain_and_finished_rounds_are_skipped(tmp_path: Path) -> None:
    layout = Layout(tmp_path, tmp_path / "out")
    train = Recorder()
    assert train_rounds(layout, train) == ["top2", "s3", "s5d"]
    assert [Path(c[c.index("--ckpt") + 1]).name for c in train.calls] == [
        "ckpt_top2", "ckpt_s3", "ckpt_s5d"]
    for r in ROUNDS:
        assert layout.final(r.name).read_text() == f"ckpt_{r.name}"
    again = Recorder()
    assert train_rounds(layout, again) == [] and again.calls == []
    layout.final("s5d").unlink()
    (layout.ckpt("s5d") / "latest.pt").write_text("half-trained")
    assert train_rounds(layout, again) == ["s5d"] and len(again.calls) == 1
    assert layout.final("s5d").read_text() == "ckpt_s5d"


def test_round_without_its_init_or_its_checkpoint_fails(tmp_path: Path) -> None:
    layout = Layout(tmp_path, tmp_path / "out")
    with pytest.raises(RuntimeError, match="ckpt_top2/final.pt, which does not exist"):
        train_rounds(layout, Recorder(), rounds=ROUNDS[1:])
    with pytest.raises(RuntimeError, match="round top2 ended without"):
        train_rounds(layout, Recorder(write=False))
    assert not layout.final("top2").exists()
    with pytest.raises(ValueError, match="max_hours 0 must be > 0"):
        Round("x", None, ("train",), (), max_hours=0)


def test_stage_loop_times_and_logs_each_stage(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[str] = []

    def stage(name: str) -> None:
        ran.append(name)
        if name == "evaluate":
            raise RuntimeError("evaluate failed")

    timings = run_stages(["text", "lm"], stage, tmp_path / "logs")
    assert ran == ["text", "lm"] and [n for n, _ in timings] == ["text", "lm"]
    assert all(0 <= t < 5 for _, t in timings)
    lines = (tmp_path / "logs" / "stages.tsv").read_text().splitlines()
    assert [line.split("\t")[1] for line in lines] == ["text", "lm"]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\t\w+\t\d+\.\d", line) for line in lines)
    assert "== stage lm took 0.0 min ==" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="evaluate failed"):
        run_stages(["export", "evaluate", "train"], stage, tmp_path / "logs")
    assert ran[2:] == ["export", "evaluate"]  # the loop stopped at the failing stage
    lines = (tmp_path / "logs" / "stages.tsv").read_text().splitlines()
    assert [line.split("\t")[1] for line in lines] == ["text", "lm", "export"]


def test_stage_line_format() -> None:
    line = stage_line("train", 3725.04, when=0.0)
    assert re.fullmatch(r"19(69|70)-\d\d-\d\d \d\d:\d\d:\d\d\ttrain\t3725\.0\n", line)


def test_evaluate_and_export_need_round_5(tmp_path: Path) -> None:
    from recipes.whisper_ctc.run import run_stage

    args = parse_args(["--data", str(tmp_path)])
    for stage in ("evaluate", "export"):
        with pytest.raises(RuntimeError, match=f"stage {stage} needs .*ckpt_s5d/final.pt"):
            run_stage(stage, args)
    assert not (tmp_path / "wctc" / "export").exists()
