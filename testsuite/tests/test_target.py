from __future__ import annotations

import pytest

from kstrata.ir import Target, TargetError


@pytest.mark.parametrize(
    ("spelling", "backend", "arch", "warp"),
    [("cuda:90", "cuda", 90, 32), ("sm_80", "cuda", 80, 32), ("cuda:100", "cuda", 100, 32),
     ("hip:gfx942", "hip", "gfx942", 64), ("gfx90a", "hip", "gfx90a", 64), ("hip:gfx950", "hip", "gfx950", 64)],
)
def test_parse_known_targets(spelling: str, backend: str, arch: int | str, warp: int) -> None:
    t = Target.parse(spelling)
    assert (t.backend, t.arch, t.warp_size) == (backend, arch, warp)
    assert Target.parse(str(t)) == t
    assert Target.from_triton(t.to_triton()) == t


@pytest.mark.parametrize("spelling", ["cuda:91", "hip:gfx000", "tpu:v5", "", "cuda"])
def test_unknown_targets_are_named_in_the_error(spelling: str) -> None:
    with pytest.raises(TargetError) as info:
        Target.parse(spelling)
    assert repr(spelling) in str(info.value)


def test_levels_per_backend() -> None:
    assert Target.parse("cuda:90").levels == ("source", "ttir", "ttgir", "llir", "ptx", "cubin")
    assert Target.parse("hip:gfx942").levels[-2:] == ("amdgcn", "hsaco")
