"""A fuzzer for the `kstrata` command line: corrupt inputs, run commands in child processes, classify.

Every input a user hands the CLI — IR files, cache entries, patches, launch records, pipelines, task
files — is corrupted in the ways real files go wrong: truncated, byte-flipped, not UTF-8, a directory
where a file belongs, invalid JSON, deeply nested, one huge line, unknown ops, truncated string
literals, markup characters; task files that raise, loop, sleep, fork, exit or crash. Each case runs
one `kstrata` command in a child process of its own session, with a timeout, and is classified:

- `clean`     exit 2 and a short stderr (at most `MAX_ERROR_BYTES`) with an `error:` line (what a user error
              must be; a pipeline error adds a caret line under the spelling it points at);
- `ok`        exit 0;
- `failed`    exit 1 without a traceback (a check that rejects: a verify verdict, a contract that fails),
              or verify's exit 3 (`unproven`);
- `traceback` a Python traceback on stderr (a bug: every one is listed with its exception class);
- `signal`    killed by a signal (SIGSEGV, SIGABRT: a crash of the kstrata process itself);
- `hang`      still running at the timeout (its whole process group is killed);
- `noisy`     any other exit, or an error longer than `MAX_ERROR_BYTES` (quoted input must be cut).

`python -m kstrata.tools.fuzz_cli --results testsuite/results` runs every case and writes
`fuzz-cli-<date>.md`/`.json` with the counts and each non-clean case; `--sample N --seed S` runs a
seeded sample (what the test does).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: A user error is one line; anything longer than this quotes too much of the input.
MAX_ERROR_BYTES = 4096
CLASSES = ("clean", "ok", "failed", "traceback", "signal", "hang", "noisy")


@dataclass(frozen=True)
class Case:
    """One command on one (corrupted) input."""

    name: str  # input kind / mutation / command
    argv: tuple[str, ...]  # arguments after `kstrata`
    timeout_s: float = 60.0
    #: Classes this case may end in without being a bug (default: clean, ok, failed).
    allowed: tuple[str, ...] = ("clean", "ok", "failed")
    #: Writes the files the case reads (run just before it).
    setup: tuple[Callable[[], None], ...] = field(default=(), compare=False, repr=False)
    #: What runs `argv`: the kstrata CLI (the classifier's own tests run `python -c` instead).
    launcher: tuple[str, ...] = ("-m", "kstrata.tools.cli")


@dataclass
class Outcome:
    case: str
    argv: list[str]
    cls: str
    rc: int | None
    seconds: float
    detail: str  # the exception class and innermost kstrata frame, the signal, or the error line
    stderr_bytes: int
    bug: bool = field(default=False)


# ---------------------------------------------------------------------------------------------------
# Seeds: small valid inputs, built once
# ---------------------------------------------------------------------------------------------------
_TASK = '''import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.randn(64, 32)]


def get_init_inputs():
    return [2.0]
'''

_CANDIDATE = _TASK.replace("class Model(", "class ModelNew(")

#: Task-file bodies that misbehave: each replaces one of the task's functions.
_BAD_TASK_CODE = {
    "import-raises": "raise RuntimeError('boom at import')\n",
    "import-loops": "while True:\n    pass\n",
    "import-sleeps": "import time\ntime.sleep(3600)\n",
    "import-system-exit-0": "raise SystemExit(0)\n",
    "import-os-exit-0": "import os\nos._exit(0)\n",
    "import-os-exit-3": "import os\nos._exit(3)\n",
    "import-keyboard-interrupt": "raise KeyboardInterrupt\n",
    "import-segfault": "import ctypes\nctypes.string_at(0)\n",
    "import-abort": "import os\nos.abort()\n",
    "import-thread": "import threading, time\nthreading.Thread(target=lambda: time.sleep(3600)).start()\n",
    "import-fork": "import os, time\nif os.fork() == 0:\n    time.sleep(3600)\n    os._exit(0)\n",
    "import-recursion": "def f(n):\n    return f(n + 1)\nf(0)\n",
    "import-markup": "raise ValueError('[/] [bold]not markup[/bold]')\n",
    "get-inputs-loops": "def get_inputs():\n    while True:\n        pass\n",
    "get-inputs-exits": "def get_inputs():\n    raise SystemExit(0)\n",
    "get-inputs-huge-message": "def get_inputs():\n    raise ValueError('x' * (8 << 20))\n",
    "init-sleeps": ("class Model(nn.Module):\n    def __init__(self, scale):\n        super().__init__()\n"
                    "        import time\n        time.sleep(3600)\n    def forward(self, x):\n        return x\n"),
    "forward-loops": ("class Model(nn.Module):\n    def __init__(self, scale):\n        super().__init__()\n"
                      "    def forward(self, x):\n        while True:\n            pass\n"),
    "forward-os-exit": ("class Model(nn.Module):\n    def __init__(self, scale):\n        super().__init__()\n"
                        "    def forward(self, x):\n        import os\n        os._exit(0)\n"),
}


def build_seeds(work: Path) -> dict[str, Path]:
    """Valid inputs under `work`: a cuda:90 and a hip:gfx942 cache entry of `vector_add`, their levels as
    files, a patch, a launch record, a task and a candidate."""
    from kstrata.ir.target import Target
    from kstrata.tools.suite import load_suite

    suite = load_suite()  # tools/ reach the project's kernels through the entry point, never by import
    build_suite, suite_launch_record = suite.build_suite, suite.suite_launch_record
    kernel = next(k for k in suite.all_kernels() if k.name == "vector_add")
    cache = work / "seed-cache"
    seeds: dict[str, Path] = {"cache": cache}
    for spelling, key in (("cuda:90", "entry-cuda"), ("hip:gfx942", "entry-hip")):
        res = build_suite(Target.parse(spelling), cache, [kernel])
        if res.errors:
            raise RuntimeError(f"seed build failed for {spelling}: {res.errors}")
        bundle = res.bundles["vector_add"]
        seeds[key] = Path(str(bundle.origin))
    for level in ("ttir", "ttgir", "llir", "ptx"):
        seeds[level] = next(seeds["entry-cuda"].glob(f"*.{level}"))
    seeds["amdgcn"] = next(seeds["entry-hip"].glob("*.amdgcn"))
    ptx = seeds["ptx"].read_text()
    line = next(ln for ln in ptx.splitlines() if "ld.global" in ln)
    patch = work / "seed.patch"
    patch.write_text("# kstrata asm patch v1\nlevel: ptx\nkernel: vector_add_kernel\ndescription: nc loads\n\n"
                     f"@@\n-{line}\n+{line.replace('ld.global', 'ld.global.nc', 1)}\n")
    seeds["patch"] = patch
    record = suite_launch_record(kernel, "cuda:90")
    seeds["launch"] = record.save(work / "seed-launch.json")
    (work / "seed-task.py").write_text(_TASK)
    (work / "seed-candidate.py").write_text(_CANDIDATE)
    seeds["task"] = work / "seed-task.py"
    seeds["candidate"] = work / "seed-candidate.py"
    return seeds


# ---------------------------------------------------------------------------------------------------
# Mutations: bytes → bytes (or a directory)
# ---------------------------------------------------------------------------------------------------
Mutation = Callable[[bytes, random.Random], bytes]


def _truncate(frac: float) -> Mutation:
    return lambda data, rng: data[: int(len(data) * frac)]


def _flip(n: int) -> Mutation:
    def flip(data: bytes, rng: random.Random) -> bytes:
        b = bytearray(data)
        for _ in range(n):
            if b:
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    return flip


def _non_utf8(data: bytes, rng: random.Random) -> bytes:
    i = rng.randrange(max(1, len(data)))
    return data[:i] + b"\xff\xfe\xc3(" + data[i:]


def _huge_line(data: bytes, rng: random.Random) -> bytes:
    return data + b"\n" + b"x" * (10 << 20) + b"\n"


def _huge_line_start(data: bytes, rng: random.Random) -> bytes:
    return b"A" * (10 << 20) + data


def _deep_nesting(data: bytes, rng: random.Random) -> bytes:
    # Nested types: recursive-descent parsers recurse once per level.
    deep = b"!tt.ptr<" * 20000 + b"f32" + b">" * 20000
    return data.replace(b"f32", deep, 1) if b"f32" in data else data + b"\n" + deep + b"\n"


def _deep_json(data: bytes, rng: random.Random) -> bytes:
    return b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}"


def _unknown_op(data: bytes, rng: random.Random) -> bytes:
    text = data.decode("utf-8", "replace")
    ops = re.findall(r"= ([a-z_]+\.[a-z_]+)", text)
    if not ops:
        return data + b"\nfrobnicate.op\n"
    op = rng.choice(ops)
    return text.replace(op, "tt.frobnicate", 1).encode()


def _string_unterminated(data: bytes, rng: random.Random) -> bytes:
    # xDSL's string lexer never returns on an unterminated literal of 28+ characters.
    text = data.decode("utf-8", "replace")
    i = text.find('"')
    cut = len(text) if i < 0 else i
    return (text[:cut] + '"' + "a" * 60).encode()


def _markup(data: bytes, rng: random.Random) -> bytes:
    return b"[/] [bold]x[/bold] [red]" + data


def _empty(data: bytes, rng: random.Random) -> bytes:
    return b""


def _binary_noise(data: bytes, rng: random.Random) -> bytes:
    return bytes(rng.randrange(256) for _ in range(4096))


def _invalid_json(data: bytes, rng: random.Random) -> bytes:
    return data[: len(data) // 2] + b"}{,"


def _json_wrong_types(data: bytes, rng: random.Random) -> bytes:
    try:
        obj = json.loads(data)
    except ValueError:
        return b"[]"
    if isinstance(obj, dict):
        keys = sorted(obj)
        if keys:
            k = rng.choice(keys)
            obj[k] = rng.choice([None, "x", [1, 2], {"backend": 1}, 1.5, -1])
    return json.dumps(obj).encode()


TEXT_MUTATIONS: dict[str, Mutation] = {
    "truncated-half": _truncate(0.5), "truncated-90": _truncate(0.9), "truncated-10": _truncate(0.1),
    "flip-1": _flip(1), "flip-16": _flip(16), "non-utf8": _non_utf8, "huge-line-end": _huge_line,
    "huge-line-start": _huge_line_start, "deep-nesting": _deep_nesting, "unknown-op": _unknown_op,
    "unterminated-string": _string_unterminated, "markup": _markup, "empty": _empty, "binary-noise": _binary_noise,
}
JSON_MUTATIONS: dict[str, Mutation] = {
    "truncated-half": _truncate(0.5), "invalid": _invalid_json, "wrong-types-1": _json_wrong_types,
    "wrong-types-2": _json_wrong_types, "wrong-types-3": _json_wrong_types, "deep": _deep_json,
    "non-utf8": _non_utf8, "empty": _empty, "huge-line": _huge_line_start,
}
BINARY_MUTATIONS: dict[str, Mutation] = {
    "truncated-half": _truncate(0.5), "truncated-10": _truncate(0.1), "flip-16": _flip(16), "flip-256": _flip(256),
    "empty": _empty, "binary-noise": _binary_noise,
}
PATCH_MUTATIONS: dict[str, Mutation] = {
    **{k: TEXT_MUTATIONS[k] for k in ("truncated-half", "flip-16", "non-utf8", "empty", "markup", "huge-line-end")},
    "wrong-anchor": lambda d, r: d.replace(b"@@\n", b"@@ $L__nowhere\n"),
    "no-header": lambda d, r: d.split(b"\n", 1)[1],
    "bad-level": lambda d, r: d.replace(b"level: ptx", b"level: sass"),
    "context-missing": lambda d, r: d.replace(b"\n-", b"\n-\tnot.an.instruction;\n-", 1),
    "huge-anchor": lambda d, r: d.replace(b"@@\n", b"@@ " + b"y" * (8 << 20) + b"\n"),
}

PIPELINES = (
    "ttgir(num-stages{n=4})", "ttgir(num-stages{n=-1})", "ttgir(num-stages{n=abc})", "ttgir(no-such-pass)",
    "ttgir(num-stages{n=4}", "ttgir(num-stages{m=4})", "(((", "", "ptx(cache-hints{loads=zz})",
    "llir(noalias-args{assume=maybe})", "[/]", "ttir(" * 5000, "ttgir(num-warps{n=" + "9" * 400 + "})",
    "sass(cache-hints)", "ptx(max-registers{n=0})",
)


class _Staged:
    """Files a case needs, written only when the case runs (a seeded sample writes only its own)."""

    def __init__(self) -> None:
        self.steps: list[Callable[[], None]] = []

    def write(self, path: Path, make: Callable[[], bytes]) -> Path:
        def step() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(make())
        self.steps.append(step)
        return path

    def mkdir(self, path: Path) -> Path:
        self.steps.append(lambda: path.mkdir(parents=True, exist_ok=True))
        return path

    def entry(self, seed: Path, dest: Path, change: Callable[[Path], None]) -> Path:
        def step() -> None:
            shutil.copytree(seed, dest)
            change(dest)
        self.steps.append(step)
        return dest

    def case(self, name: str, argv: tuple[str, ...], **kw: object) -> Case:
        steps, self.steps = self.steps, []
        return Case(name, argv, setup=tuple(steps), **kw)  # type: ignore[arg-type]

    def also(self, name: str, argv: tuple[str, ...], shared: Case, **kw: object) -> Case:
        """A second command on the files of `shared` (set up again: cases run independently)."""
        return Case(name, argv, setup=shared.setup, **kw)  # type: ignore[arg-type]


def generate_cases(seeds: dict[str, Path], work: Path, seed: int = 0) -> Iterator[Case]:
    """Every case: each mutation of each input kind under each command that reads it."""
    cuda, hip = seeds["entry-cuda"], seeds["entry-hip"]
    n = iter(range(10**9))
    st = _Staged()

    def fresh(name: str) -> Path:
        return work / "cases" / f"{next(n):05d}-{name}"

    def mutated(mut: Mutation, data: bytes, key: str) -> Callable[[], bytes]:
        return lambda: mut(data, random.Random(f"{seed}/{key}"))

    # IR files as files.
    for level in ("ttir", "ttgir", "llir", "ptx", "amdgcn"):
        data = seeds[level].read_bytes()
        pipe = {"ttir": "ttir(load-eviction{policy=evict_last})", "ttgir": "ttgir(num-stages{n=4})",
                "llir": "llir(noalias-args{assume=true})", "ptx": "ptx(cache-hints)",
                "amdgcn": "amdgcn(nontemporal-hints)"}[level]
        orig = hip if level == "amdgcn" else cuda
        for mname, mut in TEXT_MUTATIONS.items():
            base = f"{level}/{mname}"
            f = st.write(fresh(f"{level}-{mname}") / f"kernel.{level}", mutated(mut, data, base))
            first = st.case(f"{base}/ir-show", ("ir", "show", str(f)))
            yield first
            if level in ("ttir", "ttgir"):
                yield st.also(f"{base}/ir-roundtrip", ("ir", "roundtrip", str(f), "--no-compile"), first)
            yield st.also(f"{base}/passes-apply", ("passes", "apply", str(f), "-p", pipe), first)
            yield st.also(f"{base}/verify", ("verify", str(orig), str(f), "--device", "cpu"), first, timeout_s=120)
        d = st.mkdir(fresh(f"{level}-directory") / f"kernel.{level}")
        first = st.case(f"{level}/directory/ir-show", ("ir", "show", str(d)))
        yield first
        yield st.also(f"{level}/directory/passes-apply", ("passes", "apply", str(d), "-p", pipe), first)
        yield st.also(f"{level}/directory/verify", ("verify", str(orig), str(d), "--device", "cpu"), first)
    yield st.case("ir/missing/ir-show", ("ir", "show", str(work / "no-such.ttir")))
    yield st.case("ir/tilde/ir-show", ("ir", "show", "~/no-such-kstrata-file.ttir"))

    # Cache entries with one file corrupted, removed or replaced by a directory.
    for entry_seed, tag in ((cuda, "cuda"), (hip, "hip")):
        for art in sorted(entry_seed.iterdir()):
            ext = art.suffix.lstrip(".")
            muts = (JSON_MUTATIONS if ext == "json" else BINARY_MUTATIONS if ext in ("cubin", "hsaco")
                    else {k: TEXT_MUTATIONS[k] for k in ("truncated-half", "non-utf8", "flip-16", "empty",
                                                          "unterminated-string", "deep-nesting", "huge-line-end")})
            kind = "grp.json" if art.name.startswith("__grp") else art.name.split(".", 1)[-1]
            variants: list[tuple[str, Callable[[Path], None]]] = [
                (m, _mutate_file(muts[m], f"{seed}/{tag}/{kind}/{m}")) for m in muts]
            variants.append(("removed", Path.unlink))
            variants.append(("directory", _file_to_directory))
            for vname, change in variants:
                entry = st.entry(entry_seed, fresh(f"entry-{tag}-{kind}-{vname}") / entry_seed.name,
                                 _in_entry(change, art.name))
                base = f"entry-{tag}/{kind}/{vname}"
                first = st.case(f"{base}/bundle-show", ("bundle", "show", str(entry)))
                yield first
                yield st.also(f"{base}/asm-report", ("asm", "report", str(entry)), first)
                if tag == "cuda" and ext in ("ptx", "cubin", "json", "ttgir"):
                    yield st.also(f"{base}/run-passes", ("run-passes", str(entry.parent), "-p", "ptx(cache-hints)",
                                                         "--out", str(fresh("run-passes-out"))), first, timeout_s=120)
                    yield st.also(f"{base}/verify", ("verify", str(cuda), str(entry), "--device", "cpu"), first,
                                  timeout_s=120)
    yield st.case("entry/missing/bundle-show", ("bundle", "show", str(work / "no-such-entry")))
    yield st.case("entry/tilde/bundle-show", ("bundle", "show", "~/no-such-kstrata-cache"))
    yield st.case("entry/file-not-dir/bundle-show", ("bundle", "show", str(seeds["ptx"])))

    # Patches.
    pdata = seeds["patch"].read_bytes()
    for mname, mut in PATCH_MUTATIONS.items():
        p = st.write(fresh(f"patch-{mname}") / "k.patch", mutated(mut, pdata, f"patch/{mname}"))
        yield st.case(f"patch/{mname}/asm-patch", ("asm", "patch", str(cuda), str(p), "--out", str(fresh("patch-out"))))
    pd = st.mkdir(fresh("patch-directory") / "k.patch")
    yield st.case("patch/directory/asm-patch", ("asm", "patch", str(cuda), str(pd), "--out", str(fresh("patch-out"))))
    pj = st.write(fresh("patch-json") / "k.json", lambda: b'{"level": "ptx", "hunks": [{"anchor": 5}]}')
    yield st.case("patch/json-wrong-types/asm-patch", ("asm", "patch", str(cuda), str(pj), "--out", str(fresh("o"))))

    # Launch records.
    ldata = seeds["launch"].read_bytes()
    for mname, mut in JSON_MUTATIONS.items():
        lf = st.write(fresh(f"launch-{mname}") / "launch.json", mutated(mut, ldata, f"launch/{mname}"))
        yield st.case(f"launch/{mname}/verify", ("verify", str(cuda), str(cuda), "--launch", str(lf), "--device",
                                                  "cpu", "--seeds", "1"), timeout_s=180)
    other = json.loads(ldata)
    if isinstance(other.get("args"), list) and other["args"]:
        other["args"] = other["args"][:-1]
        short = json.dumps(other).encode()
        lf = st.write(fresh("launch-missing-arg") / "launch.json", lambda: short)
        yield st.case("launch/missing-arg/verify", ("verify", str(cuda), str(cuda), "--launch", str(lf), "--device",
                                                    "cpu", "--seeds", "1"), timeout_s=180)

    # Pipelines.
    for i, pipe in enumerate(PIPELINES):
        yield st.case(f"pipeline/{i}/passes-apply", ("passes", "apply", str(seeds["ttgir"]), "-p", pipe))
        yield st.case(f"pipeline/{i}/run-passes", ("run-passes", str(seeds["cache"]), "-p", pipe, "--out",
                                                    str(fresh("rp-out"))), timeout_s=120)

    # Task files.
    tdata = seeds["task"].read_bytes()
    for mname in ("truncated-half", "flip-16", "non-utf8", "empty", "markup", "huge-line-start", "binary-noise"):
        tf = st.write(fresh(f"task-{mname}") / "task.py", mutated(TEXT_MUTATIONS[mname], tdata, f"task/{mname}"))
        yield st.case(f"task/{mname}/task-show", ("task", "show", str(tf), "--timeout", "15"), timeout_s=90)
    for bname, code in _BAD_TASK_CODE.items():
        body = _replace_definition(_TASK, code).encode()
        tf = st.write(fresh(f"task-{bname}") / "task.py", _constant(body))
        first = st.case(f"task/{bname}/task-show", ("task", "show", str(tf), "--timeout", "15"), timeout_s=90)
        yield first
        yield st.also(f"task/{bname}/task-list", ("task", "list", str(tf.parent), "--timeout", "15"), first,
                      timeout_s=90)
    # eval: a misbehaving task, and a misbehaving candidate against a good task.
    good_task = st.write(fresh("eval-task") / "task.py", lambda: tdata)
    good_cand = st.write(fresh("eval-candidate") / "cand.py", lambda: _CANDIDATE.encode())
    yield st.case("eval/good/eval", ("eval", str(good_task), str(good_cand), "--device", "cpu", "--no-timing",
                                     "--trials", "5", "--timeout", "60"), timeout_s=300)
    for bname in ("import-loops", "import-os-exit-0", "import-segfault", "forward-loops", "get-inputs-exits"):
        bad_task = _replace_definition(_TASK, _BAD_TASK_CODE[bname]).encode()
        bad_cand = _replace_definition(_CANDIDATE, _BAD_TASK_CODE[bname].replace("class Model(", "class ModelNew(")
                                       ).encode()
        tf = st.write(fresh(f"eval-task-{bname}") / "task.py", _constant(bad_task))
        yield st.case(f"eval-task/{bname}/eval", ("eval", str(tf), str(good_cand), "--device", "cpu", "--no-timing",
                                                   "--trials", "5", "--timeout", "15"), timeout_s=300)
        cf = st.write(fresh(f"eval-cand-{bname}") / "cand.py", _constant(bad_cand))
        yield st.case(f"eval-candidate/{bname}/eval", ("eval", str(good_task), str(cf), "--device", "cpu",
                                                        "--no-timing", "--trials", "5", "--timeout", "15"),
                      timeout_s=300)
    td = st.mkdir(fresh("task-directory") / "task.py")
    yield st.case("task/directory/task-show", ("task", "show", str(td)))
    mixed = fresh("task-list-mixed")
    st.write(mixed / "1_good.py", lambda: tdata)
    exit3 = _replace_definition(_TASK, _BAD_TASK_CODE["import-os-exit-3"]).encode()
    segv = _replace_definition(_TASK, _BAD_TASK_CODE["import-segfault"]).encode()
    st.write(mixed / "2_exit.py", lambda: exit3)
    st.write(mixed / "3_segv.py", lambda: segv)
    yield st.case("task/mixed-dir/task-list", ("task", "list", str(mixed), "--timeout", "15"), timeout_s=120)


def _mutate_file(mut: Mutation, key: str) -> Callable[[Path], None]:
    def change(p: Path) -> None:
        p.write_bytes(mut(p.read_bytes(), random.Random(key)))
    return change


def _file_to_directory(p: Path) -> None:
    p.unlink()
    p.mkdir()


def _in_entry(change: Callable[[Path], None], name: str) -> Callable[[Path], None]:
    return lambda entry: change(entry / name)


def _constant(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def _replace_definition(source: str, code: str) -> str:
    """`source` with the top-level definition `code` defines replaced by `code` (or `code` appended)."""
    m = re.match(r"(def|class) (\w+)", code)
    if not m:
        return source + "\n" + code
    pat = re.compile(rf"^{m.group(1)} {m.group(2)}\b.*?(?=^\S|\Z)", re.S | re.M)
    return pat.sub(lambda _: code + "\n\n", source, count=1)


# ---------------------------------------------------------------------------------------------------
# Running and classifying
# ---------------------------------------------------------------------------------------------------
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)|[A-Za-z_][\w.]*\.\w+Error)\b")


def _traceback_detail(stderr: str) -> str:
    lines = stderr.splitlines()
    frames = re.findall(r'File "([^"]+)", line (\d+)', stderr)
    ours = [(f, ln) for f, ln in frames if "kstrata" in f or "/wt-" in f]
    exc = next((ln.split(":")[0] for ln in reversed(lines) if _EXC_LINE.match(ln)), lines[-1][:80] if lines else "?")
    where = ""
    if ours:
        f, ln = ours[-1]
        parts = Path(f).parts
        where = " at " + "/".join(parts[-2:]) + f":{ln}"
    return f"{exc}{where}"


def _error_lines(stderr: str) -> list[str]:
    """The lines of stderr from the first `error:` on (progress lines of `verify` come before it)."""
    lines = stderr.strip().splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.startswith("error:")), 0)
    return lines[first:]


def run_case(case: Case, env: dict[str, str], scratch: Path) -> Outcome:
    """Run one case in a child process of its own session; kill the whole group at the timeout."""
    argv = [sys.executable, *case.launcher, *case.argv]
    scratch.mkdir(parents=True, exist_ok=True)
    out_path, err_path = scratch / "stdout", scratch / "stderr"
    start = time.monotonic()
    # Files, not pipes: a grandchild left behind must not keep the reader waiting.
    with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
        proc = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=env, cwd=scratch,
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=case.timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the command and anything it left behind
            except ProcessLookupError:
                pass
            if rc is None:
                proc.wait()
    seconds = time.monotonic() - start
    stderr = err_path.read_bytes()
    text = stderr[-20000:].decode("utf-8", "replace")
    if rc is None:
        cls, detail = "hang", f"still running at {case.timeout_s:.0f} s"
    elif rc < 0:
        cls, detail = "signal", signal.Signals(-rc).name
    elif "Traceback (most recent call last)" in text:
        cls, detail = "traceback", _traceback_detail(text)
    elif len(stderr) > MAX_ERROR_BYTES and rc != 0:
        cls, detail = "noisy", f"exit {rc} with {len(stderr)} bytes of stderr"
    elif rc == 0:
        cls, detail = "ok", ""
    elif rc == 2 and text.strip() and _error_lines(text)[0].startswith("error:"):
        cls, detail = "clean", _error_lines(text)[0][:200]
    elif rc == 1 or (rc == 3 and case.argv[:1] == ("verify",)):  # verify's `unproven` verdict exits 3
        cls, detail = "failed", (text.strip().splitlines() or [""])[-1][:200]
    else:
        cls, detail = "noisy", f"exit {rc}: " + (text.strip().splitlines() or [""])[-1][:200]
    shutil.rmtree(scratch, ignore_errors=True)
    return Outcome(case.name, list(case.argv), cls, rc, round(seconds, 2), detail, len(stderr),
                   bug=cls not in case.allowed)


def child_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TRITON_CACHE_DIR"] = str(work / "triton-cache")
    env["HOME"] = str(work / "home")  # `~` expands somewhere harmless
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONFAULTHANDLER"] = ""
    (work / "home").mkdir(parents=True, exist_ok=True)
    return env


def run_cases(cases: list[Case], work: Path, jobs: int = 2,
              on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run `cases`, `jobs` at a time; cases that share their files run one after the other."""
    env = child_env(work)
    groups: dict[int, list[tuple[int, Case]]] = {}
    for i, c in enumerate(cases):
        groups.setdefault(id(c.setup) if c.setup else -i - 1, []).append((i, c))

    def one(group: list[tuple[int, Case]]) -> list[tuple[int, Outcome]]:
        for step in group[0][1].setup:
            step()
        done = []
        for i, c in group:
            o = run_case(c, env, work / "run" / f"{i:05d}")
            if on_outcome:
                on_outcome(o)
            done.append((i, o))
        return done

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = [r for rs in pool.map(one, groups.values()) for r in rs]
    return [o for _, o in sorted(results, key=lambda r: r[0])]


