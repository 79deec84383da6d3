"""Where the model is and what it may cost: `LLMConfig`, read from options, the environment or a file.

Precedence, highest first: explicit options (the CLI's `--llm-*` flags, or keyword arguments), the
environment (`KSTRATA_LLM_BASE_URL`, `KSTRATA_LLM_MODEL`, `OPENAI_API_KEY`, and the others in
`ENV_VARS`), then a JSON config file (`--llm-config`, else `KSTRATA_LLM_CONFIG`, else
`~/.config/kstrata/llm.json` when it exists). A config file may name the environment variable that
holds the key (`"api_key_env": "MY_KEY"`) instead of the key itself.

The key is a secret: `LLMConfig` never prints it (`repr`, `to_json` and every message say only whether
one is set), and `redact` scrubs it from any text that leaves this process (errors, reports, logs).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError

#: Option name -> environment variable.
ENV_VARS: dict[str, str] = {
    "base_url": "KSTRATA_LLM_BASE_URL",
    "model": "KSTRATA_LLM_MODEL",
    "api_key": "OPENAI_API_KEY",
    "timeout_s": "KSTRATA_LLM_TIMEOUT",
    "max_retries": "KSTRATA_LLM_MAX_RETRIES",
    "concurrency": "KSTRATA_LLM_CONCURRENCY",
    "budget_tokens": "KSTRATA_LLM_BUDGET_TOKENS",
    "budget_usd": "KSTRATA_LLM_BUDGET_USD",
}
CONFIG_ENV = "KSTRATA_LLM_CONFIG"
DEFAULT_CONFIG_PATH = Path("~/.config/kstrata/llm.json")
#: Sent when no key is configured: local servers (vLLM, SGLang) accept any key, the client needs one.
NO_KEY = "EMPTY"


class LLMConfigError(KstrataError):
    """A config file or option that cannot be used (names the file and the field)."""


@dataclass(frozen=True)
class LLMConfig:
    """Everything the client needs. `api_key` is excluded from `repr` and from `to_json`."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 120.0
    #: Retries after the first attempt, on 429, 5xx, timeouts and dropped connections.
    max_retries: int = 4
    backoff_s: float = 1.0
    backoff_cap_s: float = 30.0
    #: Requests in flight at once (all proposers of a run share one client).
    concurrency: int = 4
    #: The run stops asking once this many tokens (prompt + completion) are spent (None: no limit).
    budget_tokens: int | None = None
    #: ... or this many dollars at the prices below (None: no limit).
    budget_usd: float | None = None
    price_in_per_mtok: float = 0.0
    price_out_per_mtok: float = 0.0
    max_tokens: int = 8192
    temperature: float = 0.2
    #: Stream responses (a stream cut short is then detected as truncated).
    stream: bool = False
    #: Refinement turns per conversation: a failed candidate goes back with its feedback up to this often.
    max_turns: int = 4
    #: Where each field came from ("option", "env", a file path, "default"), for `doctor` and reports.
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise LLMConfigError(f"base_url must be an http:// or https:// URL, got {self.base_url!r}")
        if not self.model:
            raise LLMConfigError("no model named (set KSTRATA_LLM_MODEL or --llm-model)")
        for name in ("timeout_s", "backoff_s", "backoff_cap_s"):
            if getattr(self, name) <= 0:
                raise LLMConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_retries < 0 or self.concurrency < 1 or self.max_turns < 1 or self.max_tokens < 1:
            raise LLMConfigError("max_retries must be >= 0 and concurrency, max_turns, max_tokens >= 1")

    @property
    def key_for_client(self) -> str:
        return self.api_key or NO_KEY

    def to_json(self) -> dict[str, Any]:
        """The config as a report may show it: the key only as set/unset."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("api_key",)}
        data["api_key"] = "set" if self.api_key else "unset"
        return data

    def redact(self, text: str) -> str:
        return redact(text, self.api_key)


def redact(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` (and of its `Bearer` form) replaced by `***`."""
    if not secret or len(secret) < 4:
        return text
    return text.replace(secret, "***")


_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(LLMConfig)}


def _coerce(name: str, value: Any, origin: str) -> Any:
    kind = str(_FIELD_TYPES[name])
    try:
        if value is None:
            return None
        if kind.startswith("bool"):
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise LLMConfigError(f"{origin}: {name}={value!r} is not a valid {kind}") from None


def _read_file(path: Path) -> dict[str, Any]:
    from kstrata.ir.files import read_json

    data = read_json(path, "LLM config file", error=LLMConfigError)
    if not isinstance(data, dict):
        raise LLMConfigError("an LLM config file is a JSON object", path=path)
    return data


def load_config(options: dict[str, Any] | None = None, *, config_file: str | Path | None = None,
                environ: dict[str, str] | None = None) -> LLMConfig | None:
    """The config from options, environment and file, or None when no endpoint is configured at all.

    Raises `LLMConfigError` for a config that is there but unusable (a bad file, a bad value, a model
    without a base URL).
    """
    env = dict(os.environ) if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path: Path | None = None
    if config_file is not None:
        path = Path(config_file).expanduser()
    elif env.get(CONFIG_ENV):
        path = Path(env[CONFIG_ENV]).expanduser()
    elif DEFAULT_CONFIG_PATH.expanduser().is_file():
        path = DEFAULT_CONFIG_PATH.expanduser()
    if path is not None:
        data = _read_file(path)
        key_env = data.pop("api_key_env", None)
        if key_env is not None:
            if not isinstance(key_env, str):
                raise LLMConfigError("api_key_env names an environment variable", path=path)
            if env.get(key_env):
                values["api_key"] = env[key_env]
                sources["api_key"] = f"env {key_env} (named by {path})"
        for name, value in data.items():
            if name not in _FIELD_TYPES or name == "sources":
                known = ", ".join(n for n in _FIELD_TYPES if n != "sources")
                raise LLMConfigError(f"unknown field {name!r} (fields: {known}, api_key_env)", path=path)
            values[name] = _coerce(name, value, str(path))
            sources[name] = str(path)
    for name, var in ENV_VARS.items():
        if env.get(var):
            values[name] = _coerce(name, env[var], f"environment {var}")
            sources[name] = f"env {var}"
    for name, value in (options or {}).items():
        if value is None:
            continue
        if name not in _FIELD_TYPES or name == "sources":
            raise LLMConfigError(f"unknown LLM option {name!r}")
        values[name] = _coerce(name, value, "option")
        sources[name] = "option"
    if "base_url" not in values:
        if "model" in values and "model" in sources and sources["model"] == "option":
            raise LLMConfigError("a model was named but no endpoint: set KSTRATA_LLM_BASE_URL or --llm-base-url")
        return None
    if "model" not in values:
        raise LLMConfigError(f"an endpoint is set ({values['base_url']}) but no model: set KSTRATA_LLM_MODEL or --llm-model")
    return LLMConfig(**values, sources=sources)
