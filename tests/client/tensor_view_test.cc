// Muon over views of trainer-owned memory (client/tensor_view.h): in-place
// updates of the trainer's buffers, bfloat16 parameters and gradients,
// re-bound gradients, the view checks, and FSDP over 4 thread ranks on views
// bitwise equal to a single device.
#include "client/tensor_view.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "device/cuda_runtime.h"
#include "gtest/gtest.h"
#include "kernels/bfloat16.h"
#include "kernels/muon_update.h"
#include "tests/client/rank_threads.h"
#include "tests/client/thread_world.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using kernels::bf16_t;
using kernels::Bf16ToFloat;
using kernels::FloatToBf16;
using testing::BitwiseEqual;
using testing::RandomValues;

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

// A trainer's own tensor: fp32 storage it allocated itself.
struct TrainerTensor {
  std::vector<int64_t> shape;
  std::vector<float> w;
  std::vector<float> g;
  ParamView View(const std::string& name) {
    ParamView v;
    v.name = name;
    v.data = w.data();
    v.grad = g.data();
    v.local_shape = shape;
    return v;
  }
};

TEST(Bf16Test, FloatToBf16_TiesAndSpecials_RoundToNearestEven) {
  // 1.0 + half an ulp of bf16: a tie, rounds down to the even 1.0.
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808000u)), 0x3F80u);
  // 1.0078125 (odd mantissa) + half an ulp: a tie, rounds up to even.
  EXPECT_EQ(FloatToBf16(FromBits(0x3F818000u)), 0x3F82u);
  // Just above and below the tie.
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808001u)), 0x3F81u);
  EXPECT_EQ(FloatToBf16(FromBits(0x3F807FFFu)), 0x3F80u);
  // The largest finite float rounds to infinity, as c10::BFloat16.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80u);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xFF80u);
  const bf16_t nan = FloatToBf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan)));
  EXPECT_EQ(Bf16ToFloat(0x4049u), 3.140625f);
}

TEST(Bf16Test, ApplyUpdate_Bf16Param_RoundsAfterEachTorchOp) {
  // Hand-computed: decay = 1 - 0.5*0.5 = 0.75, alpha = -0.25.
  bf16_t p[2] = {FloatToBf16(1.0f), FloatToBf16(3.0f)};
  const float o[2] = {0.0078125f, 1.0f};
  kernels::ApplyUpdate(p, o, 2, /*lr=*/0.5, /*weight_decay=*/0.5,
                       /*adjusted_lr=*/0.25);
  // Element 0: 0.75 - 0.001953125 = 0.748046875 = 0x3F3F8000 in fp32: a tie
  // between bf16 0x3F3F (0.74609375) and 0x3F40 (0.75): even is 0x3F40.
  EXPECT_EQ(p[0], 0x3F40u);
  // Element 1: 3 * 0.75 = 2.25 (exact in bf16), 2.25 - 0.25 = 2.0.
  EXPECT_EQ(Bf16ToFloat(p[1]), 2.0f);
}

TEST(TensorViewTest, Step_Float32Views_UpdatesTrainerBuffersInPlace) {
  TrainerTensor a{{6, 4}, RandomValues(24, 1), RandomValues(24, 2)};
  TrainerTensor b{{3, 5}, RandomValues(15, 3), RandomValues(15, 4)};
  const float* a_data = a.w.data();
  const std::vector<float> a_grad_before = a.g;
  // The same problem through owning Parameters (the convenience path).
  Parameter pa{"a", {}, false, {6, 4}, a.w, a.g};
  Parameter pb{"b", {}, false, {3, 5}, b.w, b.g};
  MuonOptions options;
  options.lr = 0.02;
  absl::StatusOr<std::unique_ptr<Muon>> on_views =
      Muon::Create({a.View("a"), b.View("b")}, options);
  absl::StatusOr<std::unique_ptr<Muon>> on_params =
      Muon::Create(std::vector<Parameter*>{&pa, &pb}, options);
  ASSERT_TRUE(on_views.ok()) << on_views.status();
  ASSERT_TRUE(on_params.ok()) << on_params.status();
  const std::vector<float> a_before = a.w;
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE((*on_views)->Step().ok());
    ASSERT_TRUE((*on_params)->Step().ok());
  }
  // Written where the trainer keeps it, not into a copy.
  EXPECT_EQ(a.w.data(), a_data);
  EXPECT_EQ((*on_views)->params()[0].data, static_cast<void*>(a.w.data()));
  EXPECT_FALSE(BitwiseEqual(a.w, a_before));
  EXPECT_TRUE(BitwiseEqual(a.w, pa.data));
  EXPECT_TRUE(BitwiseEqual(b.w, pb.data));
  // The gradient is read, never written.
  EXPECT_TRUE(BitwiseEqual(a.g, a_grad_before));
}

