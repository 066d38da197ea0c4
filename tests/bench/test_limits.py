"""The bench's pure parts: FLOPs of grouped-query shapes, limits, fractions, tables. No timing."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from bench import graph_choice, host_speed, report, served
from bench.config import BIG, engines, graph_of
from bench.flops import flops_per_token, model_shape
from bench.limits import fraction, limit_line, limit_of
from bench.models import MODELS, _save_sentence_transformers, recipe_digest
from bench.records import Cell, EngineRun, Floor, Machine, Model, Peak, Run
from bench.run import Options, sizes_for, timed_lengths

PEAK = Peak(fp32_gflops=[100.0, 120.0, 110.0], int8_gops=[300.0, 340.0], threads=2,
            blas="openblas 0.3.29 (Zen kernel, pthreads, 2 threads)",
            int8_forms={"u8s8": 300.0, "u8u8": 150.0})  # fmt: skip


def test_qwen3_shape_counts_grouped_attention_and_a_gated_ffn(tmp_path: Path) -> None:
    cfg = {k: v for k, v in MODELS["qwen3-0.6b"].config.items()}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = model_shape(tmp_path, "q", 512)
    assert (m.attention_width, m.kv_width, m.ffn_matrices) == (2048, 1024, 3)
    h, a, k, i, n = 1024, 2048, 1024, 3072, 512
    per_layer = 2 * h * a + 2 * h * k + 3 * h * i + 2 * n * a
    assert flops_per_token(m, n) == 2 * 28 * per_layer
    # ~1 GFLOP per token at 512: 32 x 512 tokens is ~17 TFLOP, minutes on 2 cores
    assert 0.9e9 < flops_per_token(m, n) < 1.1e9


def test_bert_shape_is_the_plain_formula(tmp_path: Path) -> None:
    cfg = {k: v for k, v in MODELS["bert-base"].config.items()}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = model_shape(tmp_path, "b", 512)
    h, i = 768, 3072
    assert flops_per_token(m, 128) == 2 * 12 * (4 * h * h + 2 * h * i + 2 * 128 * h)


def test_int8_engines_are_held_to_the_int8_limit() -> None:
    # the fastest reading: a slow phase never lowers a limit
    assert limit_of("runtime-int8", PEAK) == ("int8", 340.0)
    assert limit_of("serve-int8", PEAK)[0] == "int8"
    for engine in ("st", "runtime-fp32", "serve-fp32", "fastembed", "infinity-optimum"):
        assert limit_of(engine, PEAK) == ("fp32", 120.0)
    unmeasured = Peak(fp32_gflops=[100.0], int8_gops=[], threads=2)
    assert limit_of("runtime-int8", unmeasured) == ("int8", None)
    assert fraction(55.0, 110.0) == 0.5
    assert fraction(55.0, None) is None


def test_limit_line_names_blas_kernel_and_int8_forms() -> None:
    line = limit_line(PEAK)
    assert "100 / 120 / 110 GFLOP/s" in line
    assert "300 / 340 GOP/s" in line
    assert "u8s8 300, u8u8 150" in line
    assert "Zen kernel" in line


def _cell(engine: str, length: str, batch: int, seconds: float, gflop: float) -> Cell:
    return Cell(engine=engine, length=length, batch=batch, concurrency=1, repeat=0,
                texts=batch * 4, tokens=batch * 64, flops=gflop * 1e9, seconds=seconds,
                p50_ms=seconds * 250, p99_ms=seconds * 300)  # fmt: skip


def _run(key: str) -> Run:
    cells = {
        "st": [_cell("st", "short", 1, 1.0, 10), _cell("st", "long", 32, 4.0, 220)],
        "runtime-fp32": [_cell("runtime-fp32", "short", 1, 0.2, 10),
                         _cell("runtime-fp32", "long", 32, 2.0, 220)],
        "runtime-int8": [_cell("runtime-int8", "short", 1, 0.1, 10),
                         _cell("runtime-int8", "long", 32, 1.0, 220)],
    }  # fmt: skip
    return Run(
        started="2026-12-03T19:00:00+00:00", quick=False, command="python -m bench",
        load_before=[1.0, 1.0, 1.0], load_after=[2.0, 2.0, 2.0],
        machine=Machine(cpu="AMD EPYC", cores=2, isa=["avx2", "fma"], memory_gb=24.0,
                        python="3.11", versions={}),
        peak=PEAK,
        model=Model(name=key, key=key, layers=12, hidden=768, intermediate=3072,
                    max_length=512, mflops_per_token_at_128=170.0),
        workloads={"short": 16.0, "long": 512.0},
        engines=[EngineRun(engine=e, repeat=0, cells=c, min_cosine_vs_st=0.995 if e != "st"
                           else None) for e, c in cells.items()],
    )  # fmt: skip


def test_table_shows_each_engines_fraction_of_its_own_limit() -> None:
    md = report.markdown(_run("bert-base"))
    row = next(line for line in md.splitlines() if line.startswith("| runtime-int8 | long | 32"))
    cols = [c.strip() for c in row.strip("|").split("|")]
    # 220 GFLOP in 1 s against the fastest readings: 183.3% of the 120 GFLOP/s fp32 limit,
    # 64.7% of the 340 GOP/s int8 one
    assert cols[-2:] == ["183.3%", "64.7%"]
    fp32_row = next(line for line in md.splitlines()
                    if line.startswith("| runtime-fp32 | long | 32"))  # fmt: skip
    assert [c.strip() for c in fp32_row.strip("|").split("|")][-2:] == ["91.7%", ""]  # 110 of 120
    assert "avx512f no" in md and "avx2 yes" in md


def test_big_model_targets() -> None:
    got = {name: (shown, verdict) for name, shown, verdict in
           report.targets(_run("qwen3-0.6b"), report.rows(_run("qwen3-0.6b")))}  # fmt: skip
    assert got["runtime-fp32 >= 85% of the fp32 limit (long, b32)"][1] == "met"
    assert got["runtime-int8 >= 1.6x runtime-fp32 (long, b32)"] == ("2.00x", "met")
    assert got["runtime-fp32 batch-1 short p50 <= 0.3x ST"] == ("0.20x", "met")
    assert got["runtime-int8 min cosine vs ST >= 0.99 (random weights)"] == ("0.9950", "met")


def test_a_served_big_model_is_held_against_its_peers_cell_by_cell() -> None:
    """bert-base with ours served and the peers: the same infinity and fastembed verdicts as
    MiniLM's, and what one client's requests cost over the in-process call (info)."""
    run = _run("bert-base")
    extra = {
        "serve-fp32": [_cell("serve-fp32", "short", 1, 0.3, 10),
                       _cell("serve-fp32", "long", 32, 2.2, 220)],
        "infinity-optimum": [_cell("infinity-optimum", "short", 1, 0.25, 10),
                             _cell("infinity-optimum", "long", 32, 3.0, 220)],
        "fastembed": [_cell("fastembed", "short", 1, 0.1, 10),
                      _cell("fastembed", "long", 32, 2.5, 220)],
    }  # fmt: skip
    run = msgspec.structs.replace(run, engines=[
        *run.engines, *(EngineRun(engine=e, repeat=0, cells=c) for e, c in extra.items())])
    got = {name: (shown, verdict) for name, shown, verdict in
           report.targets(run, report.rows(run))}  # fmt: skip
    # short b1: serve-fp32 0.3 s against infinity's 0.25 s per 4 texts: behind there
    assert got["ahead of infinity on every HTTP cell (best of ours vs best of theirs)"] == (
        "1/2 cells", "missed")
    assert got["serve-fp32 alone ahead of infinity's best (fp32 vs fp32)"][1] == "missed"
    assert "short b1 c1 -17%" in got["serve-fp32 alone ahead of infinity's best (fp32 vs fp32)"][0]
    # short b1: runtime-fp32 0.2 s, fastembed 0.1 s; runtime-int8 0.1 s ties it (not ahead)
    assert got["runtime-fp32 ahead of fastembed (in-process, every cell)"] == (
        "1/2 cells; behind: short b1 -50%", "missed")
    assert got["runtime-fp32 / runtime-int8 ahead of fastembed (in-process, every cell)"][0] == (
        "1/2 cells; behind: short b1 +0%")
    assert got["serve-fp32 vs runtime-fp32 (long, b32, one client)"] == ("0.91x", "info")
    assert "serve-int8 vs runtime-int8 (long, b32, one client)" not in got
    # and without peers, none of their rows
    plain = _run("bert-base")
    bare = {name for name, _, _ in report.targets(plain, report.rows(plain))}
    assert not any("infinity" in n or "fastembed" in n or "one client" in n for n in bare)


def test_which_models_are_served_and_meet_the_peers() -> None:
    from bench.run import chosen_engines

    bert = chosen_engines(MODELS["bert-base"], ["float32", "int8"], [])
    assert {"serve-fp32", "serve-int8", "serve-grpc-fp32", "infinity-optimum",
            "infinity-torch", "fastembed"} <= set(bert)  # fmt: skip
    assert not any(e.startswith("runtime-plain") for e in bert)  # the runtime's own graph only
    qwen = chosen_engines(MODELS["qwen3-0.6b"], ["float32", "int8"], [])
    assert qwen[:3] == ["st", "runtime-fp32", "runtime-int8"] and "infinity-torch" in qwen
    assert MODELS["bert-base"].fastembed_name == "BAAI/bge-base-en-v1.5"
    assert MODELS["qwen3-0.6b"].fastembed_name == ""  # its fastembed run says why it did not


def test_infinity_pools_as_the_checkpoint_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import servers

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for exe in ("infinity_emb", "optimum-cli"):
        (venv / "bin" / exe).write_text("")
    monkeypatch.setattr(servers, "INFINITY_VENV", venv)

    def method(engine: str, pooling: str) -> str:
        argv = servers._command(engine, 1, tmp_path, tmp_path, tmp_path, "cpu", 2, pooling)[0]
        return argv[argv.index("--pooling-method") + 1]

    assert method("infinity-optimum", "mean") == "mean"
    assert method("infinity-optimum", "cls") == "cls"
    # the optimum engine has no last-token pooling: it says so instead of pooling the CLS
    # token; the torch engine pools as sentence-transformers' modules say
    with pytest.raises(servers.EngineUnavailableError, match="lasttoken"):
        method("infinity-optimum", "lasttoken")
    assert method("infinity-torch", "lasttoken") == "auto"
    # and its folder is the checkpoint alone: nothing exported for the engine that cannot run
    checkpoint = tmp_path / "qwen"
    checkpoint.mkdir()
    (checkpoint / "modules.json").write_text("[]")
    folder = servers.infinity_model_dir(checkpoint, tmp_path / "cache", onnx=False)
    assert (folder / "modules.json").resolve() == (checkpoint / "modules.json").resolve()
    assert not (folder / "model.onnx").exists()
    assert servers.infinity_model_dir(checkpoint, tmp_path / "cache", onnx=False) == folder


def test_summary_has_every_model_and_the_host() -> None:
    md = report.summary([_run("bert-base"), _run("qwen3-0.6b")])
    assert "avx512_vnni no" in md and "Zen kernel" in md
    table = [line for line in md.splitlines() if line.startswith(("| bert-base", "| qwen3"))]
    # per model: 3 engines at b32 long, 3 batch-1 latencies, 6 targets
    assert sum(line.startswith("| qwen3-0.6b | runtime-int8 | long | 32 |") for line in table) == 1
    lat = [line for line in table if line.count("|") == 6]
    assert len(lat) == 6


def test_sizes_and_lengths_follow_the_model_and_the_options() -> None:
    opts = Options(quick=False, command="", engines=[], dtypes=["float32", "int8"], lengths=[],
                   batches=(), repeats=0, checkpoint=None, artifact=None, cache=Path(),
                   device="cpu", threads=2)  # fmt: skip
    assert sizes_for(MODELS["qwen3-0.6b"], opts) == BIG
    assert timed_lengths(MODELS["qwen3-0.6b"], []) == ["short", "long"]
    assert timed_lengths(MODELS["minilm"], []) == ["short", "medium", "long", "mixed"]
    assert timed_lengths(MODELS["bert-base"], ["long", "short"]) == ["short", "long"]
    with pytest.raises(SystemExit):
        timed_lengths(MODELS["bert-base"], ["medium"])
    narrowed = Options(**{**{f: getattr(opts, f) for f in opts.__struct_fields__},
                          "batches": (1,), "repeats": 2})  # fmt: skip
    assert sizes_for(MODELS["minilm"], narrowed).batches == (1,)
    assert sizes_for(MODELS["minilm"], narrowed).repeats == 2
    small = engines(["float32", "int8"], graphs=False)
    assert small[:4] == ["st", "runtime-fp32", "runtime-int8", "serve-fp32"]
    assert not any(e.startswith(("runtime-fused", "runtime-plain")) for e in small)
    assert "fastembed" in engines(["float32"])
    full = engines(["float32", "int8"])
    assert full[:7] == ["st", "runtime-fp32", "runtime-int8", "runtime-fused-fp32",
                        "runtime-plain-fp32", "runtime-fused-int8",
                        "runtime-plain-int8"]  # fmt: skip
    assert "runtime-plain-fp16" not in engines(["float16"])  # GPUs run the default graph only


def test_graph_engines_name_their_graph_and_dtype() -> None:
    from bench.config import dtype_of, is_int8

    assert graph_of("runtime-plain-int8") == "plain" and dtype_of("runtime-plain-int8") == "int8"
    assert is_int8("runtime-fused-int8")
    assert graph_of("runtime-fp32") == graph_of("serve-fp32") == "auto"


def test_graph_choice_verdict_and_section() -> None:
    rates = {
        ("runtime-fused-fp32", "short", 32, 1): 100.0,
        ("runtime-plain-fp32", "short", 32, 1): 121.0,
        ("runtime-fused-fp32", "long", 32, 1): 10.0,
        ("runtime-plain-fp32", "long", 32, 1): 10.0,
        ("runtime-fused-fp32", "short", 1, 1): 50.0,
        ("runtime-plain-fp32", "short", 1, 1): 51.0,
        ("runtime-fused-int8", "short", 32, 1): 80.0,  # plain int8 not run: no int8 row
    }
    ratios = graph_choice.plain_over_fused(rates, "fp32", 32)
    assert ratios == {"short": pytest.approx(1.21), "long": pytest.approx(1.0)}
    assert graph_choice.verdict(ratios) == "plain faster (plain / fused 1.10x)"
    assert graph_choice.verdict({"short": 1.02, "long": 0.99}).startswith("tie")
    assert graph_choice.verdict({"short": 0.8}) == "fused faster (plain / fused 0.80x)"
    assert graph_choice.verdict({}) == "not measured"
    run = msgspec.structs.replace(
        _run("minilm"), engines=[EngineRun(engine="runtime-fp32", repeat=0, variant="fp32-plain")]
    )
    text = "\n".join(graph_choice.lines(run, rates))
    assert "| fp32 | 1 | 1.02x |  | tie" in text
    assert "| fp32 | 32 | 1.21x | 1.00x | plain faster (plain / fused 1.10x) | fp32-plain |" in text
    assert "| int8 |" not in text
    assert graph_choice.lines(run, {("st", "short", 32, 1): 1.0}) == []
    timed = (("runtime-fused-int8", 2.0), ("runtime-plain-int8", 1.0))
    forced = [EngineRun(engine=e, repeat=0, cells=[_cell(e, "long", 32, secs, 220)])
              for e, secs in timed]  # fmt: skip
    both = msgspec.structs.replace(_run("bert-base"), engines=[*_run("bert-base").engines, *forced])
    text = report.summary([both])
    assert "## CPU graph per host: bert-base" in text
    assert "| int8 | 32 |  | 2.00x | plain faster (plain / fused 2.00x) | not run |" in text
    assert "## CPU graph per host" in report.markdown(both)


def test_checkpoint_recipe_pooling_and_digest(tmp_path: Path) -> None:
    for key, mode in (("bert-base", "cls_token"), ("qwen3-0.6b", "lasttoken")):
        dest = tmp_path / key
        dest.mkdir()
        _save_sentence_transformers(MODELS[key], dest)
        pooling = json.loads((dest / "1_Pooling" / "config.json").read_text())
        assert [k for k, v in pooling.items() if v is True] == [f"pooling_mode_{mode}"]
        mods = json.loads((dest / "modules.json").read_text())
        assert mods[-1]["type"].endswith("Normalize")
    a = recipe_digest(MODELS["bert-base"], "5.25.0")
    assert a == recipe_digest(MODELS["bert-base"], "5.25.0")
    assert a != recipe_digest(MODELS["bert-base"], "5.26.0")
    assert a != recipe_digest(MODELS["qwen3-0.6b"], "5.25.0")


def test_decoder_texts_are_cut_to_exact_counts(tmp_path: Path) -> None:
    # a decoder's tokenizer appends its end token instead of leading with [CLS]
    from bench.texts import make_pools
    from support.tiny_models import build_tokenizer

    build_tokenizer(decoder=True).save(str(tmp_path / "tokenizer.json"))
    pools = make_pools(tmp_path, 3, 64, {"short": 16, "long": 64})
    assert pools["short"].tokens == [16] * 3
    assert pools["long"].tokens == [64] * 3


def test_summary_can_be_rebuilt_from_per_model_results(tmp_path: Path) -> None:
    import msgspec

    for key in ("qwen3-0.6b", "bert-base"):
        (tmp_path / key).mkdir()
        (tmp_path / key / "results.json").write_bytes(msgspec.json.encode(_run(key)))
    assert report.main([str(tmp_path)]) == 0
    md = (tmp_path / "summary.md").read_text()
    # in the bench's model order, whatever order the folders sort in
    assert md.index("- bert-base: started") < md.index("- qwen3-0.6b: started")


def test_rates_keep_three_digits_and_cells_over_the_limit_are_flagged() -> None:
    assert [report.rate(x) for x in (137.64, 27.51, 2.754, 0.1463)] == ["137.6", "27.5", "2.75",
                                                                       "0.146"]  # fmt: skip
    run = _run("bert-base")
    # runtime-int8 long b32: 220 GFLOP/s against a 110 fp32 / 320 int8 limit: under its own
    assert report.over_limit(run) == []
    low = Run(**{**{f: getattr(run, f) for f in run.__struct_fields__},
                 "peak": Peak(fp32_gflops=[50.0], int8_gops=[400.0], threads=2)})  # fmt: skip
    flagged = report.over_limit(low)
    assert any(f.startswith("runtime-fp32 long b32") for f in flagged)
    assert "over 100% of the measured limit" in report.markdown(low)


def _with_floor(run: Run, median_ms: float) -> Run:
    floor = Floor(rows=16, params=440_401_920, median_ms=median_ms, best_ms=median_ms - 1,
                  gflops=146.0, threads=2)  # fmt: skip
    return msgspec.structs.replace(run, weight_floor=floor)


def test_report_says_whether_the_batch1_goal_is_within_reach() -> None:
    # st's batch-1 short p50 is 250 ms in these runs: a 0.3x goal is 75 ms
    name = "fp32 batch-1 floor: weight products alone at 16 rows vs ST p50 (goal 0.3x)"
    above = "out of reach in fp32 here: the floor alone is above the goal"
    room = "the goal's 75.0 ms leave 25.0 ms for the rest of the forward"
    for median, shown in ((90.0, f"90.0 ms = 0.360x ST ({above})"),
                          (50.0, f"50.0 ms = 0.200x ST ({room})")):  # fmt: skip
        run = _with_floor(_run("qwen3-0.6b"), median)
        got = {n: (s, v) for n, s, v in report.targets(run, report.rows(run))}
        assert got[name] == (shown, "info")
        md = report.markdown(run)
        assert "- batch-1 floor: the model's weight products alone at 16 rows" in md
        summary = report.summary([run])
        assert f"| qwen3-0.6b | floor: weight products alone (16 rows, weight_floor.py) | " \
               f"{median:.1f} |" in summary
    # MiniLM's goal is 0.25x
    minilm = _with_floor(_run("minilm"), 70.0)
    got = {n: s for n, s, _ in report.targets(minilm, report.rows(minilm))}
    assert got["fp32 batch-1 floor: weight products alone at 16 rows vs ST p50 (goal 0.25x)"] \
        == (
        "70.0 ms = 0.280x ST (out of reach in fp32 here: the floor alone is above the goal)"
    )


def test_runs_recorded_before_the_floor_still_load_and_report() -> None:
    old = msgspec.json.encode(_run("bert-base"))
    assert b"weight_floor" in old  # encoded as null; a file written before lacks the key
    legacy = msgspec.json.decode(old.replace(b',"weight_floor":null', b""), type=Run)
    assert legacy.weight_floor is None
    md = report.markdown(legacy)
    assert "- batch-1 floor: not measured" in md
    assert not any("floor" in n for n, _, _ in report.targets(legacy, report.rows(legacy)))


def test_served_cells_say_where_the_time_went() -> None:
    """busy share, forward rate against the in-process engine, cores; n/a where a server has
    no busy counter; no section for a run without served cells."""
    assert served.lines(_run("minilm"), report.rows(_run("minilm"))) == []
    serve = msgspec.structs.replace(
        _cell("serve-int8", "long", 32, 2.0, 220), concurrency=4, model_busy=0.8,
        server_cores=1.9, client_cores=0.05,
    )  # fmt: skip
    other = msgspec.structs.replace(
        _cell("infinity-optimum", "long", 32, 2.0, 220), concurrency=4, server_cores=1.5,
        client_cores=0.1,
    )  # fmt: skip
    run = _run("minilm")
    run = msgspec.structs.replace(run, engines=[
        *run.engines, EngineRun(engine="serve-int8", repeat=0, cells=[serve]),
        EngineRun(engine="infinity-optimum", repeat=0, cells=[other]),
    ])  # fmt: skip
    rows = [line for line in served.lines(run, report.rows(run)) if line.startswith("| serve-int8")
            or line.startswith("| infinity")]  # fmt: skip
    # 128 texts in 2 s = 64 texts/s; busy 80% -> forward rate 80; runtime-int8 in-process 128
    assert [c.strip() for c in rows[0].strip("|").split("|")] == [
        "serve-int8", "long", "32", "4", "64.0", "80%", "80.0", "128.0", "1.90", "0.05"]
    assert [c.strip() for c in rows[1].strip("|").split("|")][5:8] == ["n/a", "n/a", "n/a"]
    assert "## Served cells: where the time goes" in report.markdown(run)


def test_a_cell_with_usage_measures_the_server_between_its_timed_calls() -> None:
    from bench.config import QUICK
    from bench.measure import Usage, run_cell
    from bench.texts import Pool

    snapshots = iter([Usage(model_busy_s=10.0, cpu_s=100.0),
                      Usage(model_busy_s=10.5, cpu_s=101.5)])  # fmt: skip
    sizes = msgspec.structs.replace(QUICK, min_calls=2, min_seconds=0.0, max_seconds=5.0)
    pool = Pool(texts=["a", "b"], tokens=[3, 3])
    cell = run_cell(lambda texts: None, pool, engine="serve-int8", length="short", batch=1,
                    concurrency=1, repeat=0, sizes=sizes, model=_run("minilm").model,
                    usage=lambda: next(snapshots))  # fmt: skip
    assert cell.model_busy == pytest.approx(0.5 / cell.seconds)
    assert cell.server_cores == pytest.approx(1.5 / cell.seconds)
    assert cell.client_cores is not None and cell.client_cores >= 0


def test_host_speed_marks_the_repeats_that_ran_while_the_host_was_slow() -> None:
    """Each repeat's texts/s beside the probe's reading after it, as a share of the run's
    fastest reading; under SLOW_HOST it is marked; no section where no cell was probed."""
    run = _run("minilm")
    assert host_speed.lines(run) == []
    probed = [
        msgspec.structs.replace(_cell("serve-int8", "long", 32, seconds, 220), repeat=r,
                                host_int8_gops=gops)
        for r, (seconds, gops) in enumerate([(1.0, 700.0), (1.5, 455.0), (0.8, 690.0)])
    ]  # fmt: skip
    steady = [msgspec.structs.replace(er, cells=[
        msgspec.structs.replace(c, host_int8_gops=700.0) for c in er.cells
    ]) for er in run.engines]  # fmt: skip
    run = msgspec.structs.replace(run, engines=[
        *steady, *(EngineRun(engine="serve-int8", repeat=c.repeat, cells=[c])
                   for c in probed)])  # fmt: skip
    section = host_speed.lines(run)
    row = next(line for line in section if line.startswith("| serve-int8"))
    # 128 texts in 1.0 / 1.5 / 0.8 s; 455 of 700 GOP/s is 65%, under 85%: the unmarked
    # median is that of 128 and 160
    assert [c.strip() for c in row.strip("|").split("|")] == [
        "serve-int8", "long", "32", "1", "128.0 / 85.3 / 160.0", "100% / 65%* / 99%", "144.0"]
    assert any("(700 GOP/s)" in line and "1 of 9 cell repeats" in line for line in section)
    md = report.markdown(run)
    assert "## Host speed beside each cell" in md
    # the targets again over the unmarked repeats: serve-int8's long cell at 144 texts/s
    keep = host_speed.full_speed(run)
    assert keep is not None
    assert report.rows(run, keep)[("serve-int8", "long", 32, 1)].texts_s == pytest.approx(144.0)
    full = md.split("Targets over the unmarked repeats only", 1)[1]
    # 144 texts/s against sentence-transformers' 32 (every repeat: 128, 4.00x)
    assert "| serve-int8 >= 2.2x ST fp32 (long, b32, c1) | 4.50x | met |" in full
    assert "| serve-int8 >= 2.2x ST fp32 (long, b32, c1) | 4.00x | met |" in md
    assert host_speed.full_speed(_run("minilm")) is None


def test_a_cell_with_a_probe_reads_the_host_after_its_timed_calls(tmp_path: Path) -> None:
    from bench.config import QUICK
    from bench.host_probe import HostProbe, ProbeProcess, write_model
    from bench.measure import run_cell
    from bench.texts import Pool

    calls: list[str] = []
    sizes = msgspec.structs.replace(QUICK, min_calls=2, min_seconds=0.0, max_seconds=5.0)
    cell = run_cell(lambda texts: calls.append("call"), Pool(texts=["a"], tokens=[3]),
                    engine="runtime-int8", length="short", batch=1, concurrency=1, repeat=0,
                    sizes=sizes, model=_run("minilm").model,
                    probe=lambda: calls.append("probe") or 512.0)  # fmt: skip
    assert cell.host_int8_gops == 512.0
    assert calls[-1] == "probe" and calls.count("probe") == 1
    model = write_model(tmp_path / "probe.onnx")
    assert HostProbe(model, threads=1)() > 1.0  # a real GEMM rate; how high is the host's business
    child = ProbeProcess(model, threads=1)
    try:
        assert child() > 1.0 and child() > 1.0
    finally:
        child.close()

    def broken() -> float:
        raise RuntimeError("probe died")

    unprobed = run_cell(lambda texts: None, Pool(texts=["a"], tokens=[3]), engine="st",
                        length="short", batch=1, concurrency=1, repeat=0, sizes=sizes,
                        model=_run("minilm").model, probe=broken)  # fmt: skip
    assert unprobed.host_int8_gops is None and unprobed.texts > 0
