"""kstrata optimize's end of a task, as the H200 benchmark of 2026-12-01 exposed it: the roofline explains a
large speedup (or flags it), a rejected output falls back to the best measured baseline, the deadline
(`--minutes`) covers the final re-evaluation, every compiler configuration is one torch.compile accepts,
and the benchmark's per-task limits. Fake evaluators and a fake clock: no process runs."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kstrata.agents import roofline
from kstrata.agents.optimize.search import Options, TaskSearch
from kstrata.agents.optimize.state import CheckResult, Measurement
from kstrata.testsuite.tests.test_optimize import TINY, FakeEvaluator, FakeVerdict, _rule_us, _task_info


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """report.md without its PNG plots (test_optimize.py tests them): a second per search saved."""
    from kstrata.agents.optimize import report

    monkeypatch.setattr(report, "_plots", lambda search, out: [])


CEILINGS = roofline.Ceilings(device="fake", date="2026-12-01", copy_bytes_per_s=4e12,
                             matmul_flops_per_s={"float32": 50e12})


class _Spec:
    """A memory-bound task whose speed of light is `sol_us` at CEILINGS (LayerNorm over three dims: 140.8 us)."""

    def __init__(self, sol_us: float = 140.8, flops: int = 0) -> None:
        self.flops, self.min_bytes, self.dtypes, self.flops_source = flops, int(sol_us * 1e-6 * 4e12), ("float32",), "counted"
        self.flops_by_kind = (("pointwise", flops),)


# ---------------------------------------------------------------------------------------------------
# 1. The suspicion rule uses the roofline
# ---------------------------------------------------------------------------------------------------
def test_roofline_explains_a_large_win_over_a_slow_baseline() -> None:
    spec = _Spec()
    # the H200 case: eager 8392 us (1.7% of SOL), the template 264 us (53%): 31.8x, explained and accepted
    p = roofline.assess(spec, CEILINGS, 264e-6, 8392 / 264, baseline_seconds=8392e-6, baseline="eager")
    assert not p.flags
    assert p.explanations == ("31.8x explained by the roofline: eager at 1.7% of SOL, candidate at 53%",)
    assert p.baseline_fraction == pytest.approx(140.8 / 8392, rel=1e-3)
    assert p.to_json()["explanations"] == list(p.explanations)
    # faster than light: flagged twice (the 10x rule does not explain it away)
    fast = roofline.assess(spec, CEILINGS, 100e-6, 83.9, baseline_seconds=8392e-6, baseline="eager")
    assert len(fast.flags) == 2 and "faster than speed of light" in fast.flags[0]
    assert "above 10x" in fast.flags[1] and "faster than speed of light" in fast.flags[1] and not fast.explanations
    # no baseline time, or no roofline for the task (no FLOPs, no bytes): the 10x rule stands
    assert "no roofline" in roofline.assess(spec, CEILINGS, 264e-6, 31.8).flags[0]
    empty = _Spec(0.0)
    assert "no roofline" in roofline.assess(empty, CEILINGS, 264e-6, 31.8, baseline_seconds=8392e-6).flags[0]
    # the ratio claimed is more than the fractions allow: the baseline was placed at 4000 us (3.5% of SOL),
    # so 0.53 / 0.035 = 15.2x at most, and a claimed 31.8x is flagged
    odd = roofline.assess(spec, CEILINGS, 264e-6, 31.8, baseline_seconds=4000e-6, baseline="eager")
    assert len(odd.flags) == 1 and "more than the roofline explains" in odd.flags[0] and "15.2x" in odd.flags[0]
    # within the noise margin: explained
    allowed = 4000 / 264
    assert not roofline.assess(spec, CEILINGS, 264e-6, allowed * (1 + 0.9 * roofline.EXPLAINED_MARGIN),
                               baseline_seconds=4000e-6).flags
    assert roofline.assess(spec, CEILINGS, 264e-6, allowed * (1 + 1.1 * roofline.EXPLAINED_MARGIN),
                           baseline_seconds=4000e-6).flags
    # below 10x nothing needs explaining
    small = roofline.assess(spec, CEILINGS, 264e-6, 9.0)
    assert not small.flags and not small.explanations


def _ceilings_for(sol_us: float) -> roofline.Ceilings:
    """Ceilings at which the tiny ReLU task's speed of light is `sol_us` (memory-bound)."""
    spec = _task_info(TINY / "01_relu_small.py").spec
    return roofline.Ceilings(device="fake", date="2026-12-01", copy_bytes_per_s=spec.min_bytes / (sol_us * 1e-6),
                             matmul_flops_per_s={"float32": 1e18})


