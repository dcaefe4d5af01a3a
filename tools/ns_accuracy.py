#!/usr/bin/env python3
"""How far Newton-Schulz lands from a float64 run of the same iteration:
ours (libmuonrt through muonrt.Muon) and PyTorch's
torch.optim._muon._zeropower_via_newtonschulz, on the same inputs.

The reference is torch.optim.Muon's iteration in float64 on the same device:
quintic coefficients (3.4445, -4.7750, 2.0315), --steps (5) steps, the input
divided by max(||G||_F, 1e-7), worked on transposed when rows > cols, each
step A = X X^T, B = b A + c A A, X = a X + B X.

Inputs: per shape a random Gaussian matrix G (float32, seeded, made on the
CPU so that every device sees the same numbers), standing for a momentum
buffer. Defaults: the Llama-3-8B shapes 4096x4096, 1024x4096, 14336x4096,
4096x14336 on CUDA; 64x32, 48x130, 256x256 with --device cpu.

PyTorch's: the installed torch.optim._muon._zeropower_via_newtonschulz (its
default use_addmm=False, and use_addmm=True too where the function has it),
which casts G to bfloat16 and runs bf16 matmuls. A torch without it (before
2.9; Debian's 1.13) gets a copy of that function's algorithm, in bfloat16,
said so in the output.

Ours: one step of muonrt.Muon (world size 1) over float32 parameters that
start at zero, with G as the gradient and lr=1, weight_decay=0, momentum=0,
nesterov=False, adjust_lr_fn="original". Then the momentum buffer is
lerp(0, G, 1) = G exactly, the update is the Newton-Schulz output O of G,
and the parameter after the step is exactly float32(-s) * O rounded once
to float32, where s = lr * sqrt(max(1, rows / cols)) (AdjustLr,
kernels/muon_update.cc; decay 1 - lr * weight_decay = 1). So
O = p_after / float32(-s) in float64, to float32 rounding (~6e-8, far below
what is measured). On CUDA parameters the library runs Newton-Schulz in
bf16 with fp32 accumulation (the C ABI has no gpu_precision option); on
CPU parameters in fp32. With ns_method="gram" (iterate on the Gram matrix;
the library runs it for CPU parameters only) a second column, or the
library's refusal.

Per shape it prints ||O - O64||_F / ||O64||_F for each and the verdict
"ours no farther than torch" (ours <= torch's default variant).

Usage:
  python3 tools/ns_accuracy.py [--device cuda|cpu] [--shapes 64x32,...]
      [--steps 5] [--seed 0] [--json PATH] [--skip-ours] [--strict]
Exit status: 2 when the device is missing or muonrt cannot run (after
printing what could be measured; --skip-ours leaves muonrt out), 1 with
--strict when ours is farther than torch's on some shape, else 0.
"""
import argparse
import inspect
import json
import math
import sys

# Beside this script in tools/ and in the device bundle (sys.path[0]).
from torch_ns_bench import zeropower

COEFFICIENTS = (3.4445, -4.7750, 2.0315)
EPS = 1e-7
GPU_SHAPES = "4096x4096,1024x4096,14336x4096,4096x14336"
CPU_SHAPES = "64x32,48x130,256x256"


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        rows, sep, cols = item.partition("x")
        if not sep or not rows.isdigit() or not cols.isdigit():
            raise ValueError(f"bad shape {item!r}: ROWSxCOLS, e.g. 64x32")
        shapes.append((int(rows), int(cols)))
    return shapes


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--shapes", default=None,
                    help=f"ROWSxCOLS,... (default {GPU_SHAPES} on cuda, "
                         f"{CPU_SHAPES} on cpu)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--skip-ours", action="store_true",
                    help="leave muonrt out (torch's against the reference)")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when ours is farther than torch's anywhere")
    args = ap.parse_args(argv)
    if args.shapes is None:
        args.shapes = GPU_SHAPES if args.device == "cuda" else CPU_SHAPES
    try:
        args.shapes = parse_shapes(args.shapes)
    except ValueError as e:
        ap.error(str(e))
    if not args.shapes:
        ap.error("--shapes is empty")
    return args


