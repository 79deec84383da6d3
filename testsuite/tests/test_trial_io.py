"""Trial files of eval's workers (`kstrata.agents.trial_io`): large tensors as raw bytes beside a
`torch.save` structure, mapped back; what the candidate's process wrote is checked before it is used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kstrata.agents import trial_io
from kstrata.agents.trial_io import TrialFileError, load_trial, save_trial


@pytest.fixture
def small_raw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial_io, "RAW_BYTES", 1024)
    monkeypatch.setattr(trial_io, "_CHUNK", 4096)  # several chunks, several threads


def test_large_tensors_go_raw_and_come_back_equal(tmp_path: Path, small_raw: None) -> None:
    big = torch.randn(5000)
    half = torch.randn(3000).to(torch.bfloat16)  # no numpy dtype: written as bytes
    obj = {"input_digest": "abc", "outputs": [big, 3, None, (half, torch.arange(4))], "outputs64": [big.double()],
           "fp64_note": ""}
    path = tmp_path / "trial0.pt"
    save_trial(obj, path)
    raws = sorted(p.name for p in tmp_path.glob("*.raw"))
    assert raws == ["trial0.pt.0.raw", "trial0.pt.1.raw", "trial0.pt.2.raw"]  # the small arange stays inside
    back = load_trial(path)
    assert back["input_digest"] == "abc" and back["outputs"][1:3] == [3, None] and back["fp64_note"] == ""
    assert torch.equal(back["outputs"][0], big) and torch.equal(back["outputs64"][0], big.double())
    h, r = back["outputs"][3]
    assert h.dtype == torch.bfloat16 and torch.equal(h, half) and torch.equal(r, torch.arange(4))
    assert not list(tmp_path.iterdir())  # every file removed, the mapped tensors still readable
    assert float(back["outputs"][0].sum()) == float(big.sum())


@pytest.mark.parametrize("damage", ["short", "missing", "bad-name", "bad-dtype"])
def test_a_damaged_trial_file_is_an_error(tmp_path: Path, small_raw: None, damage: str) -> None:
    path = tmp_path / "trial0.pt"
    save_trial({"outputs": [torch.randn(1000)]}, path)
    raw = tmp_path / "trial0.pt.0.raw"
    if damage == "short":
        raw.write_bytes(raw.read_bytes()[:-4])
    elif damage == "missing":
        raw.unlink()
    else:  # a structure naming another file, or a dtype outside the list
        marker = {"__kstrata_raw__": "../../etc/passwd" if damage == "bad-name" else "trial0.pt.0.raw",
                  "dtype": "float32" if damage == "bad-name" else "object", "shape": [1000]}
        torch.save({"outputs": [marker]}, path)
    with pytest.raises(TrialFileError):
        load_trial(path)
    assert not path.exists() and not raw.exists()


def test_small_data_is_a_plain_torch_save(tmp_path: Path) -> None:
    path = tmp_path / "t.pt"
    save_trial({"outputs": [torch.ones(3)], "meta": json.dumps({"a": 1})}, path)
    assert not list(tmp_path.glob("*.raw"))
    assert torch.equal(torch.load(path, weights_only=True)["outputs"][0], torch.ones(3))


def test_a_device_tensor_is_copied_straight_into_its_raw_file(tmp_path: Path, small_raw: None) -> None:
    """The device path (copy into the mapped file, chunk by chunk) runs the same on CPU tensors here."""
    x = torch.randn(7001).to(torch.bfloat16)
    trial_io._write_raw_from_device(x[::2], tmp_path / "a.raw")  # non-contiguous source, several chunks
    assert (tmp_path / "a.raw").stat().st_size == x[::2].numel() * 2
    back = torch.from_file(str(tmp_path / "a.raw"), shared=False, size=x[::2].numel(), dtype=torch.bfloat16)
    assert torch.equal(back, x[::2])
    trial_io._write_raw_from_device(torch.empty(0), tmp_path / "e.raw")
    assert (tmp_path / "e.raw").stat().st_size == 0
