#include "tools/spec_builder.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/layout.h"
#include "common/spec.h"
#include "common/status_macros.h"

namespace muon {
namespace {

// Compiles `pattern`; `what` names it in the error.
absl::StatusOr<std::regex> CompileRegex(const std::string& pattern,
                                        absl::string_view what) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " \"", pattern, "\": bad regular expression: ", e.what()));
  }
}

// Built-in default placements: Shard(0) on "dp_shard", else Replicate().
std::vector<std::string> BuiltinDefaultPlacements(const v1::Mesh& mesh) {
  std::vector<std::string> out;
  for (const v1::MeshDim& dim : mesh.dims()) {
    out.push_back(dim.name() == "dp_shard" ? "Shard(0)" : "Replicate()");
  }
  return out;
}

bool IsFloatingDtype(absl::string_view dtype) {
  return dtype == "F16" || dtype == "BF16" || dtype == "F32" ||
         dtype == "F64" || dtype == "F8_E4M3" || dtype == "F8_E5M2";
}

}  // namespace

const std::vector<std::string>& DefaultExcludePatterns() {
  static const std::vector<std::string>* const kPatterns =
      new std::vector<std::string>{"embed",   "wte",  "wpe",
                                   "lm_head", "norm", "ln_"};
  return *kPatterns;
}

absl::StatusOr<v1::Mesh> ParseMeshFlag(absl::string_view text) {
  v1::Mesh mesh;
  if (absl::StripAsciiWhitespace(text).empty()) return mesh;
  std::set<std::string> names;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> parts = absl::StrSplit(item, '=');
    int size = 0;
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh \"", text, "\": item \"", item, "\" is not name=size"));
    }
    const std::string name(absl::StripAsciiWhitespace(parts[0]));
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh \"", text, "\": item \"", item, "\" has an empty name"));
    }
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[1]), &size) ||
        size < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh \"", text, "\": dim \"", name, "\" size \"",
                       parts[1], "\" is not an integer >= 1"));
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh \"", text, "\": dim \"", name, "\" appears twice"));
    }
    v1::MeshDim* dim = mesh.add_dims();
    dim->set_name(name);
    dim->set_size(size);
  }
  MUON_RETURN_IF_ERROR(MeshFromProto(mesh).Validate());
  return mesh;
}

namespace {

// Placement `p` written canonically (Placement::ToString). Errors:
// InvalidArgument prefixed with `what` (unparsable, or Partial()).
absl::StatusOr<std::string> CanonicalPlacement(absl::string_view p,
                                               absl::string_view what) {
  absl::StatusOr<Placement> parsed = Placement::Parse(p);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", parsed.status().message()));
  }
  if (parsed->kind == Placement::Kind::kPartial) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": \"", p, "\": Partial() is not a parameter placement"));
  }
  return parsed->ToString();
}

// ParsePlacementList's named form: each item "dim:placement" into out[the
// dim's index]. Errors: InvalidArgument (an unknown or repeated dim, a bad
// placement).
absl::Status PlaceNamedItems(const std::vector<absl::string_view>& items,
                             const Mesh& m, absl::string_view what,
                             std::vector<std::string>* out) {
  for (absl::string_view item : items) {
    const size_t colon = item.find(':');
    const absl::string_view dim_name =
        absl::StripAsciiWhitespace(item.substr(0, colon));
    const int d = m.DimIndex(dim_name);
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": \"", item, "\" names mesh dim \"", dim_name,
                       "\" but the mesh ", m.ToString(), " has no such dim"));
    }
    if (!(*out)[d].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": mesh dim \"", dim_name, "\" is given twice"));
    }
    MUON_ASSIGN_OR_RETURN(
        (*out)[d],
        CanonicalPlacement(absl::StripAsciiWhitespace(item.substr(colon + 1)),
                           what));
  }
  return absl::OkStatus();
}

