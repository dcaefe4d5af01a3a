// Tests of tools/spec_builder.h: .safetensors headers written here (header
// JSON + zero-filled data) with GPT-2 and Llama names -> job specs with FSDP
// and TP rules, exclusions, the Conv1D transpose; a built spec plans
// (PlanJobFromSpec). The header reader's own tests are in
// tests/common/safetensors_test.cc.
#include "tools/spec_builder.h"

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plan/plan_job.h"
#include "tests/common/safetensors_test_util.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using Tensor = ::muon::testing::TestTensor;
using ::muon::testing::WriteTempSafetensors;

// The tensors of the file at `path` (ReadSafetensorsHeader).
absl::StatusOr<std::vector<SafetensorsTensor>> ReadTensors(
    const std::string& path) {
  absl::StatusOr<SafetensorsHeader> header = ReadSafetensorsHeader(path);
  if (!header.ok()) return header.status();
  return header->tensors;
}

// GPT-2 small's names and stored shapes (Conv1D weights are [in, out]), two
// blocks.
std::vector<Tensor> Gpt2Tensors() {
  std::vector<Tensor> t = {
      {"transformer.wte.weight", "F32", {50257, 768}},
      {"transformer.wpe.weight", "F32", {1024, 768}},
  };
  for (int i = 0; i < 2; ++i) {
    const std::string h = absl::StrCat("transformer.h.", i, ".");
    t.push_back({h + "ln_1.weight", "F32", {768}});
    t.push_back({h + "ln_1.bias", "F32", {768}});
    t.push_back({h + "attn.c_attn.weight", "F32", {768, 2304}});
    t.push_back({h + "attn.c_attn.bias", "F32", {2304}});
    t.push_back({h + "attn.c_proj.weight", "F32", {768, 768}});
    t.push_back({h + "ln_2.weight", "F32", {768}});
    t.push_back({h + "mlp.c_fc.weight", "F32", {768, 3072}});
    t.push_back({h + "mlp.c_proj.weight", "F32", {3072, 768}});
  }
  t.push_back({"transformer.ln_f.weight", "F32", {768}});
  return t;
}

// A small Llama (hidden 64, MLP 128, GQA with 2 KV heads of 16), BF16.
std::vector<Tensor> LlamaTensors() {
  std::vector<Tensor> t = {{"model.embed_tokens.weight", "BF16", {256, 64}}};
  for (int i = 0; i < 2; ++i) {
    const std::string l = absl::StrCat("model.layers.", i, ".");
    t.push_back({l + "input_layernorm.weight", "BF16", {64}});
    t.push_back({l + "self_attn.q_proj.weight", "BF16", {64, 64}});
    t.push_back({l + "self_attn.k_proj.weight", "BF16", {32, 64}});
    t.push_back({l + "self_attn.v_proj.weight", "BF16", {32, 64}});
    t.push_back({l + "self_attn.o_proj.weight", "BF16", {64, 64}});
    t.push_back({l + "post_attention_layernorm.weight", "BF16", {64}});
    t.push_back({l + "mlp.gate_proj.weight", "BF16", {128, 64}});
    t.push_back({l + "mlp.up_proj.weight", "BF16", {128, 64}});
    t.push_back({l + "mlp.down_proj.weight", "BF16", {64, 128}});
  }
  t.push_back({"model.norm.weight", "BF16", {64}});
  t.push_back({"lm_head.weight", "BF16", {256, 64}});
  return t;
}

const v1::ParamSpec* FindParam(const v1::JobSpec& spec,
                               const std::string& name) {
  for (const v1::ParamSpec& p : spec.params()) {
    if (p.name() == name) return &p;
  }
  return nullptr;
}

std::vector<int64_t> Shape(const v1::ParamSpec& p) {
  return {p.shape().begin(), p.shape().end()};
}
std::vector<std::string> Placements(const v1::ParamSpec& p) {
  return {p.placements().begin(), p.placements().end()};
}

