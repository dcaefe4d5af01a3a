"""Job specs from a torch.nn.Module: spec_from_module and write_spec.

The Python twin of tools/spec_builder.h (which builds the same spec from a
.safetensors header, for ``muonctl spec``). Pure Python: needs neither the
library nor, until a module is passed, torch.

    spec = muonrt.spec_from_module(
        model, "dp_shard=8,tp=8",
        placements_rules=[
            (r"q_proj|k_proj|v_proj|gate_proj|up_proj", "tp:Shard(0)"),
            (r"o_proj|down_proj", "tp:Shard(1)")],
        job_id="llama-tp8-dp8")
    muonrt.write_spec(spec, "llama.json")   # then: muonctl plan --spec ...

The spec is a JSON-ready dict in common/spec.h's JobSpecToJson spelling:
``{"job_id": str, "mesh": {"dims": [{"name": str, "size": int}, ...]},
"params": [{"name": str, "shape": [int, ...], "placements": [str, ...]},
...]}`` (optimizer and execution left out: PyTorch's defaults).

Rules (the same as tools/spec_builder.h):
  * Muon matrices are the parameters of ``module.named_parameters()`` (in
    that order; tied weights once) with a floating dtype, 2-D (3-D too with
    ``expert_stacks=True``: [experts, rows, cols]), every dim >= 1, whose
    name matches none of `exclude` (default DEFAULT_EXCLUDE: embeddings,
    output head, norms).
  * Patterns are regular expressions matched with ``re.search`` (anywhere
    in the name; C++ uses std::regex_search, ECMAScript syntax: keep to the
    common subset).
  * Placements: `default_placements` (default: "Shard(0)" on the mesh dim
    named "dp_shard", "Replicate()" on every other dim), then the first rule
    whose pattern matches overrides the dims it names. A placement list is
    positional (one per mesh dim: "Shard(0),Replicate()" or a list) or
    named ("tp:Shard(1)" or ``{"tp": "Shard(1)"}``) for some dims.
  * `transpose`: parameters whose name matches are stored transposed (GPT-2
    Conv1D holds [in, out]); the spec's shape swaps the last two dims
    ([in, out] -> [out, in], the matrix as torch.nn.Linear holds it), and
    placements refer to the swapped shape.
"""
import json
import re

from .distributed import Mesh, normalize_placement

__all__ = ["spec_from_module", "write_spec", "DEFAULT_EXCLUDE",
           "parse_mesh", "parse_placement_list"]

# Default exclusions (tools/spec_builder.h DefaultExcludePatterns):
# embeddings, output head, norms.
DEFAULT_EXCLUDE = ("embed", "wte", "wpe", "lm_head", "norm", "ln_")

_SHORT_SHARD_RE = re.compile(r"^S\(\s*(\d+)\s*\)$")


def _canonical_placement(text, what):
    """"Shard(0)" / "Replicate()" from DTensor spellings, "S(0)", "R",
    "Replicate" included (common/layout.h Placement::Parse)."""
    t = str(text).strip()
    m = _SHORT_SHARD_RE.match(t)
    if m:
        return f"Shard({int(m.group(1))})"
    if t in ("R", "Replicate"):
        return "Replicate()"
    try:
        return normalize_placement(t)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None


def parse_mesh(mesh):
    """[(name, size), ...] from "dp_shard=8,tp=8", a muonrt.Mesh, a dict
    {name: size} (insertion order) or a sequence of (name, size). "" or
    None = no dims (single device). Raises ValueError naming the item."""
    if mesh is None:
        return []
    if isinstance(mesh, Mesh):
        items = list(zip(mesh.names, mesh.sizes))
    elif isinstance(mesh, dict):
        items = list(mesh.items())
    elif isinstance(mesh, str):
        items = []
        if mesh.strip():
            for item in mesh.split(","):
                parts = item.strip().split("=")
                if len(parts) != 2:
                    raise ValueError(
                        f"mesh {mesh!r}: item {item.strip()!r} is not "
                        f"name=size")
                name, size = parts[0].strip(), parts[1].strip()
                if not re.fullmatch(r"[+]?\d+", size):
                    raise ValueError(
                        f"mesh {mesh!r}: dim {name!r} size {size!r} is not "
                        f"an integer >= 1")
                items.append((name, int(size)))
    else:
        items = [tuple(x) for x in mesh]
    out, seen = [], set()
    for name, size in items:
        name = str(name)
        if not name:
            raise ValueError(f"mesh {mesh!r}: a dim has an empty name")
        if isinstance(size, bool) or int(size) != size or int(size) < 1:
            raise ValueError(
                f"mesh {mesh!r}: dim {name!r} size {size!r} is not an "
                f"integer >= 1")
        if name in seen:
            raise ValueError(f"mesh {mesh!r}: dim {name!r} appears twice")
        seen.add(name)
        out.append((name, int(size)))
    return out


