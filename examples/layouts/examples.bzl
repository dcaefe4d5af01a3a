"""The layout examples: one cc_binary per entry (examples/layouts/BUILD.bazel),
all run by //tests/examples:examples_test. See README.md for the layout each
one shows."""

LAYOUT_EXAMPLES = [
    "single_device",  # Single GPU (Baseline), 1 rank
    "ddp",  # DDP (No Special Config), 2 ranks
    "fsdp",  # FSDP, Shard(0), 4 ranks
    "fsdp_shard1",  # FSDP, Shard(1) variant, 4 ranks
    "tp",  # Tensor Parallel + Mixed Sharding Dimensions, 2 ranks
    "hsdp",  # HSDP, 2 x 2 ranks
    "tp_fsdp",  # TP + FSDP Hybrid, 2 x 2 ranks
    "tp_hsdp",  # TP + HSDP Hybrid, 2 x 2 x 2 ranks
    "cp",  # Context Parallel (CP), 2 ranks
    "ep",  # Expert Parallel (EP), 3-D expert stacks, 4 ranks
    "ep_tp",  # EP + TP Hybrid, 2 x 2 ranks
    "pp",  # Pipeline Parallel, 2 stages
    "pp_tp_hsdp",  # Full 4D Parallelism (PP + TP + HSDP), 8 ranks
    "custom",  # Custom Distributed Setup, 4 ranks
    "debug",  # Debug Mode, 2 ranks
]
