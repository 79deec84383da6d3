"""The static surrogate cost of an AMD kernel (no AMD GPU here): `llvm-mca -mcpu=<arch>` cycles per
iteration of the hot window of one wave (`backends/hotwindow.py`, `backends/mca.py`), scaled by the
program's waves over the SIMDs of a CU that run them (4 on CDNA): a program of 8 waves whose window
costs C runs two waves per SIMD, so about 2C; one of 4 waves, about C. The cost ranks candidates; it is
never reported as a time or a speedup, and every candidate ranked by it is `unmeasured`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: SIMDs per compute unit on CDNA (gfx90a, gfx942, gfx950).
SIMDS_PER_CU = 4


def amd_surrogate(entry: str) -> dict[str, Any]:
    """The surrogate of the kernel in the cache entry `entry`: its cost (lower is better) and how it was got."""
    from kstrata.backends.hotwindow import static_hot_window
    from kstrata.backends.mca import mca_estimate

    root = Path(entry)
    amdgcn = next(root.glob("*.amdgcn"), None)
    if amdgcn is None:
        raise FileNotFoundError(f"{entry}: no .amdgcn file")
    meta = next((p for p in root.glob("*.json") if not p.name.startswith("__grp__") and p.name != "kstrata-candidate.json"), None)
    md = json.loads(meta.read_text()) if meta else {}
    arch = str((md.get("target") or {}).get("arch") or "gfx942")
    warps = int(md.get("num_warps") or 4)
    window = static_hot_window(amdgcn.read_text(), "amdgcn")
    est = mca_estimate(window.instructions, mcpu=arch)
    per_simd = max(1.0, warps / SIMDS_PER_CU)
    return {"cost": est.cycles_per_iteration * per_simd, "cycles_per_iteration": est.cycles_per_iteration,
            "waves": warps, "waves_per_simd": per_simd, "window": window.to_json(), "mca": est.to_json(),
            "what": f"llvm-mca -mcpu={arch} cycles per hot-window iteration x waves per SIMD (static; not a timing)"}
