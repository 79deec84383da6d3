"""Shared fixtures: the suite built once per test session for the two reference targets."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kstrata.ir.target import Target

REFERENCE_TARGETS = ("cuda:90", "hip:gfx942")


@pytest.fixture(scope="session", autouse=True)
def engine_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The candidate engine's cache for this session (never the user's ~/.cache/kstrata/engine)."""
    root = tmp_path_factory.mktemp("engine-cache")
    saved = os.environ.get("KSTRATA_ENGINE_CACHE")
    os.environ["KSTRATA_ENGINE_CACHE"] = str(root)
    yield root
    if saved is None:
        os.environ.pop("KSTRATA_ENGINE_CACHE", None)
    else:
        os.environ["KSTRATA_ENGINE_CACHE"] = saved


@pytest.fixture(scope="session", autouse=True)
def zygote_workers() -> Iterator[None]:
    """kstrata's Python workers forked from a process with torch imported (`backends/zygote.py`): most of
    a small evaluation's time on this 2-core machine is each worker importing torch. `KSTRATA_ZYGOTE=0
    make test` runs every worker the plain way; the zygote's own tests set it per test."""
    saved = os.environ.get("KSTRATA_ZYGOTE")
    os.environ.setdefault("KSTRATA_ZYGOTE", "1")
    yield
    if saved is None:
        os.environ.pop("KSTRATA_ZYGOTE", None)


@pytest.fixture(autouse=True)
def environment_restored() -> Iterator[None]:
    """Each test starts from the session's environment. What a test, or a library it calls, writes into
    os.environ would otherwise reach every later test on the worker and every process they start (Inductor
    sets TORCHINDUCTOR_CACHE_DIR the first time it picks its cache); and each new environment costs the
    worker a zygote of its own, until it has `_MAX_ZYGOTES` and starts every later worker the plain way."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


@pytest.fixture(scope="session")
def suite_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache root holding the whole suite compiled for cuda:90 and hip:gfx942, built once per test session
    and shared by every xdist worker. Each target has its own file lock: a worker takes the first target
    nobody is building, so two workers build the two targets at once instead of one waiting for both;
    then each waits for what is left. Tests only read it: `suite_subset` copies the entries a test may
    write beside."""
    from filelock import FileLock, Timeout

    from kstrata.testsuite.kernels.build import build_suite

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = shared / "suite-cache"

    def build(spelling: str) -> None:  # under its lock
        done = shared / f"suite-cache.{spelling.replace(':', '-')}.complete"
        if not done.exists():
            # one root for both: its index is merged under a lock (update_index)
            result = build_suite(Target.parse(spelling), root)
            assert not result.errors, f"suite kernels failed to compile for {spelling}: {result.errors}"
            done.write_text("ok\n")

    locks = {t: FileLock(str(shared / f"suite-cache.{t.replace(':', '-')}.lock")) for t in REFERENCE_TARGETS}
    waiting = []
    for spelling, lock in locks.items():
        try:
            lock.acquire(timeout=0)
        except Timeout:  # another worker is building it: build the next one meanwhile
            waiting.append(spelling)
            continue
        try:
            build(spelling)
        finally:
            lock.release()
    for spelling in waiting:
        with locks[spelling]:
            build(spelling)
    return root


def computed_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """A directory `name` that `make` fills once per test session, shared by every xdist worker and by every
    later setup of the fixture that asks for it (an xdist worker tears module fixtures down whenever its
    queue runs empty, and sets them up again for the next test of the module)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out, done = shared / name, shared / f"{name}.complete"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            make(out)
            done.write_text("ok\n")
    return out


def copy_suite_subset(suite_cache: Path, dest: Path, names: tuple[str, ...],
                      targets: tuple[str, ...] = REFERENCE_TARGETS) -> Path:
    """A new cache root with the suite kernels `names` for `targets`, copied from the shared suite cache
    (with their index records), so a test gets its own small cache without compiling anything."""
    from kstrata.ir.triton_layout import read_index, update_index

    index = read_index(suite_cache)
    chosen = {key: rec for key, rec in index.items()
              if rec.get("suite_kernel") in names and rec.get("target") in targets}
    missing = {(n, t) for n in names for t in targets} - {(r["suite_kernel"], r["target"]) for r in chosen.values()}
    assert not missing or all(t.startswith("hip") for _, t in missing), f"not in the suite cache: {missing}"
    dest.mkdir(parents=True, exist_ok=True)
    for key in chosen:
        shutil.copytree(suite_cache / key, dest / key)
    update_index(dest, chosen)
    return dest


def has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available()) and torch.version.hip is None
    except Exception:
        return False


def assert_schedules_match(task: Path, m: Any, tmp_path: Path, first: list[dict[str, Any]], *, device: str = "cuda",
                           sample: int = 8, noncontiguous: tuple[bool, ...] = (False, True),
                           policy: str = "strict") -> None:
    """`first`, the match's hinted schedules and about `sample` schedules of its space, each rendered and compared
    with the task's Model on `device` (`cpucheck.compare`: float64-anchored), on contiguous and strided inputs."""
    from kstrata.agents.templates.cpucheck import compare

    configs = m.configs()
    for i, params in enumerate([*first, *m.hint_params(), *configs[1::max(1, len(configs) // sample)]]):
        cand = tmp_path / f"model_new_{i}.py"
        cand.write_text(m.render(params))
        for strided in noncontiguous:
            r = compare(task, cand, device=device, noncontiguous=strided, policy=policy)
            assert r["ok"], (params, strided, r)


def assert_rewrite_bit_exact_in_interpreter(kernel: Any, spec: str, tmp_path: Path, target: str = "cuda:90") -> Any:
    """`kernel` (a suite kernel) rewritten by the TTIR pipeline `spec` and rebuilt: it changes from TTIR down,
    declares no tolerance, and `verify` on the CPU passes it with every interpreter run passing. Returns the
    original bundle and the rewritten one."""
    from kstrata.backends.verify import verify
    from kstrata.passes.pipeline import parse_pipeline, run_pipeline
    from kstrata.testsuite.kernels.build import bundle_for
    from kstrata.testsuite.kernels.launch import suite_launch_record

    original = bundle_for(kernel, Target.parse(target))
    pipeline = parse_pipeline(spec)
    outcome = run_pipeline(original, pipeline)
    assert outcome.changed and outcome.first_changed == "ttir", [r.reason for r in outcome.records]
    assert pipeline.tolerance() is None  # bit-exact: no tolerance declared
    assert "tt.get_num_programs" in outcome.bundle.text("ttgir")  # the rebuilt level carries the renumbering
    record = suite_launch_record(kernel, target, snapshot_dir=tmp_path)
    report = verify(original, outcome.bundle, record, seeds=1, device="cpu", timeout=300)
    interpreted = [c for c in report.checks if c.name.startswith("interpreter")]
    assert interpreted and all(c.verdict == "pass" for c in interpreted), [c.__dict__ for c in interpreted]
    assert report.ok, [c.__dict__ for c in report.checks if c.verdict == "fail"]
    return original, outcome.bundle
