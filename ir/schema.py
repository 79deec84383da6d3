"""The schemas of the JSON files kstrata reads, as pydantic models: launch records (`kstrata.launch/1`,
`ir/launch.py`) and candidate descriptions (`kstrata.candidate/1`, `kstrata-candidate.json`,
`ir/candidate.py`). Formats whose frozen dataclass is the schema (tuned records, skills) are checked
against the dataclass's own type hints by `validate_dataclass`, as strictly.

Each model names its schema version in a `schema` field that must match exactly, forbids fields it
does not know (a misspelt field is an error, not silently ignored) and checks types strictly (a string
where a number belongs is an error, not a conversion). `validate` turns pydantic's report into one
line naming the file and the first field that is wrong, e.g.

    records/add-1.json: field args[1].shape: Input should be a valid list (and 2 more errors)

The readers turn the validated model into kstrata's own frozen dataclasses; nothing else sees pydantic.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .errors import KstrataError

_Model = TypeVar("_Model", bound=BaseModel)
_Dataclass = TypeVar("_Dataclass")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TensorArgModel(_Strict):
    kind: Literal["tensor"]
    name: str
    dtype: str
    shape: list[Annotated[int, Field(ge=0)]]
    stride: list[int]
    storage_offset: Annotated[int, Field(ge=0)] = 0
    storage_numel: Annotated[int, Field(ge=0)] | None = None
    written: bool | None = None
    snapshot: str | None = None


class ScalarArgModel(_Strict):
    kind: Literal["scalar"]
    name: str
    type: str
    value: bool | int | float


class LaunchRecordModel(_Strict):
    """`kstrata.launch/1`: one kernel launch (see `ir/launch.py` for the meaning of each field)."""

    schema_: Literal["kstrata.launch/1"] = Field(alias="schema")
    kernel: str
    target: str
    grid: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=3)]
    args: list[Annotated[TensorArgModel | ScalarArgModel, Field(discriminator="kind")]]
    num_warps: Annotated[int, Field(ge=1)] | None = None
    num_stages: Annotated[int, Field(ge=0)] | None = None
    #: Triton's hash of the compiled kernel, hex: the cache entry's directory is its base32 (`base32_key`).
    cache_key: Annotated[str, Field(pattern=r"^(?:[0-9a-fA-F]{2})+$")] | None = None
    override_key: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


class CandidateModel(_Strict):
    """`kstrata.candidate/1`: what a rewritten kernel's override entry says about itself."""

    schema_: Literal["kstrata.candidate/1"] = Field(alias="schema")
    kernel: str
    pipeline: str | None = None
    tolerance: str | None = None
    tolerance_why: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("tensor", "scalar", "bool", "int", "float", "str"):
            continue  # a union's branch, not a field
        else:
            out += ("." if out else "") + ("schema" if part == "schema_" else str(part))
    return out or "(top level)"


def validate(model: type[_Model], data: Any, *, schema: str, path: str | Path | None, what: str,
             error: type[KstrataError] = KstrataError) -> _Model:
    """`data` (parsed JSON) as `model`; an `error` whose one line names `path` and the first bad field."""
    if not isinstance(data, dict) or data.get("schema") != schema:
        found = f"schema {data.get('schema')!r}" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise error(f"not a {what} ({found}; expected schema {schema})", path=path)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"malformed {what}: {_first_error(exc)}", path=path) from None


def validate_dataclass(cls: type[_Dataclass], data: Any, *, path: str | Path | None, what: str,
                       error: type[KstrataError] = KstrataError) -> _Dataclass:
    """`data` (parsed JSON) as the dataclass `cls`, each field checked against its type hint as strictly as
    the models above (JSON's arrays are tuples where the hint says so); an unknown field is an error too.
    An `error` whose one line names `path` and the first bad field."""
    if not isinstance(data, dict):
        raise error(f"not a {what} (a JSON {type(data).__name__}; expected an object)", path=path)
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
    if unknown:
        raise error(f"malformed {what}: field {unknown[0]}: not a field of a {what}", path=path)
    try:
        # JSON mode: strict types, yet arrays for tuples and objects for nested dataclasses
        return TypeAdapter(cls).validate_json(json.dumps(data), strict=True)
    except ValidationError as exc:
        raise error(f"malformed {what}: {_first_error(exc)}", path=path) from None


def _first_error(exc: ValidationError) -> str:
    """Pydantic's report as `field F: what is wrong, got V (and N more errors)`."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    more = f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    got = first.get("input")
    shown = repr(got) if isinstance(got, (int, float, bool, str)) or got is None else type(got).__name__
    if len(shown) > 60:
        shown = shown[:57] + "..."
    detail = first["msg"] + (f", got {shown}" if first["type"] not in ("missing", "extra_forbidden") else "")
    return f"field {_where(tuple(first['loc']))}: {detail}{more}"
