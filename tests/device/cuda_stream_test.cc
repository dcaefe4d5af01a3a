// CUDA streams, events and memory of the device layer (device/runtime.h):
// streams, events and the allocator work end to end (a copy in on one
// stream, an event, a copy out on another; the copies synchronize
// themselves, so this checks the calls, not that WaitFor orders), and
// host events are refused on CUDA streams. Skips without a GPU (fails
// with MUON_REQUIRE_GPU=1).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "device/cuda_runtime.h"
#include "device/device.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"
#include "tests/status_matchers.h"

namespace muon {
namespace device {
namespace {

using ::testing::ElementsAreArray;

TEST(CudaStreamTest, CopyRecordWaitCopy_RoundTripsThroughDeviceBuffer) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  absl::StatusOr<Runtime*> rt = GetRuntime(Device::Cuda(0));
  ASSERT_THAT(rt, IsOk());
  absl::StatusOr<std::unique_ptr<Stream>> a = (*rt)->CreateStream("a");
  absl::StatusOr<std::unique_ptr<Stream>> b = (*rt)->CreateStream("b");
  absl::StatusOr<std::unique_ptr<Event>> ready = (*rt)->CreateEvent("ready");
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  ASSERT_THAT(ready, IsOk());
  EXPECT_EQ((*a)->device(), Device::Cuda(0));
  EXPECT_NE((*a)->native_handle(), nullptr);
  const int64_t n = 1 << 20;
  absl::StatusOr<DeviceBuffer<float>> buf =
      DeviceBuffer<float>::Allocate((*rt)->allocator(), n);
  ASSERT_THAT(buf, IsOk());
  EXPECT_EQ(buf->device(), Device::Cuda(0));
  std::vector<float> in(n), out(n, -1.0f);
  for (int64_t i = 0; i < n; ++i) in[i] = 0.25f * static_cast<float>(i);
  Stream* sa = a->get();
  Stream* sb = b->get();
  ASSERT_THAT((*rt)->CopyFromHostOnStream(sa, buf->data(), in.data(), n * 4),
              IsOk());
  ASSERT_THAT((*ready)->Record(sa), IsOk());
  ASSERT_THAT(sb->WaitFor(ready->get()), IsOk());
  ASSERT_THAT((*rt)->CopyToHostOnStream(sb, out.data(), buf->data(), n * 4),
              IsOk());
  EXPECT_THAT(sb->Synchronize(absl::Seconds(30)), IsOk());
  EXPECT_THAT((*ready)->Synchronize(absl::Seconds(30)), IsOk());
  EXPECT_TRUE((*ready)->Query());
  EXPECT_THAT(out, ElementsAreArray(in));
}

// The runtime's page-locked host memory: host buffers (tagged with the
// host), zero-filled, that stream-ordered copies move both ways; bad
// sizes are refused.
TEST(CudaStreamTest, PinnedHostAllocator_ZeroFilledHostMemoryCopiedOnStream) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  absl::StatusOr<Runtime*> rt = GetRuntime(Device::Cuda(0));
  ASSERT_TRUE(rt.ok()) << rt.status();
  Allocator* pinned = (*rt)->pinned_host_allocator();
  EXPECT_EQ(pinned->device(), Device::Host());
  constexpr int64_t n = 1 << 18;
  absl::StatusOr<DeviceBuffer<float>> in =
      DeviceBuffer<float>::Allocate(pinned, n);
  absl::StatusOr<DeviceBuffer<float>> out =
      DeviceBuffer<float>::Allocate(pinned, n);
  absl::StatusOr<DeviceBuffer<float>> on_device =
      DeviceBuffer<float>::Allocate((*rt)->allocator(), n);
  absl::StatusOr<std::unique_ptr<Stream>> stream =
      (*rt)->CreateStream("pinned");
  ASSERT_TRUE(in.ok() && out.ok() && on_device.ok() && stream.ok());
  EXPECT_EQ(in->device(), Device::Host());
  EXPECT_THAT(std::vector<float>(in->data(), in->data() + n),
              ElementsAreArray(std::vector<float>(n, 0.0f)));
  for (int64_t i = 0; i < n; ++i) in->data()[i] = 0.5f * static_cast<float>(i);
  Stream* s = stream->get();
  ASSERT_TRUE(
      (*rt)
          ->CopyFromHostOnStream(s, on_device->data(), in->data(), n * 4)
          .ok());
  ASSERT_TRUE(
      (*rt)->CopyToHostOnStream(s, out->data(), on_device->data(), n * 4).ok());
  ASSERT_TRUE(s->Synchronize(absl::Seconds(30)).ok());
  EXPECT_THAT(std::vector<float>(out->data(), out->data() + n),
              ElementsAreArray(std::vector<float>(in->data(), in->data() + n)));
  EXPECT_EQ(pinned->AllocateRaw(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<void*> none = pinned->AllocateRaw(0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

// Runtime::Zero clears device memory on the device (the optimizer's
// momentum buffers start so); bad arguments are refused by name.
TEST(CudaStreamTest, Zero_ClearsDeviceMemory) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  absl::StatusOr<Runtime*> rt = GetRuntime(Device::Cuda(0));
  ASSERT_TRUE(rt.ok()) << rt.status();
  constexpr int64_t n = 1000;
  absl::StatusOr<DeviceBuffer<float>> buf =
      DeviceBuffer<float>::Allocate((*rt)->allocator(), n);
  ASSERT_TRUE(buf.ok()) << buf.status();
  const std::vector<float> ones(n, 1.0f);
  ASSERT_TRUE((*rt)->CopyFromHost(buf->data(), ones.data(), n * 4).ok());
  ASSERT_TRUE((*rt)->Zero(buf->data(), (n - 1) * 4).ok());
  std::vector<float> out(n, -1.0f);
  ASSERT_TRUE((*rt)->CopyToHost(out.data(), buf->data(), n * 4).ok());
  std::vector<float> want(n, 0.0f);
  want[n - 1] = 1.0f;  // past the zeroed bytes
  EXPECT_THAT(out, ElementsAreArray(want));
  EXPECT_EQ((*rt)->Zero(nullptr, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*rt)->Zero(buf->data(), -1).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaStreamTest, HostEventOnCudaStream_InvalidArgument) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  absl::StatusOr<Runtime*> rt = GetRuntime(Device::Cuda(0));
  ASSERT_THAT(rt, IsOk());
  absl::StatusOr<std::unique_ptr<Stream>> cuda = (*rt)->CreateStream("c");
  absl::StatusOr<std::unique_ptr<Event>> host =
      HostRuntime()->CreateEvent("host-event");
  ASSERT_THAT(cuda, IsOk());
  ASSERT_THAT(host, IsOk());
  EXPECT_THAT((*cuda)->WaitFor(host->get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("host-event")));
  EXPECT_THAT(
      (*host)->Record(cuda->get()),
      StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("c")));
}

// A high-priority stream has a higher priority than a normal one (a lower
// number than CreateStream's 0: the device schedules its ready work
// first), and it runs work as any stream
// (a copy in and out round-trips). Host streams have no CUDA priority.
TEST(CudaStreamTest, HighPriorityStream_PriorityAboveNormalAndRunsWork) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  absl::StatusOr<Runtime*> rt = GetRuntime(Device::Cuda(0));
  ASSERT_THAT(rt, IsOk());
  absl::StatusOr<std::unique_ptr<Stream>> normal =
      (*rt)->CreateStream("normal");
  absl::StatusOr<std::unique_ptr<Stream>> high =
      (*rt)->CreateHighPriorityStream("high");
  ASSERT_THAT(normal, IsOk());
  ASSERT_THAT(high, IsOk());
  absl::StatusOr<int> normal_priority = CudaStreamPriority(normal->get());
  absl::StatusOr<int> high_priority = CudaStreamPriority(high->get());
  ASSERT_THAT(normal_priority, IsOk());
  ASSERT_THAT(high_priority, IsOk());
  EXPECT_EQ(*normal_priority, 0);
  EXPECT_LT(*high_priority, *normal_priority);
  const std::vector<float> in = {1.0f, -2.5f, 3.25f, 0.0f};
  absl::StatusOr<DeviceBuffer<float>> buf =
      DeviceBuffer<float>::Allocate((*rt)->allocator(), in.size());
  ASSERT_THAT(buf, IsOk());
  std::vector<float> out(in.size(), 7.0f);
  const int64_t bytes = static_cast<int64_t>(in.size() * sizeof(float));
  ASSERT_THAT(
      (*rt)->CopyFromHostOnStream(high->get(), buf->data(), in.data(), bytes),
      IsOk());
  ASSERT_THAT(
      (*rt)->CopyToHostOnStream(high->get(), out.data(), buf->data(), bytes),
      IsOk());
  ASSERT_THAT((*high)->Synchronize(absl::Seconds(30)), IsOk());
  EXPECT_THAT(out, ElementsAreArray(in));
  absl::StatusOr<Runtime*> host = GetRuntime(Device::Host());
  ASSERT_THAT(host, IsOk());
  absl::StatusOr<std::unique_ptr<Stream>> host_stream =
      (*host)->CreateHighPriorityStream("host high");
  ASSERT_THAT(host_stream, IsOk());
  EXPECT_THAT(CudaStreamPriority(host_stream->get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("not a CUDA stream")));
}

// Timing events bracket device work: a 64 MiB host-to-device copy and back
// takes a measurable, positive time no longer than the host's wall clock
// around it; events without timing are refused.
TEST(CudaStreamTest, TimingEvents_SecondsSinceBracketsTheWork) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  absl::StatusOr<Runtime*> rt = GetRuntime(Device::Cuda(0));
  ASSERT_THAT(rt, IsOk());
  absl::StatusOr<std::unique_ptr<Stream>> s = (*rt)->CreateStream("timed");
  absl::StatusOr<std::unique_ptr<Event>> start =
      (*rt)->CreateTimingEvent("start");
  absl::StatusOr<std::unique_ptr<Event>> end = (*rt)->CreateTimingEvent("end");
  absl::StatusOr<std::unique_ptr<Event>> plain = (*rt)->CreateEvent("plain");
  ASSERT_THAT(s, IsOk());
  ASSERT_THAT(start, IsOk());
  ASSERT_THAT(end, IsOk());
  ASSERT_THAT(plain, IsOk());
  const int64_t n = int64_t{16} << 20;  // floats: 64 MiB
  absl::StatusOr<DeviceBuffer<float>> buf =
      DeviceBuffer<float>::Allocate((*rt)->allocator(), n);
  ASSERT_THAT(buf, IsOk());
  std::vector<float> host(n, 1.0f);
  Stream* st = s->get();
  EXPECT_THAT((*end)->SecondsSince(start->get()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr("not both recorded")));
  const absl::Time t0 = absl::Now();
  ASSERT_THAT((*start)->Record(st), IsOk());
  ASSERT_THAT((*rt)->CopyFromHostOnStream(st, buf->data(), host.data(), n * 4),
              IsOk());
  ASSERT_THAT((*rt)->CopyToHostOnStream(st, host.data(), buf->data(), n * 4),
              IsOk());
  ASSERT_THAT((*end)->Record(st), IsOk());
  ASSERT_THAT(st->Synchronize(absl::Seconds(30)), IsOk());
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  absl::StatusOr<double> took = (*end)->SecondsSince(start->get());
  ASSERT_THAT(took, IsOk());
  EXPECT_GT(*took, 0.0);
  EXPECT_LE(*took, wall);
  ASSERT_THAT((*plain)->Record(st), IsOk());
  ASSERT_THAT(st->Synchronize(absl::Seconds(30)), IsOk());
  EXPECT_THAT((*plain)->SecondsSince(start->get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("timing events")));
  absl::StatusOr<std::unique_ptr<Event>> host_event =
      HostRuntime()->CreateTimingEvent("host");
  ASSERT_THAT(host_event, IsOk());
  EXPECT_THAT((*end)->SecondsSince(host_event->get()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("not a CUDA event")));
}

}  // namespace
}  // namespace device
}  // namespace muon
