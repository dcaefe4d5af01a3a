// Job specs from real models: a Hugging Face .safetensors checkpoint's
// header (names, dtypes, shapes; no tensor data is read) plus a mesh and
// placement rules -> a validated muon.v1.JobSpec (common/spec.h).
//
// Which tensors become Muon matrices (the spec's params), in order:
//   1. dtype is a floating type (F16, BF16, F32, F64, F8_E4M3, F8_E5M2);
//   2. 2-D, or 3-D when SpecBuildOptions.expert_stacks ([experts, rows,
//      cols], each slice its own matrix); every dim >= 1;
//   3. the name matches none of SpecBuildOptions.exclude (defaults:
//      kDefaultExcludePatterns, embeddings, output head, norms).
// Everything else is skipped (listed in BuildSpec's `skipped`, with why).
//
// Placements: each matrix gets SpecBuildOptions.default_placements (one per
// mesh dim), then the first rule whose regex matches its name overrides the
// dims the rule names. Placements are DTensor spellings ("Shard(0)",
// "Replicate()", also "S(0)", "R"), written canonically into the spec, and
// refer to the spec's shape (after any transpose).
//
// Patterns are ECMAScript regular expressions (std::regex; RE2 is not
// available here) matched with std::regex_search, i.e. anywhere in the name,
// as Python's re.search: "norm" matches "model.norm.weight"; anchor with ^
// and $ for a whole-name match. muonrt.spec_from_module (python/muonrt/
// spec.py) applies the same rules to a torch.nn.Module.
//
// Example (what `muonctl spec` is meant to map its flags to):
//   muonctl spec --safetensors model.safetensors --mesh dp_shard=8,tp=8
//     --default_placements 'dp_shard:Shard(0)'
//     --rule 'q_proj|k_proj|v_proj|gate_proj|up_proj=tp:Shard(0)'
//     --rule 'o_proj|down_proj=tp:Shard(1)' --job_id llama-tp8-dp8
// (one command line) is, in C++:
//
//   MUON_ASSIGN_OR_RETURN(SafetensorsHeader header,
//                         ReadSafetensorsHeader(path));
//   MUON_ASSIGN_OR_RETURN(
//       SpecBuildOptions options,
//       ParseSpecBuildOptions("dp_shard=8,tp=8", "dp_shard:Shard(0)",
//                             {"q_proj|k_proj|v_proj|gate_proj|up_proj="
//                              "tp:Shard(0)",
//                              "o_proj|down_proj=tp:Shard(1)"},
//                             /*exclude=*/{}, /*transpose=*/"",
//                             "llama-tp8-dp8"));
//   MUON_ASSIGN_OR_RETURN(v1::JobSpec spec,
//                         BuildSpec(header.tensors, options));
//   std::cout << JobSpecToJson(spec);
// gives model.layers.0.self_attn.q_proj.weight [4096, 4096] placements
// [Shard(0), Shard(0)], ...o_proj.weight [Shard(0), Shard(1)], and no
// embed_tokens, norm or lm_head entries.
//
// GPT-2 (Conv1D stores [in, out]): --transpose 'c_attn|c_proj|c_fc' turns
// transformer.h.0.attn.c_attn.weight, stored [768, 2304], into the spec
// shape [2304, 768] = [out, in], the matrix torch.nn.Linear would hold.
//
// Thread-safety: pure functions.
#ifndef MUON_TOOLS_SPEC_BUILDER_H_
#define MUON_TOOLS_SPEC_BUILDER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// Exclude patterns used when SpecBuildOptions.exclude is left as is:
// embeddings ("embed", "wte", "wpe"), the output head ("lm_head") and norms
// ("norm", "ln_"). Matched with regex_search (see the file comment).
const std::vector<std::string>& DefaultExcludePatterns();

// Placements for the matrices whose name matches `pattern`.
struct PlacementRule {
  // ECMAScript regex, matched with std::regex_search.
  std::string pattern;
  // One per mesh dim (mesh order). An empty string keeps that dim's
  // default placement, so {"", "Shard(1)"} on a dp_shard x tp mesh changes
  // only tp.
  std::vector<std::string> placements;
};

// What BuildSpec builds. Fill it directly or with ParseSpecBuildOptions.
struct SpecBuildOptions {
  // JobSpec.job_id; must be non-empty.
  std::string job_id;
  // The device mesh, dims in order (row-major rank layout). Empty = a
  // single-device job with no mesh dims.
  v1::Mesh mesh;
  // One placement per mesh dim for every matrix. Empty = "Shard(0)" on the
  // dim named "dp_shard" (FSDP) and "Replicate()" on every other dim.
  std::vector<std::string> default_placements;
  // Tried in order; the first whose pattern matches a matrix's name
  // overrides the default on the dims it names.
  std::vector<PlacementRule> rules;
  // A tensor whose name matches any of these is not a Muon matrix.
  std::vector<std::string> exclude = DefaultExcludePatterns();
  // Tensors (2-D or 3-D) whose name matches this are stored transposed, as
  // GPT-2's Conv1D stores its weight [in, out]: the spec's shape swaps the
  // last two dims of the stored shape ([in, out] -> [out, in]; [E, in,
  // out] -> [E, out, in]), i.e. the matrix as torch.nn.Linear holds it.
  // Placements refer to the swapped shape. Empty = nothing is transposed.
  std::string transpose;
  // Also take 3-D tensors, as expert stacks [experts, rows, cols].
  bool expert_stacks = false;
};