def _search(tmp_path: Path, ev: FakeEvaluator, **kw: Any) -> TaskSearch:
    opts = Options(budget=kw.pop("budget", 4), device="cuda", spaces=kw.pop("spaces", ("compiler",)), ncu=False,
                   plugins=False, progress=kw.pop("progress", lambda m: None), **kw)
    return TaskSearch(TINY / "01_relu_small.py", tmp_path / "out", opts, ev)  # type: ignore[arg-type]


@pytest.mark.parametrize(("cand_us", "accepted"), [(6.0, True), (4.0, False)])
def test_search_accepts_an_explained_large_win_and_rejects_one_faster_than_light(tmp_path: Path, cand_us: float,
                                                                                 accepted: bool) -> None:
    # SOL 5 us; compile (the best baseline) 90 us = 5.6% of SOL; a candidate at 6 us (83%) is 15x and explained,
    # one at 4 us is faster than light
    ev = FakeEvaluator(tmp_path, lambda src: cand_us if "coordinate_descent_tuning" in src else _rule_us(src))
    s = _search(tmp_path, ev, budget=1, ceilings=_ceilings_for(5.0))
    s.run()
    n = next(n for n in s.nodes.values() if n.space == "compiler")
    assert n.speedup == pytest.approx(90 / cand_us)
    if accepted:
        assert n.status == "incumbent" and "explained by the roofline: baseline compile at 5.6% of SOL" in n.note
        cand_events = [e for e in s.traj.replay() if e["type"] == "candidate" and e["key"] == n.key]
        assert "explained by the roofline" in cand_events[-1]["note"]
    else:
        assert n.status == "rejected" and "faster than speed of light" in n.note and s.incumbent_key == s.base_key


# ---------------------------------------------------------------------------------------------------
# 2. The fallback is the best measured baseline, then the next
# ---------------------------------------------------------------------------------------------------
class _RejectingFinals(FakeEvaluator):
    """The first `n_rejected` final re-evaluations reject (as the 10x rule did on the H200)."""

    def __init__(self, workdir: Path, us: Any, n_rejected: int) -> None:
        super().__init__(workdir, us)
        self.n_rejected = n_rejected
        self.final_sources: list[str] = []

    def final(self, task: Path, cand: Path, *, seed: int, ceilings: Any = None, **kw: Any) -> FakeVerdict:
        self.finals += 1
        self.final_sources.append(cand.read_text())
        ok = self.finals > self.n_rejected
        return FakeVerdict(ok, "correct (fake)" if ok else "correct, but flagged (fake)")


def test_final_rejection_falls_back_to_the_fastest_measured_baselines_in_order(tmp_path: Path) -> None:
    # eager 100 us, compile 90, max-autotune 95; the search's incumbent (coordinate descent, 60 us) and then the
    # compile baseline are rejected: the next is max-autotune (95 us), not eager (100 us)
    said: list[str] = []
    ev = _RejectingFinals(tmp_path, _rule_us, n_rejected=2)
    s = _search(tmp_path, ev, budget=2, progress=said.append)
    r = s.run()
    assert ev.finals == 3 and s.final is not None and s.final["accepted"]
    assert s.incumbent.candidate.description == "baseline compile-max-autotune" and r.final_ok
    assert [x["description"] for x in s.final["rejected"]][1] == "baseline compile"
    falls = [m for m in said if "falling back to" in m]
    assert len(falls) == 2 and "falling back to baseline compile, the fastest" in falls[0]
    assert "REJECTED baseline compile" in falls[1] and "falling back to baseline compile-max-autotune" in falls[1]
    assert "this file is baseline compile-max-autotune" in (tmp_path / "out" / "model_new.py").read_text()
    # every baseline rejected: the run says so and stops falling back (no loop, no eager twice)
    ev2 = _RejectingFinals(tmp_path, _rule_us, n_rejected=10)
    s2 = _search(tmp_path / "b", ev2, budget=1)
    s2.run()
    assert s2.final is not None and not s2.final["accepted"] and ev2.finals == 4  # the incumbent, then 3 baselines
    assert len({x["key"] for x in s2.final["rejected"]}) == 3


