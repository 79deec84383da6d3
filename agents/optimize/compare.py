"""Two `kstrata optimize` output directories compared: did they judge the same candidates the same way?

`run_digest(out)`: per task, every candidate's key, space, proposer, status and verdict (ok, failure kind),
the incumbent baseline, the final verdict and the written `model_new.py`. On the CPU path two runs of the
same tasks, seed and budget must give equal digests, wherever their jobs ran (in process, over GPUs, on
Ray). On a GPU the timed parts may differ (which challenger beat the noise), so `compare_runs` reports the
verdicts of the candidates both runs judged separately from the rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def run_digest(out: Path) -> dict[str, Any]:
    got: dict[str, Any] = {}
    dirs = [out] if (out / "trajectory.jsonl").exists() else sorted(p for p in out.iterdir()
                                                                     if (p / "trajectory.jsonl").exists())
    for d in dirs:
        events = [json.loads(ln) for ln in (d / "trajectory.jsonl").read_text().splitlines() if ln.endswith("}")]
        got[d.name if d != out else "."] = {
            "candidates": [(e["key"], e["space"], e["proposer"], e["status"], (e["verdict"] or {}).get("ok"),
                            (e["verdict"] or {}).get("failure")) for e in events if e["type"] == "candidate"],
            "incumbent": [e.get("incumbent") for e in events if e["type"] == "baselines"],
            "final": [(e["key"], e["accepted"]) for e in events if e["type"] == "final"],
            "model_new": (d / "model_new.py").read_text() if (d / "model_new.py").exists() else None,
        }
    return got


def compare_runs(a: Path, b: Path) -> dict[str, Any]:
    """Per task: whether both finals were accepted, verdict disagreements on candidates both judged, and
    whether everything (timed parts included) was identical."""
    da, db = run_digest(a), run_digest(b)
    tasks: dict[str, Any] = {}
    for name in sorted(set(da) | set(db)):
        x, y = da.get(name), db.get(name)
        if x is None or y is None:
            tasks[name] = {"missing_in": str(b if y is None else a)}
            continue
        vx = {c[0]: (c[4], c[5]) for c in x["candidates"]}
        vy = {c[0]: (c[4], c[5]) for c in y["candidates"]}
        common = sorted(set(vx) & set(vy))
        tasks[name] = {"identical": x == y, "finals_accepted": [bool(f[1]) for f in x["final"] + y["final"]],
                       "judged_by_both": len(common), "only_in_a": len(set(vx) - set(vy)),
                       "only_in_b": len(set(vy) - set(vx)),
                       "verdict_disagreements": [k for k in common if vx[k] != vy[k]]}
    agree = all(t.get("verdict_disagreements") == [] and all(t.get("finals_accepted", [False])) for t in tasks.values())
    return {"a": str(a), "b": str(b), "verdicts_agree": agree, "tasks": tasks}