TEST(BuildSpec, Gpt2FsdpWithTranspose_SwapsConv1DAndExcludesEmbeddingsNorms) {
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ReadTensors(WriteTempSafetensors("gpt2_fsdp.safetensors", Gpt2Tensors()));
  ASSERT_THAT(tensors, IsOk());
  absl::StatusOr<SpecBuildOptions> options = ParseSpecBuildOptions(
      "dp_shard=8", "", {}, {}, "c_attn|c_proj|c_fc", "gpt2-fsdp8");
  ASSERT_THAT(options, IsOk());
  std::vector<SkippedTensor> skipped;
  absl::StatusOr<v1::JobSpec> spec = BuildSpec(*tensors, *options, &skipped);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->job_id(), "gpt2-fsdp8");
  ASSERT_EQ(spec->mesh().dims_size(), 1);
  EXPECT_EQ(spec->mesh().dims(0).name(), "dp_shard");
  EXPECT_EQ(spec->mesh().dims(0).size(), 8);
  ASSERT_EQ(spec->params_size(), 8);  // 4 matrices x 2 blocks
  const v1::ParamSpec* c_attn =
      FindParam(*spec, "transformer.h.0.attn.c_attn.weight");
  ASSERT_NE(c_attn, nullptr);
  EXPECT_THAT(Shape(*c_attn), ElementsAre(2304, 768));  // [out, in]
  EXPECT_THAT(Placements(*c_attn), ElementsAre("Shard(0)"));
  EXPECT_THAT(Shape(*FindParam(*spec, "transformer.h.1.mlp.c_fc.weight")),
              ElementsAre(3072, 768));
  EXPECT_THAT(Shape(*FindParam(*spec, "transformer.h.1.mlp.c_proj.weight")),
              ElementsAre(768, 3072));
  for (const char* gone :
       {"transformer.wte.weight", "transformer.wpe.weight",
        "transformer.h.0.ln_1.weight", "transformer.h.0.attn.c_attn.bias",
        "transformer.ln_f.weight"}) {
    EXPECT_EQ(FindParam(*spec, gone), nullptr) << gone;
  }
  ASSERT_EQ(skipped.size(), Gpt2Tensors().size() - 8);
  EXPECT_EQ(skipped[0].name, "transformer.wte.weight");
  EXPECT_EQ(skipped[0].reason, "excluded by \"wte\"");
  EXPECT_EQ(skipped[2].reason, "1-D");

  // The spec round-trips through its JSON.
  absl::StatusOr<v1::JobSpec> reparsed = ParseJobSpecJson(JobSpecToJson(*spec));
  ASSERT_THAT(reparsed, IsOk());
  EXPECT_EQ(reparsed->SerializeAsString(), spec->SerializeAsString());
}

TEST(BuildSpec, Gpt2WithoutTranspose_KeepsStoredShape) {
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors = ReadTensors(
      WriteTempSafetensors("gpt2_plain.safetensors", Gpt2Tensors()));
  ASSERT_THAT(tensors, IsOk());
  absl::StatusOr<SpecBuildOptions> options =
      ParseSpecBuildOptions("dp_shard=8", "", {}, {}, "", "gpt2");
  ASSERT_THAT(options, IsOk());
  absl::StatusOr<v1::JobSpec> spec = BuildSpec(*tensors, *options);
  ASSERT_THAT(spec, IsOk());
  EXPECT_THAT(Shape(*FindParam(*spec, "transformer.h.0.attn.c_attn.weight")),
              ElementsAre(768, 2304));
}

v1::JobSpec LlamaTpSpec(const std::string& mesh) {
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ReadTensors(WriteTempSafetensors("llama.safetensors", LlamaTensors()));
  EXPECT_THAT(tensors, IsOk());
  absl::StatusOr<SpecBuildOptions> options = ParseSpecBuildOptions(
      mesh, "dp_shard:Shard(0)",
      {"q_proj|k_proj|v_proj|gate_proj|up_proj=tp:Shard(0)",
       "o_proj|down_proj=tp:S(1)"},
      {}, "", "llama-tp");
  EXPECT_THAT(options, IsOk());
  absl::StatusOr<v1::JobSpec> spec = BuildSpec(*tensors, *options);
  EXPECT_THAT(spec, IsOk());
  return spec.ok() ? *spec : v1::JobSpec();
}

