"""Muon.last_step_report(): the last step's counters and per-operation
timings (muon.v1.StepReport in protobuf's JSON mapping), the data
`muonctl trace` draws. On CUDA tensors the times are the device's (CUDA
events around each operation; tests/client/gpu_executor_test.cc); here the
host executor's."""
import time

import torch

from conftest import library_or_skip


def test_last_step_report_times_every_operation_inside_the_step():
    library_or_skip()
    import muonrt
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64, 32, generator=g)),
              torch.nn.Parameter(torch.randn(48, 130, generator=g))]
    opt = muonrt.Muon([("a", params[0]), ("b", params[1])], lr=0.02)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    before = time.time()
    opt.step()
    after = time.time()
    report = opt.last_step_report()
    assert int(report["step"]) == 1
    assert report["matrices_orthogonalized"] == 2
    kinds = [op["op"] for op in report["ops"]]
    for kind in ("OP_KIND_GATHER", "OP_KIND_ORTHOGONALIZE",
                 "OP_KIND_REDISTRIBUTE", "OP_KIND_APPLY"):
        assert kind in kinds, kinds
    for op in report["ops"]:
        assert before <= op["start_s"] <= op["end_s"] <= after, op
    starts = [op["start_s"] for op in report["ops"]]
    assert starts == sorted(starts)
    ns = [op for op in report["ops"] if op["op"] == "OP_KIND_ORTHOGONALIZE"]
    assert sum(op.get("flops", 0) for op in ns) == report["ns_flops"]


def test_one_process_honours_bucket_size_and_async_schedule():
    """Without a process group the execution options still apply: byte-
    bounded buckets (here two matrices of 8 KiB per 16 KiB bucket, so
    same-shape matrices run as one batched Newton-Schulz) and the async
    schedule with prefetch;
    the bits equal the default one-matrix-per-bucket step."""
    library_or_skip()
    import muonrt

    def run(**kwargs):
        g = torch.Generator().manual_seed(1)
        params = [torch.nn.Parameter(torch.randn(64, 32, generator=g))
                  for _ in range(4)]
        opt = muonrt.Muon([(f"w{i}", p) for i, p in enumerate(params)],
                          lr=0.02, **kwargs)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
        return opt.last_step_report(), [p.detach().clone() for p in params]

    plain_report, plain = run()
    bucketed_report, bucketed = run(bucket_size_bytes=16 << 10,
                                    async_gpu_parallelism=True,
                                    prefetch_count=1)
    plain_buckets = {op.get("bucket", 0) for op in plain_report["ops"]}
    buckets = {op.get("bucket", 0) for op in bucketed_report["ops"]}
    assert len(plain_buckets) == 4
    assert len(buckets) == 2
    assert bucketed_report["mode"] == "SCHEDULE_MODE_ASYNC"
    assert bucketed_report.get("prefetch_count", 0) == 1
    for a, b in zip(plain, bucketed):
        assert torch.equal(a, b)


def test_report_counts_torch_momentum_bytes_per_parameter():
    """torch.optim.Muon keeps one momentum buffer in the parameter's dtype:
    2 bytes per bf16 parameter, 4 per fp32 one. The report counts the same
    (momentum_dtype=torch.float32 gives 4 for both), the persistent state
    adds only 8 bytes per parameter, and the peak is state + step buffers."""
    library_or_skip()
    import muonrt
    for momentum_dtype, per_bf16 in ((None, 2), (torch.float32, 4)):
        g = torch.Generator().manual_seed(2)
        a = torch.nn.Parameter(torch.randn(64, 32, generator=g).bfloat16())
        b = torch.nn.Parameter(torch.randn(48, 16, generator=g))
        opt = muonrt.Muon([("a", a), ("b", b)], lr=0.02,
                          momentum_dtype=momentum_dtype)
        a.grad = torch.randn(a.shape, generator=g).bfloat16()
        b.grad = torch.randn(b.shape, generator=g)
        opt.step()
        report = opt.last_step_report()
        momentum = per_bf16 * a.numel() + 4 * b.numel()
        assert int(report["momentum_bytes"]) == momentum
        assert int(report["state_bytes"]) == momentum + 2 * 8
        assert int(report.get("snapshot_bytes", 0)) == 0
        assert int(report["peak_bytes"]) == (
            int(report["state_bytes"]) + int(report["buffer_bytes"]))
        assert opt.state_dict()["state"][0]["momentum_buffer"].dtype == \
            torch.float32
        opt.close()