# ---------------------------------------------------------------------------------------------------
# 3. The deadline covers the final re-evaluation
# ---------------------------------------------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _SlowEvaluator(FakeEvaluator):
    """Every check costs `check_s` and every final `final_s` seconds of a fake clock; checks are reported
    with their cost (as the real evaluator measures them)."""

    def __init__(self, workdir: Path, clock: _Clock, check_s: float, final_s: float) -> None:
        super().__init__(workdir, _rule_us)
        self.clock, self.check_s, self.final_s = clock, check_s, final_s
        self.limits: list[float | None] = []
        self.final_at: list[float] = []

    def check(self, task: Path, cand: Path, **kw: Any) -> CheckResult:
        self.limits.append(kw.get("timeout_s"))
        self.clock.t += self.check_s
        r = super().check(task, cand)
        return CheckResult(r.ok, r.reason, r.failure, r.eval_policy, self.check_s)

    def final(self, task: Path, cand: Path, *, seed: int, ceilings: Any = None, **kw: Any) -> FakeVerdict:
        self.clock.t += self.final_s
        self.final_at.append(self.clock.t)
        return super().final(task, cand, seed=seed, ceilings=ceilings)


def test_deadline_stops_the_search_in_time_for_the_final_re_evaluation(tmp_path: Path) -> None:
    from kstrata.agents.optimize.search import MIN_CHILD_TIMEOUT_S

    clock = _Clock()
    ev = _SlowEvaluator(tmp_path, clock, check_s=10.0, final_s=12.0)
    s = _search(tmp_path, ev, budget=50, minutes=2.0, clock=clock, spaces=("compiler", "library"))
    r = s.run()
    # baselines 30 s, candidates 10 s each; the final (12 s, estimated 1.2 x 10 + 5) still fits in 120 s
    assert s.elapsed() <= 120.0 and ev.final_at and ev.final_at[-1] - 1000.0 <= 120.0 - 10.0
    assert r.cut_short and s.stop_reason.startswith("cut short by the deadline") and r.final_ok
    assert 1 <= r.candidates < 50
    stop = next(e for e in s.traj.replay() if e["type"] == "stop")
    assert stop["deadline"] is True and stop["final_reserve_s"] > 0
    assert "cut short by the deadline" in (tmp_path / "out" / "report.md").read_text()
    # the candidates judged near the deadline had their processes' time capped, never below the minimum
    caps = [x for x in ev.limits if x is not None]
    assert caps and min(caps) >= MIN_CHILD_TIMEOUT_S and max(caps) < s.opts.timeout_s


def test_a_fallback_that_does_not_fit_before_the_deadline_is_written_but_not_accepted(tmp_path: Path) -> None:
    clock = _Clock()
    ev = _SlowEvaluator(tmp_path, clock, check_s=10.0, final_s=25.0)  # the final takes longer than estimated
    ev.final_ok = False  # the incumbent's final re-evaluation rejects it
    s = _search(tmp_path, ev, budget=50, minutes=2.0, clock=clock)
    r = s.run()
    assert ev.finals == 1 and s.final is not None and not r.final_ok and s.final["deadline"] is True
    assert "was not re-evaluated" in s.final["reason"] and "baseline compile" in s.final["reason"]
    assert s.incumbent.candidate.description == "baseline compile" and s.elapsed() <= 120.0
    assert "this file is baseline compile" in (tmp_path / "out" / "model_new.py").read_text()


def test_without_time_for_any_candidate_the_search_is_skipped_and_the_final_still_runs(tmp_path: Path) -> None:
    clock = _Clock()
    ev = _SlowEvaluator(tmp_path, clock, check_s=15.0, final_s=12.0)
    s = _search(tmp_path, ev, budget=5, minutes=1.0, clock=clock)  # baselines take 45 of 60 s
    r = s.run()
    assert r.candidates == 0 and r.cut_short and r.final_ok and s.elapsed() <= 60.0


def test_a_run_stopped_before_its_final_leaves_the_verified_incumbent(tmp_path: Path) -> None:
    ev = FakeEvaluator(tmp_path, _rule_us)
    s = _search(tmp_path, ev, budget=2)

    def killed() -> None:
        raise KeyboardInterrupt  # the bench's kill between the search and the final, as far as the task can tell

    s.step_final = killed  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        s.run()
    out = tmp_path / "out"
    src = (out / "model_new.py").read_text()
    assert "PROVISIONAL: the search's incumbent, 1.500x over the best baseline" in src
    assert "coordinate_descent_tuning" in src
    r = json.loads((out / "result.json").read_text())
    assert r["status"] == "unfinished" and r["chosen_space"] == "compiler" and not r["final_ok"]
    assert r["speedup"] == pytest.approx(1.5)