TEST(BuildSpec, LlamaFsdpTp_AppliesColumnAndRowParallelRules) {
  const v1::JobSpec spec = LlamaTpSpec("dp_shard=2,tp=2");
  ASSERT_EQ(spec.params_size(), 14);  // 7 matrices x 2 layers
  const std::string l = "model.layers.1.";
  for (const char* col : {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                          "self_attn.v_proj.weight", "mlp.gate_proj.weight",
                          "mlp.up_proj.weight"}) {
    const v1::ParamSpec* p = FindParam(spec, l + col);
    ASSERT_NE(p, nullptr) << col;
    EXPECT_THAT(Placements(*p), ElementsAre("Shard(0)", "Shard(0)")) << col;
  }
  for (const char* row : {"self_attn.o_proj.weight", "mlp.down_proj.weight"}) {
    const v1::ParamSpec* p = FindParam(spec, l + row);
    ASSERT_NE(p, nullptr) << row;
    EXPECT_THAT(Placements(*p), ElementsAre("Shard(0)", "Shard(1)")) << row;
  }
  EXPECT_THAT(Shape(*FindParam(spec, l + "self_attn.k_proj.weight")),
              ElementsAre(32, 64));
  EXPECT_THAT(Shape(*FindParam(spec, l + "mlp.down_proj.weight")),
              ElementsAre(64, 128));
  for (const char* gone :
       {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
        "model.layers.0.input_layernorm.weight"}) {
    EXPECT_EQ(FindParam(spec, gone), nullptr) << gone;
  }
}

TEST(BuildSpec, LlamaFsdpTp_Plans) {
  const v1::JobSpec spec = LlamaTpSpec("dp_shard=2,tp=2");
  absl::StatusOr<JobPlan> plan = PlanJobFromSpec(spec);
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->plan.job_id(), "llama-tp");
  EXPECT_EQ(plan->plan.matrices_size(), 14);
}

TEST(BuildSpec, DefaultPlacements_ReplicateOffDpShard) {
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors = ReadTensors(
      WriteTempSafetensors("llama_hsdp.safetensors", LlamaTensors()));
  ASSERT_THAT(tensors, IsOk());
  absl::StatusOr<SpecBuildOptions> options =
      ParseSpecBuildOptions("dp_replicate=2,dp_shard=4", "", {}, {}, "", "h");
  ASSERT_THAT(options, IsOk());
  absl::StatusOr<v1::JobSpec> spec = BuildSpec(*tensors, *options);
  ASSERT_THAT(spec, IsOk());
  EXPECT_THAT(Placements(spec->params(0)),
              ElementsAre("Replicate()", "Shard(0)"));
}

TEST(BuildSpec, ExpertStacks_TakenOnlyWhenEnabled) {
  const std::vector<SafetensorsTensor> tensors = {
      {"model.layers.0.experts.w1", "F32", {4, 8, 6}, 0, 768},
      {"model.layers.0.router.weight", "F32", {4, 6}, 768, 864},
  };
  SpecBuildOptions o;
  o.job_id = "moe";
  std::vector<SkippedTensor> skipped;
  absl::StatusOr<v1::JobSpec> spec = BuildSpec(tensors, o, &skipped);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->params_size(), 1);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0].reason, HasSubstr("expert stacks not enabled"));

  o.expert_stacks = true;
  o.transpose = "experts";
  spec = BuildSpec(tensors, o);
  ASSERT_THAT(spec, IsOk());
  ASSERT_EQ(spec->params_size(), 2);
  EXPECT_THAT(Shape(spec->params(0)), ElementsAre(4, 6, 8));
}

TEST(BuildSpec, ExcludeReplacesDefaults) {
  const std::vector<SafetensorsTensor> tensors = {
      {"wte.weight", "F32", {8, 4}, 0, 128},
      {"h.0.mlp.weight", "F32", {4, 4}, 128, 192},
      {"steps", "I64", {2, 2}, 192, 224},
  };
  absl::StatusOr<SpecBuildOptions> o =
      ParseSpecBuildOptions("dp_shard=2", "", {}, {"^$"}, "", "x");
  ASSERT_THAT(o, IsOk());
  std::vector<SkippedTensor> skipped;
  absl::StatusOr<v1::JobSpec> spec = BuildSpec(tensors, *o, &skipped);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->params_size(), 2);  // wte kept, I64 skipped
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0].reason, HasSubstr("not floating point"));

  o = ParseSpecBuildOptions("dp_shard=2", "", {}, {"mlp"}, "", "x");
  ASSERT_THAT(o, IsOk());
  spec = BuildSpec(tensors, *o);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->params_size(), 1);
  EXPECT_EQ(spec->params(0).name(), "wte.weight");
}