// A mesh from "dp_shard=8,tp=8" (name=size, comma-separated, mesh order;
// spaces around items are ignored). "" = no dims (single device).
// Errors:
//   InvalidArgument: an item is not name=size, a name is empty or repeats,
//     a size is not an integer >= 1 (names the item), or the mesh is too
//     large (Mesh::Validate's message).
absl::StatusOr<v1::Mesh> ParseMeshFlag(absl::string_view text);

// Placements for `mesh` from a comma-separated list, either positional,
// one per mesh dim ("Shard(0),Replicate()"), or named, "dim:placement"
// items for some dims ("tp:Shard(1)"), the others "" (keep the default).
// Only commas outside parentheses separate items, so
// "_StridedShard(dim=0, sf=8),Shard(0)" is two placements.
// Placements are written canonically ("S(0)" -> "Shard(0)").
// `what` names the list in errors (e.g. `rule "o_proj=tp:Shard(1)"`).
// Errors:
//   InvalidArgument: the list is empty, positional with the wrong count,
//     mixes the two forms, names a dim the mesh lacks or a dim twice, or a
//     placement does not parse or is Partial (names `what` and the item).
absl::StatusOr<std::vector<std::string>> ParsePlacementList(
    absl::string_view text, const v1::Mesh& mesh, absl::string_view what);

// SpecBuildOptions from command-line strings:
//   mesh: ParseMeshFlag's syntax, "dp_shard=8,tp=8".
//   default_placements: ParsePlacementList's syntax; named dims not given
//     keep the built-in default (Shard(0) on dp_shard, else Replicate());
//     "" = the built-in default.
//   rules: each "REGEX=PLACEMENTS", e.g. "o_proj|down_proj=tp:Shard(1)".
//     Either half may contain '=' ("a(?=b)=tp:Shard(1)",
//     "w=_StridedShard(dim=0, sf=8),Shard(0)"): the rule is split at the
//     first '=' whose remainder is a valid placement list for the mesh
//     (then the regex must compile).
//   exclude: regexes replacing DefaultExcludePatterns() when non-empty
//     (pass {"^$"} to exclude nothing).
//   transpose: a regex, "" = none.
//   job_id: must be non-empty.
//   expert_stacks: SpecBuildOptions.expert_stacks.
// Every regex is compiled here so that a bad one is reported up front.
// Errors:
//   InvalidArgument: names the flag and the value, e.g. `--rule
//     "o_proj": expected REGEX=PLACEMENTS`, `--transpose "(": bad regex:
//     ...`, `--job_id is empty`.
absl::StatusOr<SpecBuildOptions> ParseSpecBuildOptions(
    absl::string_view mesh, absl::string_view default_placements,
    const std::vector<std::string>& rules,
    const std::vector<std::string>& exclude, absl::string_view transpose,
    absl::string_view job_id, bool expert_stacks = false);

// A tensor BuildSpec left out of the spec, and why ("excluded by
// \"norm\"", "1-D", "dtype I64 is not floating point", ...).
struct SkippedTensor {
  std::string name;
  std::string reason;
};

// The job spec for `tensors` (in their order) under `options`: job_id,
// mesh, and one ParamSpec per Muon matrix (see the file comment) with the
// spec shape (stored shape, last two dims swapped when it matches
// `options.transpose`) and its placements. optimizer and execution are
// left unset (PyTorch's defaults). Validated with ValidateJobSpec before it
// is returned. When `skipped` is not null, it receives the tensors left
// out, in order.
// Errors:
//   InvalidArgument: job_id empty; a pattern does not compile (names the
//     option); default or rule placements not one per mesh dim; no tensor
//     is a Muon matrix; or ValidateJobSpec's error (names the parameter,
//     e.g. a rule's Shard(2) on a 2-D matrix); or std::regex_search threw
//     while matching a pattern against a name (names the option, the
//     pattern and the tensor); a tensor name over kMaxTensorNameBytes
//     (CheckParamNameSize), before any pattern is matched against it.
absl::StatusOr<v1::JobSpec> BuildSpec(
    const std::vector<SafetensorsTensor>& tensors,
    const SpecBuildOptions& options,
    std::vector<SkippedTensor>* skipped = nullptr);

}  // namespace muon

#endif  // MUON_TOOLS_SPEC_BUILDER_H_