def parse_placement_list(placements, mesh, what="placements"):
    """One entry per mesh dim ("" = keep the default) from a positional list
    ("Shard(0),Replicate()" or ["Shard(0)", "Replicate()"]) or named dims
    ("tp:Shard(1)" or {"tp": "Shard(1)"}). `mesh` is parse_mesh's list.
    Raises ValueError naming `what`."""
    names = [n for n, _ in mesh]
    if isinstance(placements, dict):
        items = [f"{k}:{v}" for k, v in placements.items()]
    elif isinstance(placements, str):
        items = [p.strip() for p in placements.split(",") if p.strip()]
    else:
        items = [str(p).strip() for p in placements]
    if not items:
        raise ValueError(f"{what}: no placements given")
    named = [":" in p for p in items]
    out = [""] * len(names)
    if not any(named):
        if len(items) != len(names):
            raise ValueError(
                f"{what}: {len(items)} placements for a mesh of {len(names)} "
                f"dims {names}; give one per dim, or name dims as "
                f"dim:placement")
        return [_canonical_placement(p, what) for p in items]
    if not all(named):
        raise ValueError(
            f"{what}: mixes positional and dim:placement items; use one form")
    for item in items:
        dim, p = item.split(":", 1)
        dim = dim.strip()
        if dim not in names:
            raise ValueError(
                f"{what}: {item!r} names mesh dim {dim!r} but the mesh "
                f"{names} has no such dim")
        i = names.index(dim)
        if out[i]:
            raise ValueError(f"{what}: mesh dim {dim!r} is given twice")
        out[i] = _canonical_placement(p, what)
    return out


def _compile(pattern, what):
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(
            f"{what} {pattern!r}: bad regular expression: {e}") from None


def _rules(placements_rules):
    if placements_rules is None:
        return []
    if isinstance(placements_rules, dict):
        return list(placements_rules.items())
    out = []
    for r in placements_rules:
        if isinstance(r, str):  # "REGEX=PLACEMENTS", split at the last '='
            i = r.rfind("=")
            if i <= 0:
                raise ValueError(f"rule {r!r}: expected REGEX=PLACEMENTS")
            out.append((r[:i], r[i + 1:]))
        else:
            pattern, placements = r
            out.append((pattern, placements))
    return out


def _check_shard_dims(name, shape, placements):
    for p in placements:
        m = re.match(r"^Shard\((\d+)\)$", p)
        if m and int(m.group(1)) >= len(shape):
            raise ValueError(
                f"parameter {name!r}: placement {p} shards dim "
                f"{m.group(1)} of a {len(shape)}-D tensor {list(shape)}")