TEST(BuildSpec, RuleShardBeyondMatrixRank_ReturnsInvalidArgumentNamingParam) {
  const std::vector<SafetensorsTensor> tensors = {{"w", "F32", {4, 4}, 0, 64}};
  absl::StatusOr<SpecBuildOptions> o =
      ParseSpecBuildOptions("tp=2", "", {"w=Shard(2)"}, {}, "", "x");
  ASSERT_THAT(o, IsOk());
  EXPECT_THAT(BuildSpec(tensors, *o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"w\"")));
}

// A caller's name of 100 KB (BuildSpec is public; safetensors headers
// already cap names at 4 KiB) is refused before libstdc++'s regex
// matcher, which recurses per character, sees it (it overflowed the
// stack).
TEST(BuildSpec, NameOverLimit_RefusedBeforeAnyPatternMatches) {
  const std::vector<SafetensorsTensor> tensors = {
      {std::string(100000, 'w'), "F32", {4, 4}, 0, 64}};
  absl::StatusOr<SpecBuildOptions> o =
      ParseSpecBuildOptions("tp=2", "", {"w.*w=Shard(0)"}, {}, "", "x");
  ASSERT_THAT(o, IsOk());
  EXPECT_THAT(BuildSpec(tensors, *o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("has a name of 100000 bytes")));
}

