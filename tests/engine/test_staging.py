"""StepStaging: a step's windows land in persistent buffers in the model's compute dtype, equal
to the float32 windows cast, pad rows and short rows zero past their frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oasr.audio import FeatureWindow
from oasr.engine.runner.staging import StepStaging


def _window(frames: int, dim: int, seed: int) -> FeatureWindow:
    feats = np.random.default_rng(seed).standard_normal((frames, dim)).astype(np.float32)
    return FeatureWindow(feats=feats, index=0, start_frame=0, num_output_frames=frames // 2,
                         is_last=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_staged_features_are_the_windows_in_the_compute_dtype(dtype: torch.dtype) -> None:
    cpu = torch.device("cpu")
    staging = StepStaging(max_rows=4, max_frames=6, feat_dim=5, device=cpu, dtype=dtype)
    # a first, fuller step leaves values everywhere the next one must overwrite or zero
    staging.upload([_window(6, 5, s) for s in range(4)], [0, 1, 2, 3], [0, 1, 2, 3], 6)
    windows = [_window(6, 5, 10), _window(3, 5, 11)]  # a full row and a last, short chunk
    inputs = staging.upload(windows, [4, 7], [2, 0, 3], frames=6)  # row 2: a pad row
    assert inputs.feats.dtype == dtype and inputs.feats.shape == (3, 6, 5)
    assert staging.owns(inputs.feats) and staging.owns(inputs.slots)
    want = torch.zeros(3, 6, 5)
    want[0] = torch.from_numpy(windows[0].feats)
    want[1, :3] = torch.from_numpy(windows[1].feats)
    assert torch.equal(inputs.feats, want.to(dtype))  # the cast rounds as .to() does
    assert inputs.feat_lens.tolist() == [6, 3, 6] and inputs.offsets.tolist() == [4, 7, 0]
    assert inputs.slots.tolist() == [2, 0, 3]


def test_a_float32_cpu_staging_has_one_feature_buffer() -> None:
    """In float32 on CPU the model reads the buffer the windows were written into."""
    staging = StepStaging(2, 4, 3, torch.device("cpu"))
    inputs = staging.upload([_window(4, 3, 0)], [0], [0], 4)
    assert inputs.feats.data_ptr() == staging._host_feats.data_ptr()
    bf16 = StepStaging(2, 4, 3, torch.device("cpu"), torch.bfloat16)
    assert bf16.upload([_window(4, 3, 0)], [0], [0], 4).feats.data_ptr() != \
        bf16._host_feats.data_ptr()
