"""Launch records: what one kernel launch was given, enough to replay it on fresh data.

A `LaunchRecord` names the kernel (by name and, when known, Triton's cache and override keys), the
target, the grid and launch options, and every runtime argument: a tensor by dtype, shape, strides,
storage size and offset (and, after recording, whether the launch changed its contents), a scalar by
type and value. Tensor contents are not part of the record; `snapshot` names an optional `.npy` file
of the contents before the launch, written beside the record.

File format (JSON, versioned by `schema`; the pydantic model `ir/schema.py:LaunchRecordModel` is the
schema, and a record that does not fit it is an error naming the file and the field):

    {"schema": "kstrata.launch/1", "kernel": "add_kernel", "target": "cuda:90", "grid": [40, 1, 1],
     "num_warps": 4, "num_stages": 3, "cache_key": "...", "override_key": "...",
     "args": [{"name": "x_ptr", "kind": "tensor", "dtype": "float32", "shape": [5003], "stride": [1],
               "storage_offset": 0, "storage_numel": 5003, "written": false, "snapshot": null},
              {"name": "n", "kind": "scalar", "type": "i32", "value": 5003}]}
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import KstrataError

LAUNCH_SCHEMA = "kstrata.launch/1"


class LaunchRecordError(KstrataError):
    """A launch record that cannot be read or does not fit the kernel it is used with."""


def dtype_itemsize(dtype: str) -> int:
    """Bytes per element of a torch dtype named without "torch." ("float16": 2)."""
    import torch

    t = getattr(torch, dtype, None)
    if not isinstance(t, torch.dtype):
        raise LaunchRecordError(f"{dtype!r} is not a torch dtype: its element size is unknown")
    return int(t.itemsize)


@dataclass(frozen=True)
class TensorArg:
    name: str
    dtype: str  # torch dtype name without "torch.", e.g. "float16"
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int = 0
    storage_numel: int | None = None
    #: Whether the recorded launch changed the tensor's contents (None when not observed).
    written: bool | None = None
    snapshot: str | None = None
    kind: str = "tensor"

    @property
    def needed_numel(self) -> int:
        """Elements the storage must hold for every index of the view."""
        if not self.shape or 0 in self.shape:
            return self.storage_offset
        return self.storage_offset + 1 + sum((n - 1) * abs(s) for n, s in zip(self.shape, self.stride, strict=True))

    @property
    def nbytes(self) -> int:
        """Bytes of the elements the view addresses: a broadcast dimension (stride 0) counts once. Raises
        LaunchRecordError when the dtype's element size is unknown."""
        numel = 1
        for n, s in zip(self.shape, self.stride, strict=True):
            if n == 0:
                return 0
            numel *= n if s else 1
        return numel * dtype_itemsize(self.dtype)


@dataclass(frozen=True)
class ScalarArg:
    name: str
    type: str  # Triton's spelling: i32, i64, fp32, u1, …
    value: int | float | bool
    kind: str = "scalar"


Arg = TensorArg | ScalarArg


@dataclass(frozen=True)
class LaunchRecord:
    kernel: str
    target: str
    grid: tuple[int, int, int]
    args: tuple[Arg, ...]
    num_warps: int | None = None
    num_stages: int | None = None
    cache_key: str | None = None
    override_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    origin: str | None = field(default=None, compare=False)  # the record's file, for errors

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["origin"]
        data["schema"] = LAUNCH_SCHEMA
        data["grid"] = list(self.grid)
        data["args"] = [asdict(a) for a in self.args]
        for a in data["args"]:
            if a["kind"] == "tensor":
                a["shape"], a["stride"] = list(a["shape"]), list(a["stride"])
        return data

    @classmethod
    def from_json(cls, data: Any, origin: str | None = None) -> LaunchRecord:
        """The record `data` (parsed JSON) describes, checked against the schema (`ir/schema.py`)."""
        from .schema import LaunchRecordModel, TensorArgModel, validate

        model = validate(LaunchRecordModel, data, schema=LAUNCH_SCHEMA, path=origin, what="launch record",
                         error=LaunchRecordError)
        args: list[Arg] = []
        for a in model.args:
            if isinstance(a, TensorArgModel):
                if len(a.shape) != len(a.stride):
                    raise LaunchRecordError(f"malformed launch record: argument {a.name} has {len(a.shape)} sizes "
                                            f"but {len(a.stride)} strides", path=origin)
                args.append(TensorArg(a.name, a.dtype, tuple(a.shape), tuple(a.stride), a.storage_offset,
                                      a.storage_numel, a.written, a.snapshot))
            else:
                args.append(ScalarArg(a.name, a.type, a.value))
        grid = tuple(model.grid) + (1,) * (3 - len(model.grid))
        return cls(model.kernel, model.target, (grid[0], grid[1], grid[2]), tuple(args), model.num_warps,
                   model.num_stages, model.cache_key, model.override_key, dict(model.extra), origin)

    def buffer_bytes(self) -> int:
        """Bytes of the buffers the launch was given: each tensor argument's view (`TensorArg.nbytes`) once,
        read or written, but twice for one that is read and written in place (Inductor's `in_out_ptr*`, written
        in the record); two arguments that are the same view of one storage (by the recorded address,
        `extra["storage"]`) count once. Raises LaunchRecordError, naming the argument, when a size is unknown,
        and when the launch has no tensor argument."""
        storage = self.extra.get("storage") or {}
        views: dict[tuple[Any, ...], int] = {}
        for a in self.args:
            if not isinstance(a, TensorArg):
                continue
            where = storage.get(a.name)
            key = (*(("address", where[0]) if where else ("argument", a.name)), a.dtype, a.storage_offset, a.shape,
                   a.stride)
            # Inductor's `in_out_ptr` is read and written in place: its bytes cross twice (read, then written)
            times = 2 if a.written and a.name.startswith("in_out_ptr") else 1
            try:
                views[key] = max(views.get(key, 0), times * a.nbytes)
            except LaunchRecordError as exc:
                raise LaunchRecordError(f"kernel {self.kernel}: argument {a.name}: {exc.message}",
                                        path=self.origin) from None
        if not views:
            raise LaunchRecordError(f"kernel {self.kernel}: the launch has no tensor argument", path=self.origin)
        return sum(views.values())

    def save(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.tmp.{os.getpid()}")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(p)
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LaunchRecord:
        from .files import read_json, user_path

        p = user_path(path)
        return cls.from_json(read_json(p, "launch record", error=LaunchRecordError), str(p))

    def check_against(self, params: tuple[Any, ...]) -> None:
        """Raise when the record's runtime arguments do not match a kernel's parameters (names and kinds)."""
        names = [a.name for a in self.args]
        expected = [p.name for p in params]
        if names != expected:
            raise LaunchRecordError(f"kernel {self.kernel}: the record's arguments {names} do not match the kernel's "
                                    f"parameters {expected}", path=self.origin)
        for a, p in zip(self.args, params, strict=True):
            if (a.kind == "tensor") != p.is_pointer:
                raise LaunchRecordError(f"kernel {self.kernel}: argument {a.name} is a {a.kind} in the record but "
                                        f"{p.type} in the kernel", path=self.origin)