def summarize(outcomes: list[Outcome]) -> dict[str, object]:
    counts = Counter(o.cls for o in outcomes)
    by_detail = Counter(o.detail for o in outcomes if o.cls in ("traceback", "signal", "hang", "noisy"))
    return {"cases": len(outcomes), "counts": {c: counts.get(c, 0) for c in CLASSES},
            "bugs": sum(o.bug for o in outcomes), "classes": by_detail.most_common()}


def _markdown(summary: dict[str, object], outcomes: list[Outcome], meta: dict[str, str]) -> str:
    counts = summary["counts"]
    assert isinstance(counts, dict)
    lines = [f"# CLI fuzzer, {meta['date']}", "",
             f"`{meta.get('command') or 'python -m kstrata.tools.fuzz_cli'}` (seed {meta['seed']}, "
             f"{meta['jobs']} jobs, {meta['seconds']} s on {meta['host']}; kstrata {meta['kstrata']}, "
             f"Python {meta['python']}" + (f"; {meta['label']}" if meta.get("label") else "") + ").", "",
             f"{summary['cases']} cases; bugs (not clean/ok/failed): {summary['bugs']}.", "",
             "| class | cases |", "|---|---|"]
    lines += [f"| {c} | {counts[c]} |" for c in CLASSES]
    bad = [o for o in outcomes if o.bug]
    if bad:
        lines += ["", "## Cases that are bugs", "", "| case | class | detail |", "|---|---|---|"]
        lines += [f"| `{o.case}` | {o.cls} | {o.detail.replace('|', '/')} |" for o in bad]
    slow = sorted((o for o in outcomes if not o.bug), key=lambda o: -o.seconds)[:10]
    lines += ["", "## Slowest cases", "", "| case | class | seconds |", "|---|---|---|"]
    lines += [f"| `{o.case}` | {o.cls} | {o.seconds} |" for o in slow]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, help="Write fuzz-cli-<date>.md/.json here.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample", type=int, help="Run only this many cases (a seeded sample).")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", help="Only cases whose name contains this.")
    ap.add_argument("--work", type=Path, help="Work directory (default: a temporary one).")
    ap.add_argument("--label", default="", help="What was fuzzed (e.g. the commit), written into the results.")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="kstrata-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    seeds = build_seeds(work)
    cases = list(generate_cases(seeds, work, args.seed))
    if args.only:
        cases = [c for c in cases if args.only in c.name]
    if args.sample:
        cases = random.Random(args.seed).sample(cases, min(args.sample, len(cases)))
    start = time.monotonic()

    def show(o: Outcome) -> None:
        if o.bug:
            print(f"{o.cls:9s} {o.case}: {o.detail}", flush=True)

    outcomes = run_cases(cases, work, jobs=args.jobs, on_outcome=show)
    summary = summarize(outcomes)
    print(json.dumps(summary["counts"]), f"bugs={summary['bugs']}")
    if args.results:
        from kstrata import __version__

        date = _dt.date.today().isoformat()
        meta = {"date": date, "seed": str(args.seed), "jobs": str(args.jobs),
                "seconds": f"{time.monotonic() - start:.0f}", "host": f"{os.cpu_count()} CPUs",
                "kstrata": __version__, "python": sys.version.split()[0], "label": args.label,
                "command": "python -m kstrata.tools.fuzz_cli " + " ".join(
                    shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))}
        args.results.mkdir(parents=True, exist_ok=True)
        stem, n = f"fuzz-cli-{date}", 1
        while (args.results / f"{stem}.md").exists():  # an earlier run of the day is kept
            n += 1
            stem = f"fuzz-cli-{date}-{n}"
        (args.results / f"{stem}.md").write_text(_markdown(summary, outcomes, meta))
        (args.results / f"{stem}.json").write_text(json.dumps(
            {"meta": meta, "summary": summary, "outcomes": [asdict(o) for o in outcomes]}, indent=1) + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if summary["bugs"] else 0


if __name__ == "__main__":
    sys.exit(main())