TEST(TensorViewTest,
     Step_Bf16WithoutWeightDecay_EqualsFp32StepRoundedToNearestEven) {
  // Without weight decay the bf16 path's first rounding is exact, so one
  // bf16 step is the fp32 step on the widened values, rounded once.
  const int64_t rows = 8, cols = 6, n = rows * cols;
  std::vector<bf16_t> w16(n), g16(n);
  const std::vector<float> w0 = RandomValues(n, 7), g0 = RandomValues(n, 8);
  std::vector<float> w32(n), g32(n);
  for (int64_t i = 0; i < n; ++i) {
    w16[i] = FloatToBf16(w0[i]);
    g16[i] = FloatToBf16(g0[i]);
    w32[i] = Bf16ToFloat(w16[i]);
    g32[i] = Bf16ToFloat(g16[i]);
  }
  ParamView v16;
  v16.name = "w";
  v16.data = w16.data();
  v16.grad = g16.data();
  v16.dtype = DType::kBFloat16;
  v16.grad_dtype = DType::kBFloat16;
  v16.local_shape = {rows, cols};
  ParamView v32 = v16;
  v32.data = w32.data();
  v32.grad = g32.data();
  v32.dtype = v32.grad_dtype = DType::kFloat32;
  // Both momentum dtypes: float32 for both runs, and bf16 (the bf16
  // parameter's default, as torch keeps it) for both.
  for (MomentumDType momentum :
       {MomentumDType::kFloat32, MomentumDType::kBFloat16}) {
    std::vector<bf16_t> w16_run = w16;
    std::vector<float> w32_run = w32;
    v16.data = w16_run.data();
    v32.data = w32_run.data();
    MuonOptions options;
    options.lr = 0.05;
    options.weight_decay = 0.0;
    options.momentum_dtype = momentum;
    MuonOptions options16 = options;
    if (momentum == MomentumDType::kBFloat16) {
      options16.momentum_dtype = MomentumDType::kParam;  // the default
    }
    auto m16 = Muon::Create({v16}, options16);
    auto m32 = Muon::Create({v32}, options);
    ASSERT_TRUE(m16.ok()) << m16.status();
    ASSERT_TRUE(m32.ok()) << m32.status();
    ASSERT_TRUE((*m16)->Step().ok());
    ASSERT_TRUE((*m32)->Step().ok());
    int changed = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(w16_run[i], FloatToBf16(w32_run[i])) << "element " << i;
      changed += w16_run[i] != FloatToBf16(w0[i]);
    }
    EXPECT_GT(changed, 0);
    // The momentum buffers hold the same values.
    EXPECT_TRUE(
        BitwiseEqual((*m16)->momentum_buffer(0), (*m32)->momentum_buffer(0)));
  }
}

TEST(TensorViewTest, Step_Bf16GradFp32Param_MomentumEqualsWidenedGradient) {
  const int64_t n = 20;
  std::vector<float> w = RandomValues(n, 9), w_ref = w;
  std::vector<bf16_t> g16(n);
  std::vector<float> g_wide(n);
  const std::vector<float> g0 = RandomValues(n, 10);
  for (int64_t i = 0; i < n; ++i) {
    g16[i] = FloatToBf16(g0[i]);
    g_wide[i] = Bf16ToFloat(g16[i]);
  }
  ParamView v;
  v.name = "w";
  v.data = w.data();
  v.grad = g16.data();
  v.grad_dtype = DType::kBFloat16;
  v.local_shape = {4, 5};
  ParamView ref = v;
  ref.data = w_ref.data();
  ref.grad = g_wide.data();
  ref.grad_dtype = DType::kFloat32;
  auto m = Muon::Create({v});
  auto r = Muon::Create({ref});
  ASSERT_TRUE(m.ok() && r.ok());
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE((*m)->Step().ok());
    ASSERT_TRUE((*r)->Step().ok());
  }
  EXPECT_TRUE(BitwiseEqual(w, w_ref));
}

