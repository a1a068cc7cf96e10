"""Tests of profiler.text: the standard library's sources as a next-character corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipeplan.core.errors import TrainConfigError  # noqa: E402
from pipeplan.models.zoo.text import encode, python_corpus, source_files, windows  # noqa: E402

pytestmark = pytest.mark.torch  # every test here needs torch (make test-fast leaves them out)


def test_windows_shift_the_target_by_one_character() -> None:
    """Ten ids, windows of 3: three whole windows, each target the input moved one place on."""
    inputs, targets = windows(torch.arange(10), 3, limit=100)
    assert inputs.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert targets.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert windows(torch.arange(10), 3, limit=2)[0].shape == (2, 3)
    with pytest.raises(TrainConfigError, match="holds 3 characters, too few for one window of 3"):
        windows(torch.arange(3), 3, limit=1)


def test_encode_keeps_ascii_and_maps_other_bytes_to_zero() -> None:
    assert encode(b"a\n" + bytes([200])).tolist() == [97, 10, 0]


def test_every_tenth_file_is_held_out_and_tests_are_skipped(tmp_path: Path) -> None:
    """Twenty files in sorted order: the 10th and 20th go to the test split; a `test` folder is not read."""
    for i in range(20):
        (tmp_path / f"m{i:02d}.py").write_text(chr(ord("a") + i) * 40)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "t.py").write_text("z" * 40)
    assert len(source_files(str(tmp_path))) == 20
    (train, _), (test, _) = python_corpus(seq_len=8, train_windows=1000, test_windows=1000, root=str(tmp_path))
    held = {chr(c) for c in test.flatten().tolist()}
    assert held == {"j", "t"}
    assert not held & {chr(c) for c in train.flatten().tolist()} and "z" not in {chr(c) for c in train.flatten().tolist()}


def test_the_real_corpus_is_deterministic_and_ascii() -> None:
    """This machine's standard library gives the requested windows, the same twice, ids below 128."""
    (a, b), (c, d) = python_corpus(seq_len=32, train_windows=64, test_windows=16)
    assert a.shape == b.shape == (64, 32) and c.shape == d.shape == (16, 32)
    assert int(a.max()) < 128 and torch.equal(a[:, 1:], b[:, :-1])
    assert torch.equal(python_corpus(seq_len=32, train_windows=64, test_windows=16)[0][0], a)


def test_a_missing_library_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(TrainConfigError, match=r"standard library.s sources; .* is not a folder"):
        source_files(str(tmp_path / "absent"))
