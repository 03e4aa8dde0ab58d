"""``--cuda-graphs`` reaches the engine and the benchmark configs."""

import argparse

import pytest

from oasr.benchmarks.runner import BenchConfig, build_parser, config_from_args
from oasr.engine.options import add_engine_arguments, engine_config_from_args


def test_engine_flag() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args([])).cuda_graphs == "off"
    assert engine_config_from_args(parser.parse_args(["--cuda-graphs", "auto"])).cuda_graphs == "auto"
    assert engine_config_from_args(parser.parse_args(["--cuda-graphs", "off"])).cuda_graphs == "off"
    with pytest.raises(SystemExit):
        parser.parse_args(["--cuda-graphs", "maybe"])


def test_bench_flags() -> None:
    args = build_parser().parse_args(["--quick", "--cuda-graphs", "on", "--warmup", "3",
                                      "--steps", "5"])
    config = config_from_args(args)
    assert (config.cuda_graphs, config.warmup, config.steps, config.quick) == ("on", 3, 5, True)
    with pytest.raises(ValueError, match="cuda_graphs must be one of"):
        BenchConfig(cuda_graphs="sometimes")