# ---- Newton-Schulz: the reference and torch's --------------------------------

def ns_reference(torch, g, steps):
    """torch.optim.Muon's iteration in float64 (the module docstring)."""
    return zeropower(torch, g, COEFFICIENTS, steps, EPS, dtype=torch.float64,
                     use_addmm=False)


def torch_variants(torch):
    """([(label, fn(g, steps))], source description). The first variant is
    torch.optim.Muon's default (the verdict's yardstick)."""
    try:
        from torch.optim._muon import _zeropower_via_newtonschulz as zp
        source = (f"torch {torch.__version__} "
                  f"torch.optim._muon._zeropower_via_newtonschulz")
    except ImportError:
        zp = None
    if zp is None:
        def fb(g, steps, addmm):
            return zeropower(torch, g, COEFFICIENTS, steps, EPS,
                             dtype=torch.bfloat16, use_addmm=addmm)
        return ([("torch", lambda g, s: fb(g, s, False)),
                 ("torch_addmm", lambda g, s: fb(g, s, True))],
                f"torch {torch.__version__} has no torch.optim._muon: a copy "
                f"of PyTorch 2.9+'s _zeropower_via_newtonschulz in bf16 "
                f"(fallback)")
    if "use_addmm" in inspect.signature(zp).parameters:
        return ([("torch", lambda g, s: zp(g, COEFFICIENTS, s, EPS,
                                           use_addmm=False)),
                 ("torch_addmm", lambda g, s: zp(g, COEFFICIENTS, s, EPS,
                                                 use_addmm=True))],
                source + " (use_addmm=False: torch.optim.Muon's default; "
                         "and use_addmm=True)")
    return ([("torch", lambda g, s: zp(g, COEFFICIENTS, s, EPS))], source)


# ---- ours through muonrt -------------------------------------------------------

class OursUnavailable(Exception):
    pass


def ours_outputs(torch, inputs, device, steps, ns_method=None):
    """{shape: O} from one muonrt.Muon step (the module docstring), O in
    float64 on `device`. Raises OursUnavailable when muonrt cannot run."""
    try:
        import muonrt
    except ImportError as e:
        raise OursUnavailable(f"cannot import muonrt: {e}") from None
    try:
        library = muonrt.library_path()
    except (OSError, RuntimeError) as e:
        raise OursUnavailable(f"libmuonrt.so does not load: {e}") from None
    params = []
    for (rows, cols), g in inputs.items():
        p = torch.nn.Parameter(torch.zeros(rows, cols, dtype=torch.float32,
                                           device=device))
        p.grad = g.clone()
        params.append((f"m_{rows}x{cols}", p))
    lr = 1.0
    kw = dict(lr=lr, weight_decay=0.0, momentum=0.0, nesterov=False,
              ns_coefficients=COEFFICIENTS, eps=EPS, ns_steps=steps,
              adjust_lr_fn="original")
    if ns_method is not None:
        kw["ns_method"] = ns_method
    try:
        opt = muonrt.Muon(params, **kw)
    except NotImplementedError as e:
        raise OursUnavailable(f"muonrt refuses {device} tensors: {e}") \
            from None
    try:
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
    finally:
        opt.close()
    out = {}
    for (rows, cols), (_, p) in zip(inputs, params):
        scale = lr * math.sqrt(max(1.0, rows / cols))
        # The library's alpha: -scale in double, cast to float once.
        alpha = torch.tensor(-scale, dtype=torch.float32).item()
        out[(rows, cols)] = p.detach().double() / alpha
    return out, library, kw


def rel_distance(o, ref):
    return ((o.double() - ref).norm() / ref.norm()).item()