# ---------------------------------------------------------------------------------------------------
# 4. Every compiler configuration the proposers emit is one torch.compile accepts
# ---------------------------------------------------------------------------------------------------
def _compile_calls(source: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and ast.unparse(n.func) == "torch.compile"]


def test_every_compiler_candidate_is_accepted_by_torch_compile(tmp_path: Path) -> None:
    import torch

    from kstrata.agents.optimize.compiler import OPTION_SETS, InductorOptions
    from kstrata.agents.optimize.configs import baseline_params, render
    from kstrata.agents.optimize.contract import Degeneracy, make_contract
    from kstrata.agents.optimize.state import Node, SearchMemory, SearchState
    from kstrata.agents.tasks import import_task_module

    info = _task_info(TINY / "01_relu_small.py")
    contract = make_contract(info.spec, "strict", Degeneracy(False, ()))
    proposer = InductorOptions()
    seen: dict[str, str] = {}  # the torch.compile call -> a source that makes it
    frontier = []
    for b in ("eager", "compile", "compile-max-autotune"):
        c = render(info, baseline_params(b), space="baseline", proposer=f"baseline:{b}")
        frontier.append(Node(c, 0, 0, 0.0, status="incumbent"))
    sets_seen: set[str] = set()
    for _depth in range(2):  # drafts from every baseline, and one refinement of each
        nxt = []
        for parent in frontier:
            state = SearchState(info, contract, "strict", "cuda", [], parent, {}, SearchMemory(), frozenset(),
                                parent=parent, space="compiler")
            for c in proposer.propose(state):
                sets_seen.update(c.params["compiler_sets"])
                calls = _compile_calls(c.source)
                assert len(calls) == 1, c.description
                seen.setdefault(ast.unparse(calls[0]), c.source)
                nxt.append(Node(c, 0, parent.depth + 1, 0.0, status="measured"))
        frontier = nxt
    assert sets_seen == set(OPTION_SETS)
    tiny = torch.nn.Linear(4, 4)
    for i, (call, source) in enumerate(sorted(seen.items())):
        path = tmp_path / f"c{i}.py"
        path.write_text(source)
        mod = import_task_module(path)  # the candidate's own helpers (and only its own) are in scope
        ns = {**vars(mod), "self": SimpleNamespace(model=tiny)}
        # torch.compile checks its arguments when called (mode and options together, unknown options, their
        # types), before anything is traced
        compiled = eval(compile(ast.Expression(ast.parse(call, mode="eval").body), "<call>", "eval"), ns)
        assert callable(compiled), call
    assert any("max-autotune" in k and "freezing" in k for k in seen), "no candidate sets a mode and options"
    # the mode+options form keeps what the mode stands for
    from torch._inductor import list_mode_options

    from kstrata.agents.optimize.configs import render as render_cfg

    both = render_cfg(info, {"compile": {"mode": "max-autotune-no-cudagraphs", "options": {"freezing": True}}},
                      space="compiler", proposer="t")
    path = tmp_path / "both.py"
    path.write_text(both.source)
    mod = import_task_module(path)
    assert mod._kstrata_compile_options("max-autotune-no-cudagraphs", {"freezing": True}) == {
        **list_mode_options("max-autotune-no-cudagraphs"), "freezing": True}


# ---------------------------------------------------------------------------------------------------
# 5. Findings: a kernel without plain global loads is not "uncoalesced"
# ---------------------------------------------------------------------------------------------------
def test_ncu_sector_use_of_zero_is_not_an_uncoalesced_finding() -> None:
    from kstrata.agents.optimize.findings import Evidence, NcuAnalyzer

    spec = _task_info(TINY / "01_relu_small.py").spec
    key = "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct"
    kinds = []
    for sect in (0.0, 30.0, 90.0):
        ev = Evidence(spec=spec, policy="strict", device="cuda", incumbent="x", incumbent_us=10.0, degeneracy=None)
        ev.ncu = [{"Kernel Name": "sm80_xmma_fprop_implicit_gemm", key: sect}]
        kinds.append([f.kind for f in NcuAnalyzer().analyze(ev)])
    assert kinds == [[], ["uncoalesced"], []]


