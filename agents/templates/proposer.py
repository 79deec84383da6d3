"""The templates as an optimizer proposer (`space="triton"`), for `kstrata optimize`'s proposer interface
(`kstrata.agents.optimize`: `name`, `space`, `propose(state) -> list[TaskCandidate]`).

A fresh draft (`state.parent` is None, or not one of ours) proposes, per matching template, the tuned
schedule when the tuning cache has one for this device, the default schedule, and up to `width - 1` other
schedules spread over the space. Refining one of our own nodes proposes its neighbours: the schedules
that differ from the parent's in one parameter. The proposer never evaluates or times anything: the loop
checks each candidate with the hardened evaluator and times it; `tune.autotune` is the separate hook for
a search that wants the whole space timed on the GPU in one go.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kstrata.agents.templates.base import Params, TemplateMatch

#: Policies a template renders for; every other policy (bf16, fp16) admits strict sources.
_RENDER_POLICY = {"tf32": "tf32"}


class TemplateProposer:
    """Custom Triton kernels from `kstrata.agents.templates`."""

    name = "templates"
    space = "triton"

    def __init__(self, width: int = 4, cache_dir: str | Path | None = None) -> None:
        self.width = width
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self._matches: dict[str, list[TemplateMatch]] = {}

    def _match(self, path: Path, policy: str, state: Any) -> list[TemplateMatch]:
        from kstrata.agents.tasks import load_task
        from kstrata.agents.templates import analyse

        key = f"{path}|{policy}"
        if key not in self._matches:
            a = analyse(load_task(path), policy)
            self._matches[key] = list(a.matches)
            if not a.matches:
                state.note(self.name, "; ".join(f"{r.template}: {r.reason}" for r in a.rejected)[:300])
        return self._matches[key]

    def _tuned(self, m: TemplateMatch, device: str) -> Params | None:
        if self.cache_dir is None or not device.startswith("cuda"):
            return None
        from kstrata.agents.templates.tune import CACHE_FILE, _read_cache, cache_key

        try:
            import torch

            name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
        except Exception:
            return None
        hit = _read_cache(self.cache_dir / CACHE_FILE).get(cache_key(m, name))
        return dict(hit["params"]) if hit else None

    def schedules(self, m: TemplateMatch, parent: Params | None, tuned: Params | None) -> list[Params]:
        """The schedules to propose for one match (see the module docstring)."""
        if parent is not None:
            out = []
            for axis, values in m.schedule_space().items():
                for v in values:
                    p = {**parent, axis: v}
                    if p != parent and m._valid(p) and p not in out:
                        out.append(p)
            return out
        configs = m.configs()
        picked: list[Params] = [tuned] if tuned else []
        if configs[0] not in picked:
            picked.append(configs[0])
        rest = configs[1:]
        want = max(0, self.width - len(picked))
        if rest and want:
            step = max(1, len(rest) // want)
            for p in rest[::step][:want]:
                if p not in picked:
                    picked.append(p)
        return picked

    def propose(self, state: Any) -> list[Any]:
        from kstrata.agents.optimize.candidate import TaskCandidate

        policy = _RENDER_POLICY.get(state.policy, "strict")
        matches = self._match(Path(state.task.path), policy, state)
        parent = state.parent
        parent_params: Params | None = None
        parent_template = None
        if parent is not None and parent.candidate.proposer == self.name:
            parent_template = parent.candidate.params.get("template")
            parent_params = dict(parent.candidate.params.get("schedule", {}))
        out = []
        for m in matches:
            if parent_template is not None and m.template != parent_template:
                continue
            base = parent_params if parent_template == m.template else None
            for p in self.schedules(m, base, self._tuned(m, state.device)):
                src = m.render(p, policy)
                cand = TaskCandidate(source=src, space=self.space, proposer=self.name,
                                     description=f"{m.template} {json.dumps(p, sort_keys=True)}: {m.description}",
                                     params={"template": m.template, "schedule": p}, policy=policy,
                                     parent=parent.key if parent is not None else None)
                if cand.key not in state.tried:
                    out.append(cand)
        return out
