"""Edit distance, WER bookkeeping and greedy CTC collapse."""

import torch

from recipes.wer import ErrorCounts, edit_distance, greedy_ctc


def test_edit_distance_counts_each_operation() -> None:
    assert edit_distance([], []) == 0
    assert edit_distance(["a", "b", "c"], ["a", "b", "c"]) == 0
    assert edit_distance(["a", "b", "c"], ["a", "x", "c"]) == 1  # substitution
    assert edit_distance(["a", "b", "c"], ["a", "c"]) == 1  # deletion
    assert edit_distance(["a", "b", "c"], ["a", "b", "b", "c"]) == 1  # insertion
    assert edit_distance([], ["a", "b"]) == 2
    assert edit_distance(list("kitten"), list("sitting")) == 3


def test_error_counts_wer_and_cer() -> None:
    counts = ErrorCounts()
    counts.add("the cat sat", "the cat sat")
    counts.add("on the mat", "on a mat today")
    assert (counts.word_errors, counts.words, counts.utterances) == (2, 6, 2)
    assert abs(counts.wer - 100 * 2 / 6) < 1e-9
    assert counts.char_errors == edit_distance(list("on the mat"), list("on a mat today"))


def test_greedy_ctc_merges_repeats_drops_blanks_and_respects_lengths() -> None:
    frames = [0, 3, 3, 0, 3, 4, 4, 0, 5, 5]  # -> 3 3 4 5; the last two frames are padding
    log_probs = torch.full((1, len(frames), 6), -10.0)
    log_probs[0, torch.arange(len(frames)), torch.tensor(frames)] = 0.0
    assert greedy_ctc(log_probs, torch.tensor([10])) == [[3, 3, 4, 5]]
    assert greedy_ctc(log_probs, torch.tensor([8])) == [[3, 3, 4]]
