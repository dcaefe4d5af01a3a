// For death tests that expect a ThreadSanitizer report: in the
// --config=tsan build, TSan stops the process at its first report (exit
// 66), so the child's exit shows it. Include from exactly one source file
// of a test binary (it defines TSan's options hook).
#ifndef MUON_TESTS_TSAN_DEATH_TEST_H_
#define MUON_TESTS_TSAN_DEATH_TEST_H_

#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_options() { return "halt_on_error=1"; }
namespace muon {
namespace testing {
constexpr bool kThreadSanitizer = true;
}  // namespace testing
}  // namespace muon
#else
namespace muon {
namespace testing {
constexpr bool kThreadSanitizer = false;
}  // namespace testing
}  // namespace muon
#endif

#endif  // MUON_TESTS_TSAN_DEATH_TEST_H_