// `text` split at the commas outside parentheses, so that a placement
// with arguments, "_StridedShard(dim=0, sf=8)", stays one item. Items are
// stripped of surrounding whitespace; empty ones are dropped.
std::vector<absl::string_view> SplitTopLevelCommas(absl::string_view text) {
  std::vector<absl::string_view> items;
  int depth = 0;
  size_t begin = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size()) {
      if (text[i] == '(') ++depth;
      if (text[i] == ')' && depth > 0) --depth;
      if (text[i] != ',' || depth > 0) continue;
    }
    absl::string_view item =
        absl::StripAsciiWhitespace(text.substr(begin, i - begin));
    if (!item.empty()) items.push_back(item);
    begin = i + 1;
  }
  return items;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParsePlacementList(
    absl::string_view text, const v1::Mesh& mesh, absl::string_view what) {
  const std::vector<absl::string_view> items = SplitTopLevelCommas(text);
  if (items.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": no placements given"));
  }
  const int ndim = mesh.dims_size();
  size_t named = 0;
  for (absl::string_view item : items) {
    if (absl::StrContains(item, ':')) ++named;
  }
  std::vector<std::string> out(ndim);
  if (named == 0) {
    if (static_cast<int>(items.size()) != ndim) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", items.size(), " placements for a mesh of ",
                       ndim, " dims (", MeshFromProto(mesh).ToString(),
                       "); give one per dim, or name dims as dim:placement"));
    }
    for (int i = 0; i < ndim; ++i) {
      MUON_ASSIGN_OR_RETURN(out[i], CanonicalPlacement(items[i], what));
    }
    return out;
  }
  if (named != items.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": mixes positional and dim:placement items; use one form"));
  }
  MUON_RETURN_IF_ERROR(PlaceNamedItems(items, MeshFromProto(mesh), what, &out));
  return out;
}

namespace {

// One --rule "REGEX=PLACEMENTS" over `mesh`. Both halves may hold '=' (a
// regex's "(?=", a placement's "_StridedShard(dim=0, sf=8)"): the rule is
// split at the first '=' (after at least one character) whose remainder is
// a valid placement list. When none is, the error is the placement list's
// at the last '=' outside parentheses (the one a reader sees as the
// separator), or at the last '='.
// Errors: InvalidArgument naming the rule: no '=', a bad regex, a bad
// placement list (ParsePlacementList's errors).
absl::StatusOr<PlacementRule> ParseRuleFlag(const std::string& rule,
                                            const v1::Mesh& mesh) {
  const std::string what = absl::StrCat("--rule \"", rule, "\"");
  size_t separator = std::string::npos;  // the last '=' outside parentheses
  int depth = 0;
  for (size_t i = 0; i < rule.size(); ++i) {
    if (rule[i] == '(') ++depth;
    if (rule[i] == ')' && depth > 0) --depth;
    if (rule[i] == '=' && i > 0 && depth == 0) separator = i;
  }
  if (separator == std::string::npos) separator = rule.rfind('=');
  if (separator == std::string::npos || separator == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected REGEX=PLACEMENTS"));
  }
  const absl::string_view text(rule);
  for (size_t eq = rule.find('=', 1); eq != std::string::npos;
       eq = rule.find('=', eq + 1)) {
    absl::StatusOr<std::vector<std::string>> placements =
        ParsePlacementList(text.substr(eq + 1), mesh, what);
    if (!placements.ok()) continue;
    PlacementRule r;
    r.pattern = rule.substr(0, eq);
    MUON_RETURN_IF_ERROR(CompileRegex(r.pattern, what).status());
    r.placements = *std::move(placements);
    return r;
  }
  return ParsePlacementList(text.substr(separator + 1), mesh, what).status();
}

}  // namespace

