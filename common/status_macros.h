// Status propagation macros (Abseil 20220623 ships none).
#ifndef MUON_COMMON_STATUS_MACROS_H_
#define MUON_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MUON_STATUS_CONCAT_INNER_(a, b) a##b
#define MUON_STATUS_CONCAT_(a, b) MUON_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define MUON_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status muon_status_ = (expr);        \
    if (!muon_status_.ok()) return muon_status_; \
  } while (0)

// `lhs = value of expr` (an absl::StatusOr<T>), or returns its error.
#define MUON_ASSIGN_OR_RETURN(lhs, expr)                                     \
  MUON_ASSIGN_OR_RETURN_IMPL_(MUON_STATUS_CONCAT_(muon_statusor_, __LINE__), \
                              lhs, expr)
#define MUON_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)   \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // MUON_COMMON_STATUS_MACROS_H_
