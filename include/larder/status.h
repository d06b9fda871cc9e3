// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder::Status and larder::Result<T>: the one error vocabulary of Larder.
//
// A Status is either OK or carries a code (abseil's canonical set) and a message that names the
// key, segment, peer or fd involved. Result<T> holds either a value or a non-OK Status. Both are
// [[nodiscard]]: a dropped error is a compile-time warning (and an error with -Werror).
//
// How to react to a code:
//   Unavailable        retry the call (peer down, connection lost, backing off).
//   Aborted            retry the whole operation (a concurrent change invalidated it).
//   DeadlineExceeded   the deadline passed; the work may or may not have happened.
//   FailedPrecondition do not retry until the system state changes.
//   InvalidArgument / OutOfRange / NotFound / PermissionDenied: fix the request.
// A few errors say more in their detail() (ErrorDetail): branch on that, never on message text.
//
// Thread safety: Status and Result are values; distinct objects may be used from distinct threads.
#pragma once

#include <cassert>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "larder/export.h"

namespace larder {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,  // no valid proof of the cluster token
};

// Returns the canonical name of `code`, e.g. "Unavailable".
LARDER_EXPORT std::string_view StatusCodeName(StatusCode code);

// What an error tells a caller that acts on it, beside its code: structure to branch on, never
// text to match. Most errors carry kNone.
enum class ErrorDetail : uint8_t {
  kNone = 0,
  // FailedPrecondition from the master for a whole call: it does not know the calling client
  // (expired, or a new master incarnation). Mount again, then repeat the call. (Any other
  // FailedPrecondition means what it says: do not retry until something changes.)
  kRemountRequired = 1,
  // Unavailable: a get's read lease ran out before its copy finished. Repeat the get.
  kLeaseExpired = 2,
  // Unavailable for one key: another put of it is in progress. Repeat later.
  kBeingWritten = 3,
  // Unavailable for one key: readers hold leases on it, so a removal without force waits.
  // Repeat later, or force.
  kLeased = 4,
  // Unavailable for one key: a new master is still rebuilding its objects from the clients'
  // catalogs, and this key may yet come. Repeat shortly (the message says until when).
  kRebuilding = 5,
  // Unauthenticated for a whole call: the master does not know the caller's session (it
  // restarted, or the session expired). Open a new session, then repeat the call.
  kUnknownSession = 6,
  // Unavailable for one key: its only copy is on a disk holder, which is putting it back into
  // memory for this reader. Repeat shortly.
  kOnDisk = 7,
};

// "None", "RemountRequired", "LeaseExpired", "BeingWritten", "Leased", "Rebuilding",
// "UnknownSession", "OnDisk".
LARDER_EXPORT std::string_view ErrorDetailName(ErrorDetail detail);

class [[nodiscard]] LARDER_EXPORT Status {
 public:
  // An OK status. Cheap: no allocation.
  Status() = default;
  // REQUIRES: code != kOk, or message is empty.
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  // Empty for OK.
  const std::string& message() const;
  // kNone for OK and for most errors.
  ErrorDetail detail() const { return state_ ? state_->detail : ErrorDetail::kNone; }

  // Returns a copy that carries `detail`. OK stays OK.
  Status WithDetail(ErrorDetail detail) const;

  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>" (its detail kept). OK stays OK.
  Status WithContext(std::string_view context) const;

  bool operator==(const Status& other) const {
    return code() == other.code() && detail() == other.detail() && message() == other.message();
  }

  // Explicitly ignore a status (documents that dropping it is intended).
  void IgnoreError() const {}

 private:
  struct State {
    StatusCode code;
    ErrorDetail detail = ErrorDetail::kNone;
    std::string message;
  };
  // Shared so that copying a Status is cheap; states are immutable once built.
  std::shared_ptr<const State> state_;
};

LARDER_EXPORT std::ostream& operator<<(std::ostream& os, const Status& status);

LARDER_EXPORT Status CancelledError(std::string message);
LARDER_EXPORT Status UnknownError(std::string message);
LARDER_EXPORT Status InvalidArgumentError(std::string message);
LARDER_EXPORT Status DeadlineExceededError(std::string message);
LARDER_EXPORT Status NotFoundError(std::string message);
LARDER_EXPORT Status AlreadyExistsError(std::string message);
LARDER_EXPORT Status PermissionDeniedError(std::string message);
LARDER_EXPORT Status ResourceExhaustedError(std::string message);
LARDER_EXPORT Status FailedPreconditionError(std::string message);
LARDER_EXPORT Status AbortedError(std::string message);
LARDER_EXPORT Status OutOfRangeError(std::string message);
LARDER_EXPORT Status UnimplementedError(std::string message);
LARDER_EXPORT Status InternalError(std::string message);
LARDER_EXPORT Status UnavailableError(std::string message);
LARDER_EXPORT Status DataLossError(std::string message);
LARDER_EXPORT Status UnauthenticatedError(std::string message);

// Maps an errno value to the closest code, with "<what>: <strerror>" as message.
LARDER_EXPORT Status ErrnoToStatus(int err, std::string_view what);

namespace internal {
// Result<T> misused: print what happened and abort, in every build.
[[noreturn]] LARDER_EXPORT void ResultFromOkStatus();
[[noreturn]] LARDER_EXPORT void ResultValueOfError(const Status& status);
}  // namespace internal

// Either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  // REQUIRES: !status.ok() (an OK status holds no value: the process aborts, saying so).
  Result(Status status) : value_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(value_).ok()) internal::ResultFromOkStatus();
  }
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  // Converts from anything convertible to T (e.g. shared_ptr<Derived> to shared_ptr<Base>).
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U&&, T> &&
                                                    !std::is_same_v<std::decay_t<U>, T> &&
                                                    !std::is_convertible_v<U&&, Status>>>
  Result(U&& value) : value_(T(std::forward<U>(value))) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(value_); }
  // OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(value_); }

  // REQUIRES: ok(). On an error the process aborts, printing the error.
  T& value() & {
    CheckHasValue();
    return *std::get_if<T>(&value_);
  }
  const T& value() const& {
    CheckHasValue();
    return *std::get_if<T>(&value_);
  }
  T&& value() && {
    CheckHasValue();
    return std::move(*std::get_if<T>(&value_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // Returns the value, or `fallback` when this holds an error.
  T value_or(T fallback) const { return ok() ? *std::get_if<T>(&value_) : std::move(fallback); }

 private:
  void CheckHasValue() const {
    if (!ok()) internal::ResultValueOfError(*std::get_if<Status>(&value_));
  }

  std::variant<Status, T> value_;
};

}  // namespace larder

#define LARDER_CONCAT_INNER_(a, b) a##b
#define LARDER_CONCAT_(a, b) LARDER_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define LARDER_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::larder::Status larder_status_ = (expr);        \
    if (!larder_status_.ok()) return larder_status_; \
  } while (0)

// `lhs = value of expr` when `expr` (a Result<T>) is OK; returns its Status otherwise.
#define LARDER_ASSIGN_OR_RETURN(lhs, expr) \
  LARDER_ASSIGN_OR_RETURN_IMPL_(LARDER_CONCAT_(larder_result_, __LINE__), lhs, expr)
#define LARDER_ASSIGN_OR_RETURN_IMPL_(result, lhs, expr) \
  auto result = (expr);                                  \
  if (!result.ok()) return result.status();              \
  lhs = std::move(result).value()
