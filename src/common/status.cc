// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "larder/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace larder {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kCancelled:
      return "Cancelled";
    case StatusCode::kUnknown:
      return "Unknown";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kDeadlineExceeded:
      return "DeadlineExceeded";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kAborted:
      return "Aborted";
    case StatusCode::kOutOfRange:
      return "OutOfRange";
    case StatusCode::kUnimplemented:
      return "Unimplemented";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kDataLoss:
      return "DataLoss";
    case StatusCode::kUnauthenticated:
      return "Unauthenticated";
  }
  return "Unknown";
}

std::string_view ErrorDetailName(ErrorDetail detail) {
  switch (detail) {
    case ErrorDetail::kNone:
      return "None";
    case ErrorDetail::kRemountRequired:
      return "RemountRequired";
    case ErrorDetail::kLeaseExpired:
      return "LeaseExpired";
    case ErrorDetail::kBeingWritten:
      return "BeingWritten";
    case ErrorDetail::kLeased:
      return "Leased";
    case ErrorDetail::kRebuilding:
      return "Rebuilding";
    case ErrorDetail::kUnknownSession:
      return "UnknownSession";
    case ErrorDetail::kOnDisk:
      return "OnDisk";
  }
  return "None";
}

namespace internal {

void ResultFromOkStatus() {
  std::fputs("larder::Result constructed from an OK Status: an OK status holds no value\n", stderr);
  std::abort();
}

void ResultValueOfError(const Status& status) {
  std::fprintf(stderr, "larder::Result::value() on an error: %s\n", status.ToString().c_str());
  std::abort();
}

}  // namespace internal

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, ErrorDetail::kNone, std::move(message)});
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code()));
  if (!message().empty()) {
    out += ": ";
    out += message();
  }
  return out;
}

Status Status::WithDetail(ErrorDetail detail) const {
  if (ok()) return *this;
  Status out;
  out.state_ = std::make_shared<const State>(State{code(), detail, message()});
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string message(context);
  message += ": ";
  message += this->message();
  return Status(code(), std::move(message)).WithDetail(detail());
}

std::ostream& operator<<(std::ostream& os, const Status& status) { return os << status.ToString(); }

#define LARDER_DEFINE_ERROR_(Name)                          \
  Status Name##Error(std::string message) {                 \
    return Status(StatusCode::k##Name, std::move(message)); \
  }
LARDER_DEFINE_ERROR_(Cancelled)
LARDER_DEFINE_ERROR_(Unknown)
LARDER_DEFINE_ERROR_(InvalidArgument)
LARDER_DEFINE_ERROR_(DeadlineExceeded)
LARDER_DEFINE_ERROR_(NotFound)
LARDER_DEFINE_ERROR_(AlreadyExists)
LARDER_DEFINE_ERROR_(PermissionDenied)
LARDER_DEFINE_ERROR_(ResourceExhausted)
LARDER_DEFINE_ERROR_(FailedPrecondition)
LARDER_DEFINE_ERROR_(Aborted)
LARDER_DEFINE_ERROR_(OutOfRange)
LARDER_DEFINE_ERROR_(Unimplemented)
LARDER_DEFINE_ERROR_(Internal)
LARDER_DEFINE_ERROR_(Unavailable)
LARDER_DEFINE_ERROR_(DataLoss)
LARDER_DEFINE_ERROR_(Unauthenticated)
#undef LARDER_DEFINE_ERROR_

Status ErrnoToStatus(int err, std::string_view what) {
  std::string message(what);
  message += ": ";
  message += std::strerror(err);
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENOTCONN:
    case EAGAIN:
    case EINTR:
      code = StatusCode::kUnavailable;
      break;
    case ETIMEDOUT:
      code = StatusCode::kDeadlineExceeded;
      break;
    case ENOENT:
      code = StatusCode::kNotFound;
      break;
    case EACCES:
    case EPERM:
      code = StatusCode::kPermissionDenied;
      break;
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
      code = StatusCode::kResourceExhausted;
      break;
    case EINVAL:
    case EBADF:
      code = StatusCode::kInvalidArgument;
      break;
    case EEXIST:
    case EADDRINUSE:
      code = StatusCode::kAlreadyExists;
      break;
    default:
      break;
  }
  return Status(code, std::move(message));
}

}  // namespace larder
