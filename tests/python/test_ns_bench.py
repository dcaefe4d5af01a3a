"""`ns_bench` runs end to end: ours, sgemm, the Gram method and PyTorch's
Newton-Schulz interleaved, one row per size with every column a positive
number. Asserts the output's shape, not a speed (speed is the benchmark's
to measure, docs/benchmarks.md).

Skips, with the reason, when the binary is not built.
"""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
NS_BENCH = os.path.join(ROOT, "bazel-bin", "tools", "ns_bench")

pytestmark = pytest.mark.skipif(
    not os.access(NS_BENCH, os.X_OK),
    reason=f"{NS_BENCH} not built (bazel build //tools:ns_bench)")


def run_bench(*args):
    return subprocess.run([NS_BENCH, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def table_rows(stdout):
    """{size: {column: value}} from the table after the header line."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("size"))
    header = lines[start].replace("NS best", "NS_best").replace(
        "NS median", "NS_median").replace("NS GF/s", "NS_GF/s").replace(
        "sgemm GF/s", "sgemm_GF/s").replace("gram best", "gram_best").replace(
        "torch best", "torch_best").replace("torch med", "torch_med").replace(
        "best x", "best_x").replace("median x", "median_x").replace(
        "paired x", "paired_x").split()
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            continue
        cells = line.split()
        assert len(cells) == len(header), (header, line)
        rows[cells[0]] = {
            name: float(cell.rstrip("ms"))
            for name, cell in zip(header[1:], cells[1:])
        }
    return rows


def test_ns_bench_with_gram_and_torch_prints_every_ratio_per_size():
    pytest.importorskip("torch", reason="python3-torch not installed")
    result = run_bench("--sizes", "64x256,192x48", "--repeats", "2",
                       "--gram", "--torch", "--pause_ms", "0",
                       "--python", "/usr/bin/python3")
    assert result.returncode == 0, result.stderr
    assert "OpenBLAS core:" in result.stdout
    rows = table_rows(result.stdout)
    assert set(rows) == {"64x256", "192x48"}
    for size, row in rows.items():
        for column in ("NS_best", "NS_median", "sgemm_GF/s", "NS/gemm",
                       "gram_best", "std/gram", "torch_best", "best_x",
                       "median_x", "paired_x"):
            assert row[column] > 0, (size, column, row)
        assert row["NS_best"] <= row["NS_median"], (size, row)
    assert rows["192x48"]["m"] == 48 and rows["192x48"]["n"] == 192


def test_ns_bench_gram_column_with_method_gram_is_a_usage_error():
    result = run_bench("--sizes", "8x8", "--gram", "--method", "gram")
    assert result.returncode == 2
    assert "--gram needs --method standard" in result.stderr
