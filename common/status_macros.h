// status_macros.h: RETURN_IF_ERROR and ASSIGN_OR_RETURN for absl::Status / absl::StatusOr
// (abseil 20220623 ships neither).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CONVEYOR_CONCAT_INNER_(a, b) a##b
#define CONVEYOR_CONCAT_(a, b) CONVEYOR_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not ok.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    const ::absl::Status conveyor_status_ = (expr);    \
    if (!conveyor_status_.ok()) return conveyor_status_; \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on error returns its
// status, otherwise moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(CONVEYOR_CONCAT_(conveyor_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(*tmp)
