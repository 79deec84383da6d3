"""Replay inputs (random, edge values, snapshots), the output comparison every dynamic check uses, and
declared tolerances."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kstrata.backends.replay import clone_args, compare_outputs, input_sets, replay_args
from kstrata.ir.launch import LaunchRecord, ScalarArg, TensorArg
from kstrata.ir.tolerance import Tolerance, ToleranceError


def _record(*args: TensorArg | ScalarArg) -> LaunchRecord:
    return LaunchRecord("k", "cuda:90", (4, 1, 1), tuple(args))


def test_tolerance_spelling_round_trips_and_bad_spellings_are_named() -> None:
    tol = Tolerance.parse("rtol=1e-05,atol=1e-06")
    assert (tol.rtol, tol.atol, tol.ulp) == (1e-5, 1e-6, 0) and Tolerance.parse(tol.spelling()) == tol
    assert Tolerance.parse("ulp=2").ulp == 2 and Tolerance.parse("exact").exact
    with pytest.raises(ToleranceError, match="'rtl=1'"):
        Tolerance.parse("rtl=1")
    with pytest.raises(ToleranceError, match="not a number"):
        Tolerance.parse("ulp=two")
    assert Tolerance(rtol=1e-5).combine(Tolerance(ulp=3, why="x")) == Tolerance(3, 1e-5, 0.0, "x")


def test_input_sets_cover_edge_values_by_type() -> None:
    rec = _record(TensorArg("x", "float16", (1000,), (1,)), TensorArg("idx", "int32", (1000,), (1,)),
                  ScalarArg("n", "i32", 1000))
    modes = [s.mode for s in input_sets(rec, 2)]
    assert modes == ["random", "random", "edge-float", "edge-int"]
    floats = replay_args(rec, "cpu", 1000, mode="edge-float")["x"].to(torch.float64)
    assert bool(torch.isnan(floats).any()) and bool(torch.isinf(floats).any())
    negative_zero = (floats == 0) & (torch.signbit(floats))
    assert bool(negative_zero.any())
    denormal = (floats != 0) & (floats.abs() < torch.finfo(torch.float16).tiny)
    assert bool(denormal.any())
    ints = replay_args(rec, "cpu", 2000, mode="edge-int")["idx"]
    assert int(ints.min()) == torch.iinfo(torch.int32).min and int(ints.max()) == torch.iinfo(torch.int32).max
    # the random sets keep integers small (indices stay in bounds) and floats finite
    plain = replay_args(rec, "cpu", 0)
    assert int(plain["idx"].max()) < 8 and bool(torch.isfinite(plain["x"].float()).all())
    assert plain["n"] == 1000


def test_snapshot_inputs_are_used(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    rec = _record(TensorArg("x", "float32", (2, 3), (3, 1), snapshot="x.npy"))
    assert input_sets(rec, 1, tmp_path)[0].mode == "snapshot"
    x = replay_args(rec, "cpu", mode="snapshot", base_dir=tmp_path)["x"]
    assert x.flatten().tolist() == [0, 1, 2, 3, 4, 5]


def test_strided_views_are_filled_and_cloned_with_their_storage() -> None:
    rec = _record(TensorArg("x", "float32", (3, 2), (1, 4), storage_offset=2, storage_numel=20))
    x = replay_args(rec, "cpu", 0)["x"]
    assert x.stride() == (1, 4) and x.storage_offset() == 2 and x.untyped_storage().nbytes() == 80
    y = clone_args({"x": x})["x"]
    assert y.stride() == x.stride() and y.storage_offset() == 2 and torch.equal(x, y)
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_compare_is_bitwise_nan_agnostic_and_honours_tolerances() -> None:
    a = torch.tensor([1.0, float("nan"), 0.0, 3.0])
    b = a.clone()
    b[1] = torch.tensor(0x7FC00001, dtype=torch.int32).view(torch.float32)  # another NaN payload
    assert compare_outputs({"o": a}, {"o": b}, ["o"]) is None
    b[2] = -0.0
    diff = compare_outputs({"o": a}, {"o": b}, ["o"])
    assert diff is not None and diff["element"] == 2 and diff["b_bits"] == "0x80000000"
    c = a.clone()
    c[3] = torch.nextafter(torch.tensor(3.0), torch.tensor(4.0))
    assert compare_outputs({"o": a}, {"o": c}, ["o"]) is not None
    assert compare_outputs({"o": a}, {"o": c}, ["o"], Tolerance(ulp=1)) is None
    assert compare_outputs({"o": a}, {"o": c}, ["o"], Tolerance(rtol=1e-6)) is None
    d = a.clone()
    d[3] = float("inf")  # an infinity is never "close"
    assert compare_outputs({"o": a}, {"o": d}, ["o"], Tolerance(rtol=1.0, atol=1e30)) is not None
    e = a.clone()
    e[0] = float("nan")  # nor is a NaN where the original has a number
    assert compare_outputs({"o": a}, {"o": e}, ["o"], Tolerance(rtol=1.0)) is not None
    i, j = torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4])
    assert compare_outputs({"o": i}, {"o": j}, ["o"], Tolerance(rtol=1.0))["element"] == 2  # type: ignore[index]


@pytest.mark.parametrize("chunk", [1, 3, 4, 1000])
def test_compare_in_chunks_finds_the_first_mismatch_and_counts_them_all(chunk: int) -> None:
    a = torch.arange(10, dtype=torch.float32)
    b = a.clone()
    b[[4, 5, 9]] = -1.0  # in the second chunk (of 3 or 4) and the last
    diff = compare_outputs({"o": a}, {"o": b}, ["o"], chunk=chunk)
    assert diff is not None and diff["element"] == 4 and diff["mismatches"] == 3 and diff["a"] == 4.0
    assert compare_outputs({"o": a}, {"o": b}, ["o"], Tolerance(atol=6.0), chunk=chunk)["element"] == 9  # type: ignore[index]
    assert compare_outputs({"o": a}, {"o": a.clone()}, ["o"], chunk=chunk) is None


def test_compare_sees_writes_outside_the_view() -> None:
    a, b = torch.zeros(8)[:4], torch.zeros(8)[:4]  # same layout, separate storages
    torch.empty(0).set_(b.untyped_storage())[6] = 1.0  # past the end of b's view
    diff = compare_outputs({"o": a}, {"o": b}, ["o"])
    assert diff is not None and diff["element"] == 6


def test_written_tensors_are_poisoned_in_the_random_sets_only(tmp_path: Path) -> None:
    np.save(tmp_path / "o.npy", np.zeros(3, dtype=np.float32))
    rec = _record(TensorArg("o", "float32", (3,), (1,), written=True, snapshot="o.npy"),
                  TensorArg("n", "int16", (3,), (1,), written=True), TensorArg("x", "float32", (3,), (1,)))
    random = replay_args(rec, "cpu", 0)
    assert bool(torch.isnan(random["o"]).all()) and random["n"].view(torch.uint8).eq(0x5A).all()
    assert bool(torch.isfinite(random["x"]).all())  # inputs are not poisoned
    assert replay_args(rec, "cpu", mode="snapshot", base_dir=tmp_path)["o"].tolist() == [0.0, 0.0, 0.0]
    assert not bool(torch.isnan(replay_args(rec, "cpu", 2000, mode="edge-int")["o"]).all())