# ---------------------------------------------------------------------------------------------------
# 6. The benchmark's budgets
# ---------------------------------------------------------------------------------------------------
def test_bench_gives_each_task_its_promised_minutes_and_runs_one_task_per_gpu() -> None:
    from kstrata.tools.bench_optimize import SAFETY_SHARE, STARTUP_S, default_parallel_tasks, per_task_minutes

    for total, n, par in ((9.5, 4, 1), (9.0, 8, 1), (9.0, 9, 9), (20.0, 5, 2)):
        per = per_task_minutes(total, n, par)
        waves = -(-n // par)
        # every wave ends (optimize keeps --minutes) before the bench's kill at the total budget
        assert STARTUP_S + waves * per * 60 <= total * 60 * (1 - SAFETY_SHARE / 2)
        assert per * 60 >= (total * 60 - STARTUP_S) / waves * (1 - 2 * SAFETY_SHARE)
    assert per_task_minutes(9.5, 4, 1) == pytest.approx((9.5 * 60 - STARTUP_S) / 4 * (1 - SAFETY_SHARE) / 60)
    with pytest.raises(SystemExit, match="fewer --tasks"):
        per_task_minutes(1.0, 9, 1)
    assert default_parallel_tasks("cpu") == 1
    import torch

    assert default_parallel_tasks("cuda") == max(1, torch.cuda.device_count())


# ---------------------------------------------------------------------------------------------------
# 7. The hardened evaluator's verdict (the final re-evaluation's) uses the same rule
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("cand_us", "accepted"), [(264.0, True), (100.0, False)])
def test_eval_verdict_accepts_a_win_the_roofline_explains(tmp_path: Path, cand_us: float, accepted: bool) -> None:
    from kstrata.agents.evaluate import OutputComparison, WorkerRun, _judge
    from kstrata.backends.timing import Timing

    def timing(us: float) -> dict[str, Any]:
        return Timing(us, us * 0.99, us * 1.01, us * 0.98, 100).to_json()

    out = OutputComparison("output0", "float32", True, 1e-4, True, "float64", 0.0)
    trial = {"checks": [], "distribution": "task", "seed": 1}
    ref = WorkerRun("reference", {"timing": timing(8392.0), "device_name": "fake"}, 0, False, "", tmp_path, 1.0)
    cand = WorkerRun("candidate", {"ok": True, "trials": [trial], "timing": timing(cand_us)}, 0, False, "", tmp_path, 1.0)
    v = _judge({"task": "t.py", "candidate": "c.py", "policy": "strict"}, _Spec(), ref, [{}], cand, 1, CEILINGS,
               compared=[([], [out])])
    assert v.correct_strict and v.accepted is accepted
    if accepted:  # the H200 case that was rejected ("speedup 30.1x is above 10x"), now accepted with the reason
        assert v.flags == () and "31.8x explained by the roofline: eager at 1.7% of SOL, candidate at 53%" in v.reason
        assert v.roofline is not None and v.roofline["explanations"]
    else:
        assert v.failure == "flagged" and "faster than speed of light" in v.reason


def test_with_learn_skills_the_search_stops_in_time_for_the_skill_gate(tmp_path: Path) -> None:
    """A win's skill gate (three fresh re-evaluations on other seeds) is reserved like the final: on the H200
    three wins were "not tried: its reproductions did not fit" when only the final was."""
    clock = _Clock()
    ev = _SlowEvaluator(tmp_path, clock, check_s=10.0, final_s=12.0)
    s = _search(tmp_path, ev, budget=50, minutes=2.0, clock=clock, spaces=("compiler", "library"),
                skills_dir=tmp_path / "skills")
    r = s.run()
    assert r.final_ok and s.incumbent.space != "baseline" and s.elapsed() <= 120.0
    final = next(e for e in s.traj.replay() if e["type"] == "final")
    assert "not tried" not in final["skill"]["reason"], final["skill"]
    assert len(ev.final_at) == 4  # the final and the three reproductions, all within the limit
    assert ev.final_at[-1] - 1000.0 <= 120.0


