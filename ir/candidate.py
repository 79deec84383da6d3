"""What a candidate says about itself: `kstrata-candidate.json`, written beside a rewritten kernel.

An override entry holds only the levels a rewrite replaced; Triton rebuilds the rest. What the files do
not carry is written here: the pipeline that made the candidate, the tolerance it declares (see
`ir/tolerance.py`; absent means bit-exact), and the metadata the lower levels were built with when a pass
changed it (`num_warps`, `num_stages`, `shared`, …), which a launcher of the candidate's binary needs.
Triton ignores the file (it reads overrides by level file name).

    {"schema": "kstrata.candidate/1", "kernel": "layernorm_fwd_kernel", "pipeline": "ttgir(num-warps{n=8})",
     "tolerance": "ulp=4,rtol=1e-05,atol=1e-06", "tolerance_why": "...", "metadata": {"num_warps": 8}}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import KstrataError

CANDIDATE_FILE = "kstrata-candidate.json"
#: The version of the file's format; `ir/schema.py:CandidateModel` is its schema.
CANDIDATE_SCHEMA = "kstrata.candidate/1"


@dataclass(frozen=True)
class CandidateInfo:
    kernel: str
    pipeline: str | None = None
    tolerance: str | None = None
    tolerance_why: str | None = None
    #: Metadata keys whose values the rewrite changed, with their new values.
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"schema": CANDIDATE_SCHEMA, **asdict(self)}

    def encode(self) -> bytes:
        return (json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def read(cls, directory: str | Path) -> CandidateInfo | None:
        """The description in `directory` (a candidate entry), or None when it has none."""
        path = Path(directory) / CANDIDATE_FILE
        if not path.is_file():
            return None
        from .schema import CandidateModel, validate

        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise KstrataError(f"corrupt candidate description: {type(exc).__name__}: {exc}", path=path) from None
        model = validate(CandidateModel, data, schema=CANDIDATE_SCHEMA, path=path, what="candidate description")
        return cls(model.kernel, model.pipeline, model.tolerance, model.tolerance_why, dict(model.metadata))


#: Metadata keys a pass may change that a launcher or a rebuild of the candidate must see.
LAUNCH_METADATA = ("num_warps", "num_stages", "num_ctas", "shared", "tmem_size", "global_scratch_size",
                   "global_scratch_align", "profile_scratch_size", "ptx_options", "maxnreg")


def changed_metadata(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The launch-relevant metadata values that differ between two bundles' metadata."""
    return {k: after[k] for k in LAUNCH_METADATA if k in after and before.get(k) != after[k]}