absl::StatusOr<SpecBuildOptions> ParseSpecBuildOptions(
    absl::string_view mesh, absl::string_view default_placements,
    const std::vector<std::string>& rules,
    const std::vector<std::string>& exclude, absl::string_view transpose,
    absl::string_view job_id, bool expert_stacks) {
  SpecBuildOptions o;
  o.job_id = std::string(job_id);
  if (o.job_id.empty()) {
    return absl::InvalidArgumentError("--job_id is empty");
  }
  absl::StatusOr<v1::Mesh> parsed_mesh = ParseMeshFlag(mesh);
  if (!parsed_mesh.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mesh: ", parsed_mesh.status().message()));
  }
  o.mesh = *std::move(parsed_mesh);
  o.default_placements = BuiltinDefaultPlacements(o.mesh);
  if (!absl::StripAsciiWhitespace(default_placements).empty()) {
    MUON_ASSIGN_OR_RETURN(
        std::vector<std::string> given,
        ParsePlacementList(
            default_placements, o.mesh,
            absl::StrCat("--default_placements \"", default_placements, "\"")));
    for (size_t i = 0; i < given.size(); ++i) {
      if (!given[i].empty()) o.default_placements[i] = given[i];
    }
  }
  for (const std::string& rule : rules) {
    MUON_ASSIGN_OR_RETURN(PlacementRule r, ParseRuleFlag(rule, o.mesh));
    o.rules.push_back(std::move(r));
  }
  if (!exclude.empty()) o.exclude = exclude;
  for (const std::string& e : o.exclude) {
    MUON_RETURN_IF_ERROR(CompileRegex(e, "--exclude").status());
  }
  o.transpose = std::string(transpose);
  if (!o.transpose.empty()) {
    MUON_RETURN_IF_ERROR(CompileRegex(o.transpose, "--transpose").status());
  }
  o.expert_stacks = expert_stacks;
  return o;
}

namespace {

// The compiled patterns of SpecBuildOptions and the default placements.
struct CompiledSpecOptions {
  std::vector<std::string> defaults;  // one per mesh dim
  std::vector<std::regex> rules;      // options.rules[i].pattern
  std::vector<std::regex> exclude;    // options.exclude[i]
  std::optional<std::regex> transpose;
};

absl::StatusOr<CompiledSpecOptions> CompileSpecOptions(
    const SpecBuildOptions& options) {
  const int ndim = options.mesh.dims_size();
  CompiledSpecOptions c;
  c.defaults = options.default_placements;
  if (c.defaults.empty()) c.defaults = BuiltinDefaultPlacements(options.mesh);
  if (static_cast<int>(c.defaults.size()) != ndim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "default_placements has ", c.defaults.size(), " entries for a mesh of ",
        ndim, " dims (", MeshFromProto(options.mesh).ToString(), ")"));
  }
  for (size_t i = 0; i < options.rules.size(); ++i) {
    const PlacementRule& rule = options.rules[i];
    MUON_ASSIGN_OR_RETURN(
        std::regex re,
        CompileRegex(rule.pattern, absl::StrCat("rules[", i, "]")));
    if (static_cast<int>(rule.placements.size()) != ndim) {
      return absl::InvalidArgumentError(
          absl::StrCat("rules[", i, "] \"", rule.pattern, "\" has ",
                       rule.placements.size(), " placements for a mesh of ",
                       ndim, " dims; use \"\" to keep a dim's default"));
    }
    c.rules.push_back(std::move(re));
  }
  for (const std::string& e : options.exclude) {
    MUON_ASSIGN_OR_RETURN(std::regex re, CompileRegex(e, "exclude"));
    c.exclude.push_back(std::move(re));
  }
  if (!options.transpose.empty()) {
    MUON_ASSIGN_OR_RETURN(c.transpose,
                          CompileRegex(options.transpose, "transpose"));
  }
  return c;
}

// Whether `re` (the pattern `pattern`, named `what` in errors, e.g.
// "rules[0]") matches anywhere in tensor `name`. std::regex_search may
// throw while matching (the standard allows std::regex_error with
// error_complexity or error_stack; std::bad_alloc): that is an error
// naming the pattern and the tensor, never an exception out of BuildSpec.
// libstdc++ matches by recursion, some frames per character of `name`:
// names from ReadSafetensorsHeader are at most kMaxTensorNameBytes (4096)
// bytes, which fits a thread's stack.
// Errors: InvalidArgument naming `what`, the pattern, the tensor and the
//   exception's message.
absl::StatusOr<bool> SearchName(const std::string& name, const std::regex& re,
                                absl::string_view what,
                                const std::string& pattern) {
  try {
    return std::regex_search(name, re);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " \"", pattern, "\" could not be matched against tensor \"",
        name.substr(0, 256), name.size() > 256 ? "..." : "", "\": ", e.what()));
  }
}