def spec_from_module(module, mesh, placements_rules=None, job_id=None, *,
                     default_placements=None, exclude=None, transpose=None,
                     expert_stacks=False, skipped=None):
    """The job spec (a JSON-ready dict, see the module docstring) for
    `module`'s Muon matrices.

    module: a torch.nn.Module; its named_parameters() (global shapes as the
        module holds them; DTensor parameters give their global shape).
    mesh: "dp_shard=8,tp=8", a muonrt.Mesh, {name: size} or [(name, size)].
    placements_rules: ordered rules, a list of (regex, placements) pairs or
        "REGEX=PLACEMENTS" strings, or a dict (insertion order); placements
        positional or named (module docstring). First match wins.
    job_id: JobSpec.job_id; required (non-empty).
    default_placements: placements for every matrix before rules; None =
        Shard(0) on "dp_shard", Replicate() elsewhere; named dims not given
        keep that built-in default.
    exclude: regexes replacing DEFAULT_EXCLUDE (None = the defaults, and
        then also split_params's rule: a 2-D parameter split_params gives to
        AdamW, such as an MLP's last Linear or an output head, is left out,
        so the spec plans exactly what muonrt.Muon(split_params(...)[0])
        steps).
    transpose: regex of parameters stored [in, out] (module docstring).
    expert_stacks: also take 3-D parameters as [experts, rows, cols].
    skipped: a list that receives (name, reason) for parameters left out.
    Raises ValueError for a bad mesh, placement, regex, an empty job_id, a
    Shard dim beyond a parameter's rank, or when no parameter is a matrix.
    """
    if not job_id:
        raise ValueError("spec_from_module: job_id is empty")
    dims = parse_mesh(mesh)
    defaults = _default_placements(dims, default_placements)
    rules = []
    for pattern, placements in _rules(placements_rules):
        what = f"rule {pattern!r}"
        rules.append((_compile(pattern, what),
                      parse_placement_list(placements, dims, what)))
    exclude, adamw_names = _exclusions(module, exclude)
    transpose_re = _compile(transpose, "transpose") if transpose else None

    params = []
    count = 0
    for name, p in module.named_parameters():
        count += 1
        shape = [int(d) for d in p.shape]
        reason = _skip_reason(name, p, shape, expert_stacks, exclude,
                              adamw_names)
        if reason is not None:
            if skipped is not None:
                skipped.append((name, reason))
            continue
        if transpose_re is not None and transpose_re.search(name):
            shape[-2], shape[-1] = shape[-1], shape[-2]
        placements = _rule_placements(name, defaults, rules)
        _check_shard_dims(name, shape, placements)
        params.append({"name": name, "shape": shape,
                       "placements": placements})
    if not params:
        raise ValueError(
            f"spec_from_module: none of the {count} parameters is a Muon "
            f"matrix (2-D floating point, not excluded)")
    return {
        "job_id": str(job_id),
        "mesh": {"dims": [{"name": n, "size": s} for n, s in dims]},
        "params": params,
    }


def _exclusions(module, exclude):
    """spec_from_module's exclusions: the (text, compiled) exclude regexes
    (DEFAULT_EXCLUDE when `exclude` is None), and then also the names of
    the 2-D parameters split_params gives to AdamW (else an empty set)."""
    adamw_names = set()
    if exclude is None:
        exclude = DEFAULT_EXCLUDE
        from .params import split_params
        adamw_names = {n for n, p in split_params(module)[1] if p.ndim == 2}
    elif isinstance(exclude, str):
        exclude = [exclude]
    return [(e, _compile(e, "exclude")) for e in exclude], adamw_names


def _rule_placements(name, defaults, rules):
    """Parameter `name`'s placements: the first rule whose regex matches
    it, over `defaults` (the dims a rule leaves empty keep theirs)."""
    for r, rule_placements in rules:
        if r.search(name):
            return [rp or d for rp, d in zip(rule_placements, defaults)]
    return list(defaults)


def _default_placements(dims, default_placements):
    """Every matrix's placements before the rules: Shard(0) on "dp_shard",
    Replicate() elsewhere, overridden per dim by `default_placements`."""
    defaults = ["Shard(0)" if n == "dp_shard" else "Replicate()"
                for n, _ in dims]
    if default_placements is None:
        return defaults
    given = parse_placement_list(default_placements, dims,
                                 "default_placements")
    return [g or d for g, d in zip(given, defaults)]


def _skip_reason(name, p, shape, expert_stacks, exclude, adamw_names):
    """Why parameter `name` is not a Muon matrix of the spec, or None."""
    if not p.dtype.is_floating_point:
        return f"dtype {p.dtype} is not floating point"
    if not (len(shape) == 2 or (len(shape) == 3 and expert_stacks)):
        return ("3-D (expert stacks not enabled)" if len(shape) == 3
                else f"{len(shape)}-D")
    if any(d < 1 for d in shape):
        return f"empty shape {shape}"
    for pattern, r in exclude:
        if r.search(name):
            return f'excluded by "{pattern}"'
    if name in adamw_names:
        return ("left to AdamW by split_params (embedding, output head or "
                "last Linear)")
    return None


def write_spec(spec, path):
    """Writes `spec` (spec_from_module's dict) to `path` as JSON, indented,
    for ``muonctl plan --spec PATH`` and ``muonctl validate --spec PATH``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=2)
        f.write("\n")
