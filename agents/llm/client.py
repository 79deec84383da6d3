"""The one client for OpenAI-compatible endpoints: retries, a concurrency limit, and a token budget.

`LLMClient.chat(messages)` returns a `ChatResult` (the text, why generation stopped, tokens) or raises
one of three errors a caller can act on: `BudgetExhausted` (the run's budget is spent: stop cleanly),
`LLMUnavailable` (the endpoint did not answer after the retries: timeouts, refused connections,
429/5xx every time), `LLMRequestRejected` (a 4xx other than 429: the request itself is wrong, so
retrying would not help). A response cut short (`finish_reason == "length"`, or a stream that ends
without a finish reason) is not an error: the result says `truncated` and the parser rejects it.

Retries use the `openai` package with its own retries off, so that every attempt is counted here:
exponential backoff with jitter (`backoff_s * 2**attempt`, capped at `backoff_cap_s`), or the server's
`Retry-After` when it sends one (capped the same way). All requests of a run share one `UsageLedger`,
which charges prompt and completion tokens (the server's `usage`, or an estimate of 4 characters per
token when it reports none, marked as estimated) and their cost at the configured prices.

The key is never logged: log records and error messages pass through `LLMConfig.redact`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kstrata.ir.errors import KstrataError

from .config import LLMConfig

log = logging.getLogger("kstrata.llm")

Message = dict[str, str]


class LLMError(KstrataError):
    """Base of the client's errors."""


class BudgetExhausted(LLMError):
    """The run's token or cost budget is spent; no further request is sent."""


class LLMUnavailable(LLMError):
    """The endpoint did not answer usably after every retry."""


class LLMRequestRejected(LLMError):
    """The endpoint refused the request (a 4xx other than 429)."""


class _StreamDropped(Exception):
    """A stream that failed before any content arrived: retried like a dropped connection."""


@dataclass(frozen=True)
class ChatResult:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    tokens_estimated: bool
    attempts: int
    elapsed_s: float
    model: str

    @property
    def truncated(self) -> bool:
        """Cut off at the token limit, or a stream that ended before the model finished."""
        return self.finish_reason in (None, "length")

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"truncated": self.truncated}