TEST(TensorViewTest, SetGrad_NewBuffer_StepReadsIt) {
  TrainerTensor t{{4, 4}, RandomValues(16, 11), {}};
  std::vector<float> zero(16, 0.0f), g = RandomValues(16, 12);
  ParamView v = t.View("w");
  v.grad = zero.data();
  MuonOptions options;
  options.weight_decay = 0.0;
  auto m = Muon::Create({v}, options);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->SetGrad(0, g.data()).ok());
  ASSERT_TRUE((*m)->Step().ok());
  // A zero gradient would leave the momentum buffer at zero.
  EXPECT_NE((*m)->momentum_buffer(0)[0], 0.0f);
  EXPECT_THAT((*m)->SetGrad(1, g.data()),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
}

TEST(TensorViewTest, Step_NoGradient_FailsBeforeTouchingAnything) {
  TrainerTensor t{{4, 4}, RandomValues(16, 13), RandomValues(16, 14)};
  auto m = Muon::Create({t.View("w")});
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE((*m)->SetGrad(0, nullptr).ok());
  const std::vector<float> before = t.w;
  absl::Status s = (*m)->Step();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::_));
  EXPECT_NE(s.message().find("\"w\" has no gradient"), std::string::npos) << s;
  EXPECT_TRUE(BitwiseEqual(t.w, before));
  EXPECT_EQ((*m)->step_count(), 0);
}

