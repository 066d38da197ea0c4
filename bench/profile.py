"""`python -m bench.profile`: where a batch's time goes, to say why a target is missed.

For one model's artifact (the bench's cached export, or `--artifact`) and each length pool, one
batch of `--batch` texts through `tei_runtime`, in-process, per variant the runtime picks on
this host (fp32 and int8):

- the split of `Model.embed`'s wall time: tokenization, `Session.run` (the runtime's own
  backend call, timed in place) and the rest (feeds, pooling, stacking, normalising);
- padding: the batch's real tokens against the padded tokens of the runtime's length-sorted
  pieces, and against one forward padded to the batch's longest text (what an engine that
  neither sorts nor cuts pays, fastembed for one);
- onnxruntime's op-level profile (`SessionOptions.enable_profiling`) of the same pieces, with
  the runtime's session options and graph: time by op type, warm-up runs left out;
- the matrix products in that profile against the host's GEMM limits (op_work.py): each
  product op's share of the limits reached, and the time of the ops with no products.

Medians over `--repeats`. Writes `<out>/<model>/profile.md` (and prints it). The served side
of a miss (the event loop and tokenizer threads against onnxruntime's on few cores) is
results.md's "Served cells" section (bench/served.py), measured in the served cells themselves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from bench.attention import positive_int
from bench.flops import Measured, measure_peak
from bench.limits import fp32_limit, int8_limit, peak_of
from bench.models import MODEL_KEYS, MODELS
from bench.op_work import OpRate, Work, op_rates
from bench.procs import cores, loadavg, machine
from bench.records import Peak
from bench.texts import make_pools

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DEFAULT_CACHE = REPO / "bench" / ".cache"
TOP_OPS = 8


class Padding(msgspec.Struct, frozen=True, kw_only=True):
    real: int
    """Tokens of the texts themselves (special tokens included)."""
    packed: int
    """Padded tokens of the runtime's pieces (longest x count, summed)."""
    pieces: int
    longest_padded: int
    """One forward of every text padded to the longest."""

    @property
    def packed_waste(self) -> float:
        return 1 - self.real / self.packed if self.packed else 0.0

    @property
    def longest_waste(self) -> float:
        return 1 - self.real / self.longest_padded if self.longest_padded else 0.0


def padding(lengths: Sequence[int], groups: Sequence[Sequence[int]]) -> Padding:
    """Padding of `groups` (index lists into `lengths`, the runtime's pieces)."""
    packed = sum(max(lengths[i] for i in g) * len(g) for g in groups if g)
    return Padding(
        real=sum(lengths),
        packed=packed,
        pieces=len([g for g in groups if g]),
        longest_padded=max(lengths, default=0) * len(lengths),
    )


class Split(msgspec.Struct, frozen=True, kw_only=True):
    total_ms: float
    tokenize_ms: float
    session_ms: float

    @property
    def other_ms(self) -> float:
        return max(self.total_ms - self.tokenize_ms - self.session_ms, 0.0)