def test_with_learn_skills_nothing_is_reserved_for_the_skill_gate_before_a_win(tmp_path: Path) -> None:
    """No candidate beats the baseline: the search tries as many candidates with --learn-skills as without it
    (the gate runs only for a win). With the reserve taken from the start, a short H200 task tried none."""
    def no_win(src: str) -> float:
        return 120.0 if "coordinate_descent_tuning" in src else _rule_us(src)

    judged = []
    for skills in (None, tmp_path / "skills"):
        clock = _Clock()
        ev = _SlowEvaluator(tmp_path / str(bool(skills)), clock, check_s=10.0, final_s=12.0)
        ev.us = no_win
        s = _search(tmp_path / str(bool(skills)), ev, budget=50, minutes=1.5, clock=clock,
                    spaces=("compiler", "library"), skills_dir=skills)
        r = s.run()
        assert r.final_ok and s.incumbent.space == "baseline" and s.elapsed() <= 90.0
        judged.append(r.candidates)
    assert judged[0] >= 1 and judged[1] == judged[0], judged


class _DriftingEvaluator(FakeEvaluator):
    """The chosen candidate (coordinate-descent, 60 us during the search) measures `late_us` once the search
    is over: what a host that changed speed does to a ratio taken earlier."""

    def __init__(self, workdir: Path, late_us: float) -> None:
        super().__init__(workdir, _rule_us)
        self.late_us, self.late = late_us, False

    def measure(self, task: Path, cands: dict[str, Path], layouts: Any, **kw: Any) -> Any:
        out = super().measure(task, cands, layouts, **kw)
        if self.late:
            for k, p in cands.items():
                if "coordinate_descent_tuning" in p.read_text():
                    out[k] = Measurement(self.late_us, (self.late_us,) * 3, 30, self.spread)
        return out


@pytest.mark.parametrize(("late_us", "verdict"), [(60.0, "faster"), (89.5, "within noise"), (120.0, "slower")])
def test_the_choice_is_confirmed_against_the_best_baseline_at_the_end(tmp_path: Path, late_us: float,
                                                                      verdict: str) -> None:
    ev = _DriftingEvaluator(tmp_path, late_us)
    s = _search(tmp_path, ev, budget=2)
    confirm = s.confirm

    def late_confirm() -> None:
        ev.late = True
        confirm()

    s.confirm = late_confirm  # type: ignore[method-assign]
    r = s.run()
    assert r.confirmation == verdict and r.speedup_confirmed == pytest.approx(90.0 / late_us) and r.final_ok
    src = (tmp_path / "out" / "model_new.py").read_text()
    assert "Confirmation against the best baseline at the end" in (tmp_path / "out" / "report.md").read_text()
    if verdict == "slower":  # the output is never slower than the best baseline: it IS that baseline
        assert s.incumbent.key == s.base_key and "this file IS the best baseline" in src
        assert "coordinate_descent_tuning" not in src and "final confirmation" in s.nodes[
            next(k for k, n in s.nodes.items() if n.status == "rejected")].note
    else:
        assert s.incumbent.space == "compiler" and "confirmed at the end" in src and verdict in src
    # a resumed run replays the confirmation instead of measuring again, and keeps its outcome
    s2 = _search(tmp_path, _DriftingEvaluator(tmp_path, late_us), budget=2, resume=True)
    s2.replay()
    assert s2.confirmation is not None and s2.confirmation["verdict"] == verdict
    assert (s2.incumbent.key == s2.base_key) == (verdict == "slower")


@pytest.mark.parametrize(("final_ratio", "trusted"), [(0.642, False), (0.97, True)])
def test_an_eager_output_says_its_final_ratio_times_the_same_code(tmp_path: Path, final_ratio: float,
                                                                  trusted: bool) -> None:
    """The output is eager itself (every candidate slower): the final's ratio over eager is the host's spread
    between two processes, and the result says so; far from 1 it says the timings are not to be trusted."""
    class Eval(FakeEvaluator):
        def final(self, task: Path, cand: Path, *, seed: int, ceilings: Any = None) -> FakeVerdict:
            return FakeVerdict(True, speedup=final_ratio)

    ev = Eval(tmp_path, lambda src: 150.0 if "torch.compile" in src else 100.0)  # eager is the best
    s = _search(tmp_path, ev, budget=2)
    r = s.run()
    assert s.incumbent.candidate.proposer == "baseline:eager", s.incumbent.candidate.description
    assert r.note.startswith(f"model_new.py is eager itself: its {final_ratio:.3f}x over eager")
    assert ("not to be trusted to better than that" in r.note) is not trusted
    assert r.note in (tmp_path / "out" / "report.md").read_text()
