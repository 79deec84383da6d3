"""The contract a candidate must keep, and the degenerate-task verdict.

From the task spec (`TaskSpec`: shapes, dtypes, FLOPs, bytes) plus what a candidate must keep:
output shapes, dtypes, strides and contiguity (`output_problems`), no aliasing of inputs (the hardened
evaluator checks it), determinism (two calls on the same inputs give the same bits: `worker.py` checks it
before timing), and the precision policy. `strict` is the default; `tf32`, `bf16` and `fp16` are used only
when asked and are then checked with KernelBench's tolerances (the evaluator's `kernelbench` policy), which
the report and the ModelNew header state.

Degenerate tasks (published 16–50x "speedups" came from them) are recognised from three runs of the
reference (`worker.py probe`): inputs redrawn under another seed, floating parameters and buffers replaced
by random values (`worker.perturb_weights`: redrawing the init seed changes nothing for deterministic inits
such as GroupNorm's), and the outputs' spread, also computed in float64. A task is degenerate when its
outputs do not depend on the inputs, or on the weights (a model with floating parameters or buffers; one
without is not "weight-independent"), or are constant, or near-constant between independent input draws
(change by less than `NEAR_CONSTANT_REL` of their magnitude, or, in float64, by no more than
`ROUNDING_NOISE_FACTOR` times their rounding error). Such a task is optimized like any other but left out of the geomeans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kstrata.agents.tasks import TaskSpec, TensorSpec

#: Outputs that move by less than this (relative to their magnitude) between input draws are near-constant.
NEAR_CONSTANT_REL = 1e-3
#: Outputs whose float64 change between input draws is within this factor of their rounding error (the task's
#: dtype against float64) are near-constant too: a mean of group-normalized values is 0 up to rounding.
ROUNDING_NOISE_FACTOR = 4.0


def eval_policy_for(policy: str) -> str:
    """The hardened evaluator's policy that decides under an optimizer precision policy."""
    return "strict" if policy == "strict" else "kernelbench"


@dataclass(frozen=True)
class Degeneracy:
    degenerate: bool
    reasons: tuple[str, ...]
    evidence: dict[str, Any] = field(default_factory=dict)
    checked: bool = True  # False when the probe could not run (then `reasons` says why)

    def to_json(self) -> dict[str, Any]:
        return {"degenerate": self.degenerate, "reasons": list(self.reasons), "evidence": self.evidence,
                "checked": self.checked}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Degeneracy:
        return cls(d["degenerate"], tuple(d["reasons"]), d.get("evidence", {}), d.get("checked", True))


def judge_degeneracy(probe: dict[str, Any], has_parameters: bool) -> Degeneracy:
    """Turn the probe's per-output evidence into a verdict (pure: unit-tested with made-up evidence)."""
    reasons: list[str] = []
    outs = probe.get("outputs", [])
    if not outs:
        return Degeneracy(False, ("the probe saw no floating-point outputs",), probe, checked=False)
    if all(not o["depends_on_inputs"] for o in outs):
        reasons.append("outputs do not depend on the inputs (identical for independent input draws)")
    if has_parameters and all(o.get("depends_on_weights") is False for o in outs):
        reasons.append("outputs do not depend on the weights (identical for independently drawn weights)")
    if all(o["constant"] for o in outs):
        reasons.append("every output is a constant tensor (all elements equal)")
    elif all(o["depends_on_inputs"] and o["rel_change_across_inputs"] < NEAR_CONSTANT_REL for o in outs):
        worst = max(o["rel_change_across_inputs"] for o in outs)
        reasons.append(f"outputs are near-constant: they change by {worst:.2g} (relative) between independent "
                       f"input draws (below {NEAR_CONSTANT_REL:g})")
    elif all(o["depends_on_inputs"] and _rounding_noise(o) for o in outs):
        worst = max(float(o["change_fp64"]) for o in outs)
        err = max(float(o["rounding_error"]) for o in outs)
        reasons.append(f"outputs are near-constant: computed in float64 they change by {worst:.2g} between "
                       f"independent input draws, within {ROUNDING_NOISE_FACTOR:g}x the rounding error of the "
                       f"task's own outputs ({err:.2g}): what changes is rounding noise")
    return Degeneracy(bool(reasons), tuple(reasons), probe)


def _rounding_noise(o: dict[str, Any]) -> bool:
    """The output's true (float64) change across input draws is no larger than its rounding error."""
    change, err = o.get("change_fp64"), o.get("rounding_error")
    if change is None or err is None or err <= 0:
        return False
    return float(change) <= ROUNDING_NOISE_FACTOR * float(err)


@dataclass(frozen=True)
class Contract:
    """What every candidate of one task must keep."""

    task: str
    policy: str
    outputs: tuple[Any, ...]  # the spec's output ArgSpecs
    degeneracy: Degeneracy

    @property
    def eval_policy(self) -> str:
        return eval_policy_for(self.policy)

    def lines(self) -> list[str]:
        out = []
        for o in self.outputs:
            if isinstance(o, TensorSpec):
                layout = "contiguous" if o.contiguous else f"strides {list(o.stride or ())}"
                out.append(f"{o.name}: {o.dtype} {list(o.shape)}, {layout}")
        out.append("no output may alias an input; two calls on the same inputs must give the same bits")
        out.append(f"precision policy: {self.policy}" + ("" if self.policy == "strict" else
                   f" (asked for; checked with the evaluator's {self.eval_policy} tolerances)"))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "policy": self.policy, "eval_policy": self.eval_policy,
                "outputs": [o.to_json() for o in self.outputs], "degeneracy": self.degeneracy.to_json()}


def make_contract(spec: TaskSpec, policy: str, degeneracy: Degeneracy) -> Contract:
    return Contract(spec.name, policy, spec.outputs, degeneracy)


def output_layouts(spec: TaskSpec) -> list[dict[str, Any] | None]:
    """The layout each output must have, for the worker (None for non-tensor outputs)."""
    return [{"shape": list(o.shape), "stride": list(o.stride) if o.stride is not None else None,
             "contiguous": o.contiguous, "dtype": o.dtype} if isinstance(o, TensorSpec) else None
            for o in spec.outputs]


def output_problems(expected: list[dict[str, Any] | None], got: list[dict[str, Any] | None]) -> list[str]:
    """Layout differences between the reference's outputs and a candidate's (pure)."""
    problems = []
    if len(expected) != len(got):
        return [f"expected {len(expected)} outputs, got {len(got)}"]
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        if e is None or g is None:
            continue
        if e["shape"] != g["shape"] or e["dtype"] != g["dtype"]:
            problems.append(f"output {i}: {g['dtype']} {g['shape']}, expected {e['dtype']} {e['shape']}")
        elif e["contiguous"] and not g["contiguous"]:
            problems.append(f"output {i} is not contiguous (strides {g['stride']}); the reference's is")
        elif not e["contiguous"] and e["stride"] is not None and g["stride"] != e["stride"]:
            problems.append(f"output {i}: strides {g['stride']}, the reference's are {e['stride']}")
    return problems