// Why tensor `t` is not a Muon matrix of the spec, or "".
// Errors: SearchName's (an exclude pattern that throws while matching).
absl::StatusOr<std::string> SkipReason(const SafetensorsTensor& t,
                                       const SpecBuildOptions& options,
                                       const CompiledSpecOptions& c) {
  const int rank = static_cast<int>(t.shape.size());
  if (!IsFloatingDtype(t.dtype)) {
    return absl::StrCat("dtype ", t.dtype, " is not floating point");
  }
  if (rank != 2 && !(rank == 3 && options.expert_stacks)) {
    return rank == 3 ? "3-D (expert stacks not enabled)"
                     : absl::StrCat(rank, "-D");
  }
  if (std::any_of(t.shape.begin(), t.shape.end(),
                  [](int64_t d) { return d < 1; })) {
    return absl::StrCat("empty shape ", ShapeToString(t.shape));
  }
  for (size_t i = 0; i < c.exclude.size(); ++i) {
    MUON_ASSIGN_OR_RETURN(
        const bool excluded,
        SearchName(t.name, c.exclude[i], "exclude", options.exclude[i]));
    if (excluded) {
      return absl::StrCat("excluded by \"", options.exclude[i], "\"");
    }
  }
  return std::string();
}

// Adds matrix `t` to `spec`: its shape (transposed when the transpose
// pattern matches) and its placements (the first matching rule's over the
// defaults).
// Errors: SearchName's (a transpose or rule pattern that throws while
//   matching); `spec` is then unchanged.
absl::Status AddParam(const SafetensorsTensor& t,
                      const SpecBuildOptions& options,
                      const CompiledSpecOptions& c, v1::JobSpec* spec) {
  const int rank = static_cast<int>(t.shape.size());
  std::vector<int64_t> shape = t.shape;
  if (c.transpose.has_value()) {
    MUON_ASSIGN_OR_RETURN(
        const bool transposed,
        SearchName(t.name, *c.transpose, "transpose", options.transpose));
    if (transposed) std::swap(shape[rank - 2], shape[rank - 1]);
  }
  std::vector<std::string> placements = c.defaults;
  for (size_t i = 0; i < c.rules.size(); ++i) {
    MUON_ASSIGN_OR_RETURN(
        const bool matched,
        SearchName(t.name, c.rules[i], absl::StrCat("rules[", i, "]"),
                   options.rules[i].pattern));
    if (!matched) continue;
    for (size_t d = 0; d < placements.size(); ++d) {
      if (!options.rules[i].placements[d].empty()) {
        placements[d] = options.rules[i].placements[d];
      }
    }
    break;
  }
  v1::ParamSpec* param = spec->add_params();
  param->set_name(t.name);
  for (int64_t d : shape) param->add_shape(d);
  for (const std::string& p : placements) param->add_placements(p);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobSpec> BuildSpec(
    const std::vector<SafetensorsTensor>& tensors,
    const SpecBuildOptions& options, std::vector<SkippedTensor>* skipped) {
  if (options.job_id.empty()) {
    return absl::InvalidArgumentError("job_id is empty");
  }
  MUON_ASSIGN_OR_RETURN(CompiledSpecOptions compiled,
                        CompileSpecOptions(options));
  v1::JobSpec spec;
  spec.set_job_id(options.job_id);
  *spec.mutable_mesh() = options.mesh;
  for (const SafetensorsTensor& t : tensors) {
    // Before any pattern sees it: libstdc++'s regex matcher recurses per
    // character (a name of 100 KB overflows the stack).
    MUON_RETURN_IF_ERROR(CheckParamNameSize(t.name, ""));
    MUON_ASSIGN_OR_RETURN(std::string reason, SkipReason(t, options, compiled));
    if (reason.empty()) {
      MUON_RETURN_IF_ERROR(AddParam(t, options, compiled, &spec));
    } else if (skipped != nullptr) {
      skipped->push_back({t.name, std::move(reason)});
    }
  }
  if (spec.params_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "none of the ", tensors.size(),
        " tensors is a Muon matrix (2-D floating point, not excluded)"));
  }
  MUON_RETURN_IF_ERROR(ValidateJobSpec(spec));
  return spec;
}

}  // namespace muon