def measure_ours(torch, args, inputs, refs, rows_out):
    """Adds ours (and ours_gram) to rows_out; returns (their columns, the
    library's path, the options given, problems that make the run fail)."""
    columns, problems = [], []
    library = options = None
    for label, method in (("ours", None), ("ours_gram", "gram")):
        try:
            outs, library, options = ours_outputs(
                torch, inputs, args.device, args.steps, method)
        except Exception as e:  # noqa: BLE001 (reported below)
            first = str(e).splitlines()[0] if str(e) else ""
            msg = (first if isinstance(e, OursUnavailable)
                   else f"{type(e).__name__}: {first}")
            if method is None:
                problems.append(msg)
                print(f"ours: unavailable: {msg}", file=sys.stderr)
                break
            # The library runs the Gram iteration for CPU parameters only.
            print(f"{label}: muonrt refused ns_method='gram' on "
                  f"{args.device}: {msg}")
            outs = None
        columns.append(label)
        for s in inputs:
            rows_out[s][label] = (None if outs is None
                                  else rel_distance(outs[s], refs[s]))
    if library:
        shown = {k: v for k, v in options.items() if k != "ns_method"}
        print(f"ours: muonrt.Muon one step, library {library}, options "
              f"{shown}; O = p_after / float32(-lr * sqrt(max(1, "
              f"rows/cols)))")
    return columns, library, options, problems


def print_report(rows_out, columns, device):
    """The table and the verdicts; returns (per-shape report, how many
    shapes ours is farther on)."""
    print()
    head = f"{'shape':<12}" + "".join(f"{c:>13}" for c in columns) + \
        "  ours no farther than torch"
    print(head)
    print("-" * len(head))
    farther = 0
    report = []
    for s, r in rows_out.items():
        cells = "".join(f"{'n/a':>13}" if r.get(c) is None
                        else f"{r[c]:>13.3e}" for c in columns)
        verdict = None
        if r.get("ours") is not None:
            verdict = r["ours"] <= r["torch"]
            farther += 0 if verdict else 1
        text = "n/a" if verdict is None else ("yes" if verdict else "NO")
        print(f"{s[0]}x{s[1]:<{11 - len(str(s[0]))}}{cells}  {text}")
        report.append({"shape": list(s), "rel_fro": r,
                       "ours_no_farther_than_torch": verdict})
    print("cells: ||O - O64||_F / ||O64||_F")
    judged = sum(1 for x in report
                 if x["ours_no_farther_than_torch"] is not None)
    if judged:
        print(f"ns_accuracy: ours no farther than torch on "
              f"{judged - farther} of {judged} shapes ({device})")
    else:
        print(f"ns_accuracy: torch's only ({device})")
    return report, farther


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"ns_accuracy: PyTorch is not installed: {e}", file=sys.stderr)
        return 2
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("ns_accuracy: no CUDA GPU visible to PyTorch (use --device cpu "
              "for the host)", file=sys.stderr)
        return 2
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    variants, torch_source = torch_variants(torch)
    print(f"device {device} ({where}) | torch {torch.__version__} | "
          f"{args.steps} steps, coefficients {COEFFICIENTS}, eps {EPS}, "
          f"seed {args.seed}")
    print(f"reference: the same iteration in float64 on {device}")
    print(f"torch's: {torch_source}", flush=True)

    gen = torch.Generator().manual_seed(args.seed)
    inputs = {}
    for shape in args.shapes:
        if shape not in inputs:
            inputs[shape] = torch.randn(*shape, generator=gen,
                                        dtype=torch.float32).to(device)
    refs = {s: ns_reference(torch, g, args.steps) for s, g in inputs.items()}
    rows_out = {s: {} for s in inputs}
    for label, fn in variants:
        for s, g in inputs.items():
            rows_out[s][label] = rel_distance(fn(g, args.steps), refs[s])

    ours_columns, library, options, problems = [], None, None, []
    if not args.skip_ours:
        ours_columns, library, options, problems = measure_ours(
            torch, args, inputs, refs, rows_out)
    report, farther = print_report(
        rows_out, [label for label, _ in variants] + ours_columns, device)
    if args.json:
        doc = {"device": device, "device_name": where,
               "torch": torch.__version__, "torch_source": torch_source,
               "steps": args.steps, "coefficients": list(COEFFICIENTS),
               "eps": EPS, "seed": args.seed, "library": library,
               "ours_options": options, "problems": problems,
               "shapes": report}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        print(f"wrote {args.json}")
    if problems:
        return 2
    if args.strict and farther:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