@dataclass
class UsageLedger:
    """Tokens, cost and requests of a run, against its budget. Shared by threads (locked)."""

    budget_tokens: int | None = None
    budget_usd: float | None = None
    price_in_per_mtok: float = 0.0
    price_out_per_mtok: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    retries: int = 0
    failures: int = 0
    estimated: bool = False

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    @classmethod
    def for_config(cls, config: LLMConfig) -> UsageLedger:
        return cls(config.budget_tokens, config.budget_usd, config.price_in_per_mtok, config.price_out_per_mtok)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost_usd(self) -> float:
        return (self.prompt_tokens * self.price_in_per_mtok + self.completion_tokens * self.price_out_per_mtok) / 1e6

    def exhausted(self) -> str | None:
        """Why no further request may be sent, or None."""
        if self.budget_tokens is not None and self.tokens >= self.budget_tokens:
            return f"token budget spent: {self.tokens} of {self.budget_tokens} tokens"
        if self.budget_usd is not None and self.cost_usd >= self.budget_usd:
            return f"cost budget spent: ${self.cost_usd:.4f} of ${self.budget_usd:.4f}"
        return None

    def remaining_tokens(self) -> int | None:
        return None if self.budget_tokens is None else max(0, self.budget_tokens - self.tokens)

    def charge(self, prompt: int, completion: int, estimated: bool) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.completion_tokens += completion
            self.requests += 1
            self.estimated = self.estimated or estimated

    def count(self, *, retries: int = 0, failures: int = 0) -> None:
        with self._lock:
            self.retries += retries
            self.failures += failures

    def to_json(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "tokens": self.tokens, "tokens_estimated": self.estimated, "cost_usd": round(self.cost_usd, 6),
                "requests": self.requests, "retries": self.retries, "failures": self.failures,
                "budget_tokens": self.budget_tokens, "budget_usd": self.budget_usd}


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class LLMClient:
    """Chat completions against `config`'s endpoint; thread-safe, at most `config.concurrency` in flight."""

    def __init__(self, config: LLMConfig, *, ledger: UsageLedger | None = None,
                 sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None) -> None:
        import openai

        self.config = config
        self.ledger = ledger or UsageLedger.for_config(config)
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._slots = threading.BoundedSemaphore(config.concurrency)
        self._openai = openai
        self._client = openai.OpenAI(base_url=config.base_url, api_key=config.key_for_client,
                                     timeout=config.timeout_s, max_retries=0)

    # -- public -----------------------------------------------------------------------------------
    def chat(self, messages: Sequence[Message], *, max_tokens: int | None = None) -> ChatResult:
        """One completion, with retries; see the module docstring for what it raises."""
        why = self.ledger.exhausted()
        if why:
            raise BudgetExhausted(why)
        limit = max_tokens or self.config.max_tokens
        left = self.ledger.remaining_tokens()
        if left is not None:
            prompt_estimate = sum(_estimate_tokens(m.get("content", "")) for m in messages)
            limit = min(limit, left - prompt_estimate)
            if limit < 16:
                raise BudgetExhausted(f"token budget nearly spent: {left} tokens left, the prompt alone is about "
                                      f"{prompt_estimate}")
        with self._slots:
            return self._with_retries(list(messages), limit)

    def ping(self) -> tuple[bool, str]:
        """Does the endpoint answer? Lists models (cheap, no tokens); says how it failed if not."""
        start = time.monotonic()
        try:
            models = self._client.with_options(timeout=min(self.config.timeout_s, 10.0)).models.list()
            names = [m.id for m in models.data]
        except self._openai.APIStatusError as exc:
            return False, self.config.redact(f"HTTP {exc.status_code} from {self.config.base_url}/models")
        except self._openai.APIError as exc:
            return False, self.config.redact(f"{self.config.base_url} did not answer: {type(exc).__name__}: {exc}")
        ms = (time.monotonic() - start) * 1e3
        has = self.config.model in names
        detail = (f"{self.config.base_url} answered in {ms:.0f} ms; model {self.config.model} "
                  + ("listed" if has else f"not listed (models: {', '.join(names[:8]) or 'none'})"))
        return True, self.config.redact(detail)

    # -- internals --------------------------------------------------------------------------------
    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        cap = self.config.backoff_cap_s
        if retry_after is not None and retry_after >= 0:
            return min(cap, retry_after)
        return float(min(cap, self.config.backoff_s * (2 ** attempt)) * (0.5 + 0.5 * self._rng.random()))

    def _with_retries(self, messages: list[Message], max_tokens: int) -> ChatResult:
        oa = self._openai
        start = time.monotonic()
        last = ""
        for attempt in range(self.config.max_retries + 1):
            retry_after: float | None = None
            try:
                result = self._once(messages, max_tokens, attempt + 1, start)
            except oa.RateLimitError as exc:
                last, retry_after = f"HTTP 429 (rate limited): {_short(exc)}", _retry_after(exc)
            except oa.APIStatusError as exc:
                if exc.status_code < 500:
                    self.ledger.count(failures=1)
                    raise LLMRequestRejected(self.config.redact(
                        f"{self.config.base_url} refused the request: HTTP {exc.status_code}: {_short(exc)}")) from None
                last, retry_after = f"HTTP {exc.status_code}: {_short(exc)}", _retry_after(exc)
            except oa.APITimeoutError:
                last = f"no answer within {self.config.timeout_s:g} s"
            except (oa.APIConnectionError, _StreamDropped) as exc:
                last = f"connection failed: {_short(exc)}"
            except Exception as exc:  # a body that is not a completion (an HTML error page, nothing at all)
                last = f"unreadable response ({type(exc).__name__}: {_short(exc)})"
            else:
                return result
            if attempt == self.config.max_retries:
                break
            delay = self._backoff(attempt, retry_after)
            self.ledger.count(retries=1)
            log.info("%s", self.config.redact(f"LLM request failed ({last}); retry {attempt + 1} of "
                                              f"{self.config.max_retries} in {delay:.1f} s"))
            self._sleep(delay)
        self.ledger.count(failures=1)
        raise LLMUnavailable(self.config.redact(
            f"{self.config.base_url}: no usable answer after {self.config.max_retries + 1} attempts; last: {last}"))

    def _once(self, messages: list[Message], max_tokens: int, attempt: int, start: float) -> ChatResult:
        cfg = self.config
        kw: dict[str, Any] = {"model": cfg.model, "messages": messages, "max_tokens": max_tokens,
                              "temperature": cfg.temperature}
        if not cfg.stream:
            resp = self._client.chat.completions.create(**kw)
            choices = getattr(resp, "choices", None) or []
            text = (choices[0].message.content or "") if choices else ""
            finish = choices[0].finish_reason if choices else None
            usage = getattr(resp, "usage", None)
            return self._charged(messages, text, finish, usage, attempt, start)
        parts: list[str] = []
        finish = None
        usage = None
        try:
            stream = self._client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
            for chunk in stream:
                if getattr(chunk, "usage", None):
                    usage = chunk.usage
                for choice in chunk.choices or []:
                    if choice.delta and choice.delta.content:
                        parts.append(choice.delta.content)
                    if choice.finish_reason:
                        finish = choice.finish_reason
        except (self._openai.APIStatusError, self._openai.APITimeoutError):
            raise
        except Exception as exc:  # a stream dropped mid-way: what arrived is kept, marked truncated
            if not parts:
                raise _StreamDropped(f"stream failed: {type(exc).__name__}") from None
            log.info("LLM stream ended early: %s", type(exc).__name__)
            finish = None
        if not parts and finish is None:  # nothing at all came back (an empty or non-SSE body): retried
            raise _StreamDropped("the stream carried no completion")
        return self._charged(messages, "".join(parts), finish, usage, attempt, start)

    def _charged(self, messages: list[Message], text: str, finish: str | None, usage: Any, attempt: int,
                 start: float) -> ChatResult:
        p = getattr(usage, "prompt_tokens", None) if usage is not None else None
        c = getattr(usage, "completion_tokens", None) if usage is not None else None
        estimated = p is None or c is None
        if p is None:
            p = sum(_estimate_tokens(m.get("content", "")) for m in messages)
        if c is None:
            c = _estimate_tokens(text) if text else 0
        self.ledger.charge(int(p), int(c), estimated)
        return ChatResult(text, finish, int(p), int(c), estimated, attempt, time.monotonic() - start, self.config.model)


def _short(exc: Exception) -> str:
    text = str(getattr(exc, "message", "") or exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _retry_after(exc: Any) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return float(value) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None