TEST(BuildSpec, NothingSelected_ReturnsInvalidArgument) {
  const std::vector<SafetensorsTensor> tensors = {{"norm", "F32", {4}, 0, 16}};
  SpecBuildOptions o;
  o.job_id = "x";
  EXPECT_THAT(BuildSpec(tensors, o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("none of the 1 tensors")));
  o.job_id = "";
  EXPECT_THAT(
      BuildSpec(tensors, o),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job_id")));
}

TEST(ParseSpecBuildOptions, BadFlags_ReturnInvalidArgumentNamingTheFlag) {
  auto parse = [](const std::string& mesh, const std::string& defaults,
                  std::vector<std::string> rules, const std::string& transpose,
                  const std::string& job_id) {
    return ParseSpecBuildOptions(mesh, defaults, rules, {}, transpose, job_id)
        .status();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(parse("dp_shard=0", "", {}, "", "j"),
              StatusIs(kInvalid, HasSubstr("--mesh")));
  EXPECT_THAT(parse("dp_shard", "", {}, "", "j"),
              StatusIs(kInvalid, HasSubstr("not name=size")));
  EXPECT_THAT(parse("tp=2,tp=2", "", {}, "", "j"),
              StatusIs(kInvalid, HasSubstr("twice")));
  EXPECT_THAT(parse("tp=2", "", {"o_proj"}, "", "j"),
              StatusIs(kInvalid, HasSubstr("expected REGEX=PLACEMENTS")));
  EXPECT_THAT(parse("tp=2", "", {"(=Shard(0)"}, "", "j"),
              StatusIs(kInvalid, HasSubstr("bad regular expression")));
  EXPECT_THAT(parse("tp=2", "", {"x=ep:Shard(0)"}, "", "j"),
              StatusIs(kInvalid, HasSubstr("no such dim")));
  EXPECT_THAT(parse("tp=2", "", {"x=Shard(0),Shard(1)"}, "", "j"),
              StatusIs(kInvalid, HasSubstr("2 placements for a mesh of 1")));
  EXPECT_THAT(parse("tp=2", "", {"x=Partial()"}, "", "j"),
              StatusIs(kInvalid, HasSubstr("Partial")));
  EXPECT_THAT(parse("tp=2", "Bogus(1)", {}, "", "j"),
              StatusIs(kInvalid, HasSubstr("--default_placements")));
  EXPECT_THAT(parse("tp=2", "", {}, "[", "j"),
              StatusIs(kInvalid, HasSubstr("--transpose")));
  EXPECT_THAT(parse("tp=2", "", {}, "", ""),
              StatusIs(kInvalid, HasSubstr("--job_id")));
  // A regex may itself contain '=': the split is at the first '=' followed
  // by a valid placement list.
  absl::StatusOr<SpecBuildOptions> o = ParseSpecBuildOptions(
      "dp_shard=2,tp=2", "", {"a(?=b)=tp:Shard(1)"}, {}, "", "j");
  ASSERT_THAT(o, IsOk());
  ASSERT_EQ(o->rules.size(), 1u);
  EXPECT_EQ(o->rules[0].pattern, "a(?=b)");
  EXPECT_THAT(o->rules[0].placements, ElementsAre("", "Shard(1)"));
  EXPECT_THAT(o->default_placements, ElementsAre("Shard(0)", "Replicate()"));
}

// "_StridedShard(dim=0, sf=8)" holds a comma and '=': lists were split at
// every comma and rules at the last '=', so FSDP2-over-TP placements could
// not be written.
TEST(ParsePlacementList, StridedShard_CommaInsideParenthesesKeepsOneItem) {
  absl::StatusOr<v1::Mesh> mesh = ParseMeshFlag("dp_shard=8,tp=8");
  ASSERT_THAT(mesh, IsOk());
  for (const char* text : {"_StridedShard(dim=0, sf=8),Shard(0)",
                           " dp_shard:_StridedShard(0, 8) , tp:S(0) "}) {
    absl::StatusOr<std::vector<std::string>> list =
        ParsePlacementList(text, *mesh, "x");
    ASSERT_THAT(list, IsOk()) << text;
    EXPECT_THAT(*list, ElementsAre("_StridedShard(dim=0, sf=8)", "Shard(0)"))
        << text;
  }
  EXPECT_THAT(ParsePlacementList("_StridedShard(dim=0, sf=8)", *mesh, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 placements for a mesh of 2")));
}

TEST(ParseSpecBuildOptions, RuleWithEqualsOnBothSides_SplitsBeforePlacements) {
  absl::StatusOr<SpecBuildOptions> o = ParseSpecBuildOptions(
      "dp_shard=2,tp=2", "",
      {"q_proj=_StridedShard(dim=0, sf=2),Shard(0)", "a=b=tp:Shard(1)",
       "c(?=d)=dp_shard:_StridedShard(dim=0, sf=2),tp:Shard(0)"},
      {}, "", "j");
  ASSERT_THAT(o, IsOk());
  ASSERT_EQ(o->rules.size(), 3u);
  EXPECT_EQ(o->rules[0].pattern, "q_proj");
  EXPECT_THAT(o->rules[0].placements,
              ElementsAre("_StridedShard(dim=0, sf=2)", "Shard(0)"));
  EXPECT_EQ(o->rules[1].pattern, "a=b");
  EXPECT_THAT(o->rules[1].placements, ElementsAre("", "Shard(1)"));
  EXPECT_EQ(o->rules[2].pattern, "c(?=d)");
  EXPECT_THAT(o->rules[2].placements,
              ElementsAre("_StridedShard(dim=0, sf=2)", "Shard(0)"));
  // The spec built from the first rule is valid (split factor 2 = tp).
  const std::vector<SafetensorsTensor> tensors = {
      {"q_proj.weight", "F32", {8, 4}, 0, 128}};
  absl::StatusOr<v1::JobSpec> spec = BuildSpec(tensors, *o);
  ASSERT_THAT(spec, IsOk());
  EXPECT_THAT(Placements(spec->params(0)),
              ElementsAre("_StridedShard(dim=0, sf=2)", "Shard(0)"));
  // No split gives a valid list: the error is the list's after the '='
  // outside parentheses.
  EXPECT_THAT(
      ParseSpecBuildOptions("dp_shard=2,tp=2", "",
                            {"q_proj=_StridedShard(dim=0, sf=2)"}, {}, "", "j"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("--rule \"q_proj=_StridedShard(dim=0, sf=2)\""),
                     HasSubstr("1 placements for a mesh of 2"))));
}

TEST(ParseMeshFlag, EmptyIsSingleDevice) {
  absl::StatusOr<v1::Mesh> mesh = ParseMeshFlag("");
  ASSERT_THAT(mesh, IsOk());
  EXPECT_EQ(mesh->dims_size(), 0);
  mesh = ParseMeshFlag(" dp_shard = 8 , tp=8 ");
  ASSERT_THAT(mesh, IsOk());
  ASSERT_EQ(mesh->dims_size(), 2);
  EXPECT_EQ(mesh->dims(1).name(), "tp");
  EXPECT_EQ(mesh->dims(1).size(), 8);
}

}  // namespace
}  // namespace muon