def _timed(fn: Callable[..., Any], spent: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    return wrapper


def split(model: Any, texts: list[str], repeats: int) -> Split:
    """Medians of `repeats` embed calls, the backend's run timed in place."""
    session_spent: list[float] = []
    backend = model._backend
    original = backend.run
    backend.run = _timed(original, session_spent)
    totals, tokenize, sessions = [], [], []
    try:
        model.embed(texts)  # warm-up: first-shape allocations
        for _ in range(repeats):
            started = time.perf_counter()
            model.encode(texts, truncate=True)
            tokenize.append(time.perf_counter() - started)
            session_spent.clear()
            started = time.perf_counter()
            model.embed(texts)
            totals.append(time.perf_counter() - started)
            sessions.append(sum(session_spent))
    finally:
        backend.run = original
    return Split(
        total_ms=statistics.median(totals) * 1000,
        tokenize_ms=statistics.median(tokenize) * 1000,
        session_ms=statistics.median(sessions) * 1000,
    )


def profile_ops(model: Any, texts: list[str], repeats: int, work: Path) -> list[OpRate]:
    """The runtime's pieces of `texts` through a profiling session on the same graph."""
    from tei_runtime.packing import length_sorted_groups
    from tei_runtime.session import inference_session, session_options

    encodings = model.encode(texts, truncate=True)
    groups = length_sorted_groups([len(e) for e in encodings], model.packing)
    feeds = [model._feeds([encodings[i] for i in g])[0] for g in groups]
    options = session_options(model.choice)
    options.enable_profiling = True
    options.profile_file_prefix = str(work / "ort-profile")
    session = inference_session(model.artifact_dir / model.variant.file, model.choice, options)
    outputs = [session.get_outputs()[0].name]
    for feed in feeds:  # warm-up
        session.run(outputs, feed)
    for _ in range(repeats):
        for feed in feeds:
            session.run(outputs, feed)
    path = Path(session.end_profiling())
    events = json.loads(path.read_text())
    path.unlink(missing_ok=True)
    return op_rates(events, warmup_runs=len(feeds), batches=repeats)


class Row(msgspec.Struct, frozen=True, kw_only=True):
    length: str
    dtype: str
    variant: str
    texts: int
    """Texts in the profiled batch (fewer than --batch where --max-batch-tokens cuts it)."""
    texts_per_s: float
    split: Split
    padding: Padding
    ops: list[OpRate]
    limits: Peak
    """The host's GEMM limits read just before and just after this row."""


def batch_size(tokens: Sequence[int], batch: int, max_tokens: int | None) -> int:
    """`batch`, or fewer texts where their padded tokens would pass `max_tokens` (the
    runtime cuts a CPU batch into pieces of ~1024 tokens anyway, so a few pieces show the
    same op mix as many)."""
    if max_tokens is None:
        return batch
    longest = max(tokens[:batch], default=1)
    return max(1, min(batch, max_tokens // max(longest, 1)))


def _rows(artifact: Path, pools: dict[str, Any], lengths: list[str], dtypes: list[str],
          batch: int, repeats: int, max_tokens: int | None,
          measure: Callable[[], Measured], threads: int) -> list[Row]:  # fmt: skip
    import tei_runtime
    from tei_runtime.packing import length_sorted_groups

    rows = []
    reading = measure()
    with tempfile.TemporaryDirectory(prefix="tei-bench-profile-") as tmp:
        for dtype in dtypes:
            model = tei_runtime.load(artifact, device="cpu", dtype=dtype)
            for length in lengths:
                pool = pools[length]
                texts = pool.texts[: batch_size(pool.tokens, batch, max_tokens)]
                encodings = model.encode(texts, truncate=True)
                sizes = [len(e) for e in encodings]
                pad = padding(sizes, length_sorted_groups(sizes, model.packing))
                spent = split(model, texts, repeats)
                ops = profile_ops(model, texts, repeats, Path(tmp))
                after = measure()
                rows.append(Row(length=length, dtype=dtype, variant=model.variant.file,
                                texts=len(texts), texts_per_s=len(texts) / (spent.total_ms / 1000),
                                split=spent, padding=pad, ops=ops,
                                limits=peak_of([reading, after], threads)))  # fmt: skip
                reading = after
                print(f"  {length} {dtype}: {rows[-1].texts_per_s:.1f} texts/s", flush=True)
    return rows


def render(model_name: str, host: str, rows: list[Row], batch: int, repeats: int,
           load: tuple[list[float], list[float]]) -> str:  # fmt: skip
    out = [
        f"# Profile: {model_name}, batches of up to {batch} texts, in-process `tei_runtime`",
        "",
        f"Host: {host}. Run at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Load "
        f"average before {load[0]}, after {load[1]}. Medians of {repeats} "
        "repeats after a warm-up. `python -m bench.profile` (bench/profile.py) wrote this.",
        "",
        "## Where an embed call's time goes",
        "",
        "| length | variant | texts | texts/s | ms/batch | tokenize | Session.run | other "
        "| pieces | padding (runtime's pieces) | padding (one forward, longest) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        s, p = r.split, r.padding
        out.append(
            f"| {r.length} | {r.variant} | {r.texts} | {r.texts_per_s:.1f} | {s.total_ms:.1f} "
            f"| {s.tokenize_ms / s.total_ms:.0%} | {s.session_ms / s.total_ms:.0%} "
            f"| {s.other_ms / s.total_ms:.0%} | {p.pieces} | {p.packed_waste:.0%} "
            f"| {p.longest_waste:.0%} |"
        )
    out += ["", f"## onnxruntime op time by type (top {TOP_OPS}, share of node time)", ""]
    for r in rows:
        whole = sum(o.ms_per_batch for o in r.ops) or 1.0
        ops = ", ".join(f"{o.op} {o.ms_per_batch / whole:.0%} ({o.ms_per_batch:.1f} ms)"
                        for o in r.ops[:TOP_OPS])  # fmt: skip
        out.append(f"- {r.length}, {r.variant}: {ops or 'no node events'}")
    out += ["", *products_section(rows), ""]
    return "\n".join(out)


def products_section(rows: list[Row]) -> list[str]:
    """Each row's matrix products against the host's GEMM limits, and the ops that have none."""
    out = [
        "## Matrix products against the host's limits",
        "",
        "The limits as the bench measures them (numpy's sgemm, onnxruntime's MatMulInteger), "
        "read by this command before the first row and after each; a row is held to the faster "
        "of the readings on either side of it, since some hosts change speed for tens of "
        "seconds and a row and its readings mostly share a phase. An op's matrix-product work "
        "(from the profiled shapes; a fused attention op: its Q/K/V projection in the graph's "
        "precision and its core, scores and weighted values, in fp32) at those rates, against "
        "its node time, says how near the limits each op runs (onnxruntime's own kernels can "
        "pass 100% where they beat the limits' GEMMs at these shapes). What the ops with no "
        "products take is what keeps the whole graph from the limits.",
        "",
    ]
    for r in rows:
        whole = sum(o.ms_per_batch for o in r.ops)
        if not whole:
            out.append(f"- {r.length}, {r.variant}: no node events")
            continue
        fp32, int8 = fp32_limit(r.limits), int8_limit(r.limits)
        shown = f"{fp32:.0f} GFLOP/s, " + (f"{int8:.0f} GOP/s" if int8 else
                                           "int8 not measured (int8 work at fp32's rate)")
        products = [o for o in r.ops if o.work != Work()]
        rest = [o for o in r.ops if o.work == Work()]
        at_limits = sum(o.at_limits_ms(fp32, int8) for o in products)
        rest_ms = sum(o.ms_per_batch for o in rest)
        each = ", ".join(f"{o.op} {o.reached(fp32, int8):.0%} ({o.ms_per_batch:.1f} ms)"
                         for o in products)  # fmt: skip
        others = ", ".join(f"{o.op} {o.ms_per_batch:.1f}" for o in rest[:TOP_OPS])
        out.append(
            f"- {r.length}, {r.variant} (limits {shown}): node time {whole:.1f} ms, its "
            f"products at the limits {at_limits:.1f} ms ({at_limits / whole:.0%} of the limits "
            f"reached); by op: {each or 'none'}; ops with no products {rest_ms:.1f} ms "
            f"({rest_ms / whole:.0%} of node time){': ' + others + ' ms' if others else ''}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    p.add_argument("--models", default="minilm", help=f"comma list of {', '.join(MODEL_KEYS)}")
    p.add_argument("--lengths", default="", help="comma list (default: the model's own)")
    p.add_argument("--dtypes", default="float32,int8")
    p.add_argument("--batch", type=positive_int, default=32)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--max-batch-tokens", type=int, default=None,
                   help="profile fewer texts where a batch would pass this many padded tokens "
                   "(the big shapes: a 32 x 512 batch of the 0.6B model is minutes)")  # fmt: skip
    p.add_argument("--artifact", type=Path, default=None,
                   help="artifact of the one model profiled (default: the bench's cached "
                   "export, made as `python -m bench` makes it)")  # fmt: skip
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--peak-n", type=positive_int, default=2048,
                   help="the square GEMMs' size for the host's limits (the bench's own)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    # the bench's own cache keys, exports and checks
    from bench.run import DTYPES, _artifact, _checkpoint, timed_lengths

    keys = list(dict.fromkeys(k for k in args.models.split(",") if k))
    unknown = set(keys) - set(MODEL_KEYS)
    if unknown:
        raise SystemExit(f"unknown models {sorted(unknown)}; known: {', '.join(MODEL_KEYS)}")
    if bad := [d for d in args.dtypes.split(",") if d not in DTYPES]:
        raise SystemExit(f"unknown dtypes {bad}; known: float32 (fp32), float16 (fp16), int8")
    dtypes = list(dict.fromkeys(DTYPES[d] for d in args.dtypes.split(",")))
    wanted_lengths = [x for x in args.lengths.split(",") if x]
    for key in keys:
        timed_lengths(MODELS[key], wanted_lengths)
    if args.artifact is not None and not (args.artifact / "manifest.json").is_file():
        raise SystemExit(f"--artifact {args.artifact}: no manifest.json, not an artifact")
    # The artifact `python -m bench` made (fp32 and int8) serves either alone too.
    exported = ["float32", "int8"] if set(dtypes) <= {"float32", "int8"} else dtypes
    host_facts = machine({})
    host = f"{host_facts.cpu}, {host_facts.cores} CPUs, ISA {' '.join(host_facts.isa) or 'none'}"
    for key in keys:
        bm = MODELS[key]
        artifact = args.artifact or _artifact(
            None, _checkpoint(bm, None, args.cache), args.cache, exported
        )
        manifest = msgspec.json.decode((artifact / "manifest.json").read_bytes())
        max_len = min(int(manifest["max_input_length"]), bm.max_tokens)
        targets = {k: min(v, max_len) for k, v in bm.targets.items()}
        pools = make_pools(artifact, max(args.batch, 32), max_len, targets)
        lengths = timed_lengths(bm, wanted_lengths) if wanted_lengths else [*bm.targets, "mixed"]
        before = loadavg()
        print(f"bench.profile: {key} on {host}", flush=True)
        # The limits the bench holds engines to, read again here with the runtime's thread
        # count (every core), in a process of their own.
        rows = _rows(artifact, pools, lengths, dtypes, args.batch, args.repeats,
                     args.max_batch_tokens, lambda: measure_peak(args.peak_n, cores()),
                     cores())  # fmt: skip
        text = render(bm.name, host, rows, args.batch, args.repeats, (before, loadavg()))
        folder = args.out / key
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "profile.md").write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
