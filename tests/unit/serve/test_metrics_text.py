"""The te_* text page: any served model name stays one label value, counts stay exact."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tei_serve.metrics import MetricFamilies


def test_odd_model_names_are_escaped_and_big_counts_are_not_rounded() -> None:
    families = MetricFamilies(512, model_label=True)
    names = ['q"x\\y', "two\nlines", "café"]
    for name in names:
        view = families.view(name)
        view.received("batch")
        view.inputs_received("embed", 1_234_567)
        view.failure("validation")
    samples = {
        (s.name, s.labels.get("model")): s.value
        for family in text_string_to_metric_families(families.render().decode())
        for s in family.samples
    }
    for name in names:
        assert samples[("te_embed_count_total", name)] == 1_234_567
        assert samples[("te_request_failure_total", name)] == 1
    text = families.render().decode()
    assert "te_embed_count{model=\"café\"} 1234567\n" in text


def test_duration_buckets_are_teis_to_the_last_bit() -> None:
    """TEI multiplies 1e-5 by 1.5 step by step (router/src/prometheus.rs); `le` bounds off by
    one bit would be other series in a fleet mixing TEI and tei-onnx."""
    from tei_serve.metrics import DURATION_BUCKETS

    assert len(DURATION_BUCKETS) == 35
    assert DURATION_BUCKETS[0] == 1.5000000000000002e-05
    assert DURATION_BUCKETS[1] == 2.2500000000000005e-05
    assert DURATION_BUCKETS[-1] == 14.561096060497142  # 1e-5 * 1.5**35 gives ...135


def test_bucket_bounds_are_written_as_teis_exporter_writes_them() -> None:
    """Rust's float Display (`32`, `1048576`, `0.000015000000000000002`), not Python's
    (`32.0`, `1.048576e+06`, `1.5000000000000002e-05`): Prometheus 2 keeps each spelling as
    a series of its own."""
    families = MetricFamilies(512, model_label=False)
    text = families.render().decode()
    assert 'te_batch_next_size_bucket{le="32"}' in text
    assert 'te_batch_next_tokens_bucket{le="1048576"}' in text
    assert 'te_request_duration_bucket{le="0.000015000000000000002"}' in text
    assert 'le="+Inf"' in text
    bounds = [line.split('le="')[1].split('"')[0] for line in text.splitlines() if 'le="' in line]
    assert bounds and not [b for b in bounds if "e" in b or b.endswith(".0")]
    # and they read back as the same floats
    from tei_serve.metrics import DURATION_BUCKETS

    assert float('0.000015000000000000002') == DURATION_BUCKETS[0]