TEST(TensorViewTest,
     Create_NonContiguousStrides_InvalidArgumentNamingParameter) {
  TrainerTensor t{{4, 3}, RandomValues(12, 15), RandomValues(12, 16)};
  ParamView v = t.View("layers.0.w");
  v.strides = {1, 4};  // a transposed (column-major) view
  absl::StatusOr<std::unique_ptr<Muon>> m = Muon::Create({v});
  EXPECT_THAT(m.status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_NE(m.status().message().find("\"layers.0.w\" has strides [1, 4]"),
            std::string::npos)
      << m.status();
  v.strides = {3, 1};  // contiguous, spelled out
  EXPECT_TRUE(Muon::Create({v}).ok());
}

// CUDA parameters are accepted; a device that is not there (the first
// ordinal past the visible ones) fails Create with the device layer's
// reason: no CUDA in this build (Unimplemented) or no such device
// (FailedPrecondition).
TEST(TensorViewTest, Create_CudaDeviceNotVisible_ErrorNamesDeviceAndReason) {
  TrainerTensor t{{2, 2}, RandomValues(4, 17), RandomValues(4, 18)};
  ParamView v = t.View("w");
  const int missing = device::CudaDeviceCount();
  v.device = Device::Cuda(missing);
  absl::StatusOr<std::unique_ptr<Muon>> m = Muon::Create({v});
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(absl::IsUnimplemented(m.status()) ||
              absl::IsFailedPrecondition(m.status()))
      << m.status();
  EXPECT_NE(m.status().message().find(
                absl::StrCat("the parameters are on cuda:", missing)),
            std::string::npos)
      << m.status();
  if (absl::IsUnimplemented(m.status())) {
    EXPECT_NE(m.status().message().find("--config=cuda"), std::string::npos)
        << m.status();
  }
}

TEST(TensorViewTest, Create_ParametersOnTwoDevices_InvalidArgumentNamingBoth) {
  TrainerTensor a{{2, 2}, RandomValues(4, 17), RandomValues(4, 18)};
  TrainerTensor b{{2, 2}, RandomValues(4, 19), RandomValues(4, 20)};
  ParamView va = a.View("a");
  ParamView vb = b.View("b");
  vb.device = Device::Cuda(0);
  absl::StatusOr<std::unique_ptr<Muon>> m = Muon::Create({va, vb});
  EXPECT_THAT(m.status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_NE(m.status().message().find(
                "\"a\" is on cpu but parameter \"b\" is on cuda:0"),
            std::string::npos)
      << m.status();
}

TEST(TensorViewTest, Create_NegativeCudaOrdinal_InvalidArgument) {
  TrainerTensor t{{2, 2}, RandomValues(4, 17), RandomValues(4, 18)};
  ParamView v = t.View("w");
  v.device = Device::Cuda(-1);
  absl::StatusOr<std::unique_ptr<Muon>> m = Muon::Create({v});
  EXPECT_THAT(m.status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_NE(m.status().message().find("\"w\" is on cuda:-1"), std::string::npos)
      << m.status();
}

TEST(TensorViewTest, Create_NullData_InvalidArgument) {
  ParamView v;
  v.name = "w";
  v.local_shape = {2, 2};
  EXPECT_THAT(Muon::Create({v}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(
    TensorViewTest,
    SetParamHyperparameters_PerParameterLrDecayMomentum_LikeSeparateOptimizers) {
  // Two "param groups": a with lr 0.05 / wd 0.2 / momentum 0.85 (as
  // OneCycleLR's cycled momentum sets it), b frozen (lr 0, wd 0).
  TrainerTensor a{{6, 4}, RandomValues(24, 31), RandomValues(24, 32)};
  TrainerTensor b{{3, 5}, RandomValues(15, 33), RandomValues(15, 34)};
  TrainerTensor a_ref = a;
  const std::vector<float> b_before = b.w;
  auto grouped = Muon::Create({a.View("a"), b.View("b")});
  ASSERT_TRUE(grouped.ok());
  ASSERT_TRUE((*grouped)->SetParamHyperparameters(0, 0.05, 0.2, 0.85).ok());
  ASSERT_TRUE((*grouped)->SetParamHyperparameters(1, 0.0, 0.0, 0.95).ok());
  MuonOptions a_options;
  a_options.lr = 0.05;
  a_options.weight_decay = 0.2;
  a_options.momentum = 0.85;
  auto alone = Muon::Create({a_ref.View("a")}, a_options);
  ASSERT_TRUE(alone.ok());
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE((*grouped)->Step().ok());
    ASSERT_TRUE((*alone)->Step().ok());
  }
  EXPECT_TRUE(BitwiseEqual(a.w, a_ref.w));
  EXPECT_TRUE(BitwiseEqual((*grouped)->momentum_buffer(0),
                           (*alone)->momentum_buffer(0)));
  EXPECT_TRUE(BitwiseEqual(b.w, b_before));
  // A momentum changed between steps is the next step's: one more step of
  // each at 0.9.
  ASSERT_TRUE((*grouped)->SetParamHyperparameters(0, 0.05, 0.2, 0.9).ok());
  MuonOptions later = a_options;
  later.momentum = 0.9;
  TrainerTensor a_later = a_ref;
  auto resumed = Muon::Create({a_later.View("a")}, later);
  ASSERT_TRUE(resumed.ok());
  ASSERT_TRUE((*resumed)->load_state_dict((*alone)->state_dict()).ok());
  ASSERT_TRUE((*grouped)->Step().ok());
  ASSERT_TRUE((*resumed)->Step().ok());
  EXPECT_TRUE(BitwiseEqual(a.w, a_later.w));
  // torch's messages, the value as Python prints it, and the parameter.
  EXPECT_THAT((*grouped)->SetParamHyperparameters(1, -1.0, 0.0, 0.9),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("Learning rate should be >= 0 but "
                                            "is: -1.0 (parameter \"")));
  EXPECT_THAT((*grouped)->SetParamHyperparameters(1, 0.1, -0.5, 0.9),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("weight decay should be >= 0 but "
                                            "is: -0.5 (parameter \"")));
  EXPECT_THAT((*grouped)->SetParamHyperparameters(1, 0.1, 0.0, -0.25),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("momentum should be >= 0 but "
                                            "is: -0.25 (parameter \"b\")")));
  EXPECT_THAT((*grouped)->SetParamHyperparameters(2, 0.1, 0.0, 0.9),
              StatusIs(absl::StatusCode::kOutOfRange, ::testing::_));
}

// FSDP Shard(0) over 4 thread ranks, each stepping views of its own shard
// buffers: bitwise equal to a single device on the whole matrices.
TEST(TensorViewTest, Step_FsdpOver4OnViews_BitwiseEqualsSingleDevice) {
  const int world = 4, steps = 3;
  const std::vector<std::vector<int64_t>> shapes = {{10, 7}, {16, 12}, {3, 9}};
  const size_t np = shapes.size();
  std::vector<std::vector<float>> init(np);
  std::vector<std::vector<std::vector<float>>> grads(steps);
  for (size_t i = 0; i < np; ++i) {
    init[i] = RandomValues(shapes[i][0] * shapes[i][1], 20 + i);
    for (int s = 0; s < steps; ++s) {
      grads[s].push_back(
          RandomValues(shapes[i][0] * shapes[i][1], 100 * s + i));
    }
  }
  MuonOptions options;
  options.lr = 0.03;
  // Single device, on views of whole matrices.
  std::vector<std::vector<float>> single_w = init, single_g(np);
  {
    std::vector<ParamView> views;
    for (size_t i = 0; i < np; ++i) {
      single_g[i].resize(single_w[i].size());
      ParamView v;
      v.name = "p" + std::to_string(i);
      v.data = single_w[i].data();
      v.grad = single_g[i].data();
      v.local_shape = shapes[i];
      views.push_back(v);
    }
    auto m = Muon::Create(views, options);
    ASSERT_TRUE(m.ok()) << m.status();
    for (int s = 0; s < steps; ++s) {
      for (size_t i = 0; i < np; ++i)
        single_g[i] = grads[s][i];  // same storage
      ASSERT_TRUE((*m)->Step().ok());
    }
  }
  testing::ThreadWorld tw(world);
  ASSERT_TRUE(tw.Connect());
  const Mesh mesh = Mesh::OneDim(world, "dp_shard");
  std::vector<std::vector<std::vector<float>>> shard_w(world), shard_g(world);
  std::vector<std::vector<Box>> boxes(np);
  for (size_t i = 0; i < np; ++i) {
    auto b = AllBoxes(shapes[i][0], shapes[i][1], {Placement::Shard(0)}, mesh);
    ASSERT_TRUE(b.ok());
    boxes[i] = *b;
  }
  std::vector<absl::Status> st =
      testing::RunOnRanks(world, [&](int rank) -> absl::Status {
        std::vector<ParamView> views;
        std::vector<ParamPlacement> placements;
        shard_w[rank].resize(np);
        shard_g[rank].resize(np);
        for (size_t i = 0; i < np; ++i) {
          const Box& box = boxes[i][rank];
          const Box whole{Range{0, shapes[i][0]}, Range{0, shapes[i][1]}};
          shard_w[rank][i].resize(box.numel());
          shard_g[rank][i].resize(box.numel());
          CopyRegion(init[i].data(), whole, shard_w[rank][i].data(), box, box);
          ParamView v;
          v.name = "p" + std::to_string(i);
          v.data = shard_w[rank][i].data();
          v.grad = shard_g[rank][i].data();
          v.local_shape = {box.rows.size(), box.cols.size()};
          v.global_shape = shapes[i];
          views.push_back(v);
          placements.push_back(ParamPlacement{{Placement::Shard(0)}});
        }
        absl::StatusOr<DistributedConfig> config = CreateMeshConfig(
            mesh, placements, tw.comm(rank), tw.client(rank), rank + 1);
        if (!config.ok()) return config.status();
        config->state.rank = rank;
        config->state.world_size = world;
        auto m = Muon::Create(views, options, *config);
        if (!m.ok()) return m.status();
        for (int s = 0; s < steps; ++s) {
          for (size_t i = 0; i < np; ++i) {
            const Box& box = boxes[i][rank];
            const Box whole{Range{0, shapes[i][0]}, Range{0, shapes[i][1]}};
            CopyRegion(grads[s][i].data(), whole, shard_g[rank][i].data(), box,
                       box);
          }
          absl::Status s2 = (*m)->Step();
          if (!s2.ok()) return s2;
        }
        return absl::OkStatus();
      });
  for (int r = 0; r < world; ++r)
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  for (size_t i = 0; i < np; ++i) {
    std::vector<float> assembled(init[i].size());
    const Box whole{Range{0, shapes[i][0]}, Range{0, shapes[i][1]}};
    for (int r = 0; r < world; ++r) {
      CopyRegion(shard_w[r][i].data(), boxes[i][r], assembled.data(), whole,
                 boxes[i][r]);
    }
    EXPECT_TRUE(BitwiseEqual(assembled, single_w[i])) << "parameter " << i;
  }
}

}  // namespace
}  // namespace muon
