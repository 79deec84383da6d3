"""`kstrata optimize CACHE_DIR --launches RECORDS` and `kstrata optimize --out OUT -- CMD ...`: the
compiled-kernel optimizer's command line (kstrata.agents.compiled); `kstrata optimize` sends a Triton
cache directory, or a command of two or more words, here. A command is run once under `kstrata record`
with `TRITON_CACHE_DIR=OUT/triton-cache` (and a fresh Inductor cache, so Inductor compiles its kernels
there), its launches recorded in `OUT/records`, and the cache then optimized into `OUT/optimized`.

Exit codes: 0 the run finished (whether or not a kernel got faster: the report says); 2 a user error
(no such directory, an output inside the cache, a bad option), one line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kstrata.tools.console import emit_json, err, out


def run_compiled(cache_dir: Path, out_dir: Path, launches: Path | None, *, budget: int, minutes: float, device: str,
                 spaces: str, exact: bool, seed: int, jobs: int, engine_cache: Path | None, only: list[str] | None,
                 max_edits: int, timeout: float, as_json: bool, llm: Any = None) -> None:
    """`llm`: an `llm.setup.LLMSetup` whose kernel-level answers join each kernel's search (`--llm`)."""
    from kstrata.agents.compiled.run import CompiledOptions, optimize_cache
    from kstrata.agents.roofline import DEFAULT_CEILINGS_DIR
    from kstrata.ir.errors import KstrataError

    if device not in ("", "cuda", "cpu"):
        raise KstrataError(f"--device {device!r}: choose cuda or cpu")
    stream = err if as_json else out

    def progress(msg: str) -> None:
        if stream.is_terminal:
            stream.print(msg, highlight=False, markup=False, soft_wrap=True)
        else:
            print(msg, file=sys.stderr if as_json else sys.stdout, flush=True)

    opts = CompiledOptions(budget=budget, minutes=minutes, device=device, exact=exact,
                           spaces=tuple(s.strip() for s in spaces.split(",") if s.strip()) or None, seed=seed,
                           jobs=jobs, engine_cache=str(engine_cache) if engine_cache else None,
                           only=tuple(only or ()), max_edits=max_edits, timeout_s=timeout, progress=progress,
                           llm=llm.kernel if llm is not None else None,
                           ceilings_dir=str(DEFAULT_CEILINGS_DIR))
    report = optimize_cache(cache_dir, launches, out_dir, opts)
    payload: dict[str, Any] = report.to_json()
    if llm is not None:  # tokens and cost of the model's answers; never the key
        payload["llm"] = {"config": llm.client.config.to_json(), "usage": llm.client.ledger.to_json(),
                          "kernel_attempts": llm.kernel.attempts if llm.kernel else []}
    if as_json:
        emit_json(payload)
        return
    for k in report.kernels:
        out.print(f"{k['name']} ({k['target']}, share {k['share']:.1%}): " if k.get("share") is not None
                  else f"{k['name']} ({k['target']}): ", end="", highlight=False)
        out.print(k.get("skip") or k.get("result", ""), highlight=False, markup=False)
    for note in report.notes:
        out.print(f"note: {note}", highlight=False, markup=False)
    if llm is not None:
        u = payload["llm"]["usage"]
        answers = payload["llm"]["kernel_attempts"]
        out.print(f"LLM: {len(answers)} kernel-level answers ({sum(a['outcome'] == 'accepted' for a in answers)} "
                  f"accepted), {u['requests']} requests, {u['tokens']} tokens", highlight=False, markup=False)
    out.print(f"report: {Path(report.out) / 'optimize-compiled.md'}", highlight=False, markup=False)


def run_binary(binary: Path, out_dir: Path, launches: Path, *, as_json: bool) -> None:
    """A bare hsaco: in-place patches, written unmeasured (`kstrata.agents.compiled.binary`)."""
    from kstrata.agents.compiled.binary import optimize_binary

    report = optimize_binary(binary, launches, out_dir)
    if as_json:
        emit_json(report.to_json())
        return
    for c in report.candidates:
        line = f"{report.kernel} ({report.target}): {c['edit']}: {c['status']}"
        if c.get("edits"):
            line += f", {c['edits']} instructions patched in place -> {c.get('written', 'not written')} ({c['unmeasured']})"
        elif c.get("reason"):
            line += f": {c['reason']}"
        out.print(line, highlight=False, markup=False)
    for note in report.notes:
        out.print(f"note: {note}", highlight=False, markup=False)
    out.print(f"report: {Path(report.out) / 'optimize-binary.json'}", highlight=False, markup=False)


def record_and_optimize(command: list[str], out_dir: Path, **options: Any) -> None:
    """Run `command` under the launch recorder with its own Triton cache, then optimize that cache."""

    from kstrata.ir.errors import KstrataError
    from kstrata.ir.files import make_dir
    from kstrata.tools.record import record_command

    make_dir(out_dir, "record directory")
    cache, records = out_dir / "triton-cache", out_dir / "records"
    env = {"TRITON_CACHE_DIR": str(cache.resolve()), "TORCHINDUCTOR_CACHE_DIR": str((out_dir / "inductor-cache").resolve())}
    try:
        code, recorded = record_command(command, records, env=env)
    except (FileNotFoundError, PermissionError) as exc:
        raise KstrataError(f"cannot run {command[0]!r}: {exc.strerror}") from None
    if code != 0:
        raise KstrataError(f"the recorded program {' '.join(command)} exited with {code}; nothing was optimized")
    if not recorded:
        raise KstrataError(f"the program {' '.join(command)} launched no Triton kernel: nothing to optimize")
    (err if options.get("as_json") else out).print(f"recorded {len(recorded)} launches into {records}",
                                                   highlight=False, markup=False)
    run_compiled(cache, out_dir / "optimized", records, **options)
