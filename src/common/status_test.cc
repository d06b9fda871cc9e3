// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "larder/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <memory>
#include <sstream>
#include <string>

#include "common/error_detail_wire.h"

namespace larder {
namespace {

TEST(StatusTest, DefaultIsOkWithEmptyMessage) {
  Status status;
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kOk);
  EXPECT_EQ(status.message(), "");
  EXPECT_EQ(status.ToString(), "OK");
  EXPECT_EQ(Status::Ok(), status);
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status status = NotFoundError("segment 'kv' is not registered");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "segment 'kv' is not registered");
  EXPECT_EQ(status.ToString(), "NotFound: segment 'kv' is not registered");
}

TEST(StatusTest, ErrorWithoutMessagePrintsOnlyTheCodeName) {
  EXPECT_EQ(InternalError("").ToString(), "Internal");
}

TEST(StatusTest, EveryFactoryProducesItsCode) {
  struct Case {
    Status status;
    StatusCode code;
    const char* name;
  };
  const Case cases[] = {
      {CancelledError("m"), StatusCode::kCancelled, "Cancelled"},
      {UnknownError("m"), StatusCode::kUnknown, "Unknown"},
      {InvalidArgumentError("m"), StatusCode::kInvalidArgument, "InvalidArgument"},
      {DeadlineExceededError("m"), StatusCode::kDeadlineExceeded, "DeadlineExceeded"},
      {NotFoundError("m"), StatusCode::kNotFound, "NotFound"},
      {AlreadyExistsError("m"), StatusCode::kAlreadyExists, "AlreadyExists"},
      {PermissionDeniedError("m"), StatusCode::kPermissionDenied, "PermissionDenied"},
      {ResourceExhaustedError("m"), StatusCode::kResourceExhausted, "ResourceExhausted"},
      {FailedPreconditionError("m"), StatusCode::kFailedPrecondition, "FailedPrecondition"},
      {AbortedError("m"), StatusCode::kAborted, "Aborted"},
      {OutOfRangeError("m"), StatusCode::kOutOfRange, "OutOfRange"},
      {UnimplementedError("m"), StatusCode::kUnimplemented, "Unimplemented"},
      {InternalError("m"), StatusCode::kInternal, "Internal"},
      {UnavailableError("m"), StatusCode::kUnavailable, "Unavailable"},
      {DataLossError("m"), StatusCode::kDataLoss, "DataLoss"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), c.code) << c.name;
    EXPECT_EQ(StatusCodeName(c.code), c.name);
    EXPECT_EQ(c.status.ToString(), std::string(c.name) + ": m");
  }
  EXPECT_EQ(StatusCodeName(StatusCode::kOk), "OK");
  // A value outside the enum (e.g. decoded from a corrupt frame) must still have a name.
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(200)), "Unknown");
}

TEST(StatusTest, ConstructingWithOkCodeIsOk) {
  Status status(StatusCode::kOk, "");
  EXPECT_TRUE(status.ok());
}

TEST(StatusTest, EqualityComparesCodeAndMessage) {
  EXPECT_EQ(UnavailableError("a"), UnavailableError("a"));
  EXPECT_FALSE(UnavailableError("a") == UnavailableError("b"));
  EXPECT_FALSE(UnavailableError("a") == AbortedError("a"));
  EXPECT_FALSE(Status() == UnavailableError(""));
}

TEST(StatusTest, CopiesShareNothingObservable) {
  Status original = AbortedError("lease changed");
  Status copy = original;
  original = Status();
  EXPECT_TRUE(original.ok());
  EXPECT_EQ(copy.code(), StatusCode::kAborted);
  EXPECT_EQ(copy.message(), "lease changed");
}

TEST(StatusTest, WithContextPrefixesTheMessageAndKeepsTheCode) {
  Status status = UnavailableError("connection refused").WithContext("peer 10.0.0.7:17001");
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(status.message(), "peer 10.0.0.7:17001: connection refused");
  Status twice = status.WithContext("request 3");
  EXPECT_EQ(twice.message(), "request 3: peer 10.0.0.7:17001: connection refused");
}

TEST(StatusTest, WithContextOnOkStaysOk) {
  Status status = Status().WithContext("anything");
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.message(), "");
}

TEST(StatusTest, StreamsAsToString) {
  std::ostringstream out;
  out << OutOfRangeError("offset 9 beyond 8");
  EXPECT_EQ(out.str(), "OutOfRange: offset 9 beyond 8");
}

TEST(ResultTest, HoldsAValue) {
  Result<int> result = 42;
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(result.status().ok());
  EXPECT_EQ(result.value(), 42);
  EXPECT_EQ(*result, 42);
  EXPECT_EQ(result.value_or(7), 42);
}

TEST(ResultTest, HoldsAnError) {
  Result<int> result = NotFoundError("no key");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(result.status().message(), "no key");
  EXPECT_EQ(result.value_or(7), 7);
}

TEST(ResultTest, ArrowReachesMembersAndValueCanBeMovedOut) {
  Result<std::string> result = std::string("segment");
  EXPECT_EQ(result->size(), 7u);
  std::string moved = std::move(result).value();
  EXPECT_EQ(moved, "segment");
}

TEST(ResultTest, MoveOnlyValues) {
  Result<std::unique_ptr<int>> result = std::make_unique<int>(5);
  ASSERT_TRUE(result.ok());
  std::unique_ptr<int> owned = std::move(result).value();
  EXPECT_EQ(*owned, 5);
}

TEST(ResultTest, ConvertsFromDerivedPointer) {
  struct Base {
    virtual ~Base() = default;
    virtual int Id() const { return 1; }
  };
  struct Derived : Base {
    int Id() const override { return 2; }
  };
  Result<std::shared_ptr<Base>> result = std::make_shared<Derived>();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ((*result)->Id(), 2);
}

// A Result built from an OK status would hold neither a value nor an error: every build aborts.
TEST(ResultDeathTest, ConstructingFromAnOkStatusAborts) {
  EXPECT_DEATH({ Result<int> bad(Status::Ok()); }, "constructed from an OK Status");
}

// value() of an error says which error, instead of throwing std::bad_variant_access.
TEST(ResultDeathTest, ValueOfAnErrorAbortsNamingTheError) {
  Result<std::string> missing = NotFoundError("key 'k' not found");
  EXPECT_DEATH({ (void)missing.value(); }, "value\\(\\) on an error: NotFound: key 'k' not found");
  EXPECT_DEATH({ (void)*missing; }, "NotFound");
  EXPECT_DEATH({ (void)std::move(missing).value(); }, "NotFound");
}

TEST(StatusTest, DetailIsCarriedThroughContextAndCompared) {
  Status plain = FailedPreconditionError("not registered");
  EXPECT_EQ(plain.detail(), ErrorDetail::kNone);
  Status remount = plain.WithDetail(ErrorDetail::kRemountRequired);
  EXPECT_EQ(remount.detail(), ErrorDetail::kRemountRequired);
  EXPECT_EQ(remount.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(remount.message(), "not registered");
  EXPECT_EQ(plain.detail(), ErrorDetail::kNone);  // the original is unchanged
  EXPECT_NE(remount, plain);
  EXPECT_EQ(remount.WithContext("Put").detail(), ErrorDetail::kRemountRequired);
  EXPECT_TRUE(Status::Ok().WithDetail(ErrorDetail::kLeased).ok());
  EXPECT_EQ(ErrorDetailName(ErrorDetail::kLeaseExpired), "LeaseExpired");
}

// A detail travels in a gRPC status's details as "larder:detail:N"; anything else reads as none.
TEST(ErrorDetailWireTest, RoundTripsAndRefusesWhatItDoesNotKnow) {
  for (ErrorDetail detail :
       {ErrorDetail::kRemountRequired, ErrorDetail::kLeaseExpired, ErrorDetail::kBeingWritten,
        ErrorDetail::kLeased, ErrorDetail::kRebuilding, ErrorDetail::kUnknownSession}) {
    EXPECT_EQ(ErrorDetailFromWire(ErrorDetailToWire(detail)), detail) << ErrorDetailName(detail);
  }
  EXPECT_EQ(ErrorDetailToWire(ErrorDetail::kNone), "");
  for (std::string_view other : {"", "larder:detail:", "larder:detail:9", "larder:detail:12",
                                 "larder:detail:x", "larder:unknown-session", "1"}) {
    EXPECT_EQ(ErrorDetailFromWire(other), ErrorDetail::kNone) << other;
  }
  EXPECT_EQ(ErrorDetailFromNumber(4), ErrorDetail::kLeased);
  EXPECT_EQ(ErrorDetailFromNumber(0), ErrorDetail::kNone);
  EXPECT_EQ(ErrorDetailFromNumber(1u << 20), ErrorDetail::kNone);
}

// Helpers that exercise the macros the way library code uses them.
Status FailIf(bool fail) {
  if (fail) return PermissionDeniedError("refused");
  return Status();
}

Status CallTwice(bool fail_first, bool fail_second, int* calls) {
  ++*calls;
  LARDER_RETURN_IF_ERROR(FailIf(fail_first));
  ++*calls;
  LARDER_RETURN_IF_ERROR(FailIf(fail_second));
  return Status();
}

TEST(StatusMacrosTest, ReturnIfErrorStopsAtTheFirstError) {
  int calls = 0;
  EXPECT_TRUE(CallTwice(false, false, &calls).ok());
  EXPECT_EQ(calls, 2);

  calls = 0;
  Status status = CallTwice(true, false, &calls);
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(status.message(), "refused");
  EXPECT_EQ(calls, 1);

  calls = 0;
  EXPECT_EQ(CallTwice(false, true, &calls).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(calls, 2);
}

Result<int> Half(int value) {
  if (value % 2 != 0) return InvalidArgumentError(std::to_string(value) + " is odd");
  return value / 2;
}

// Two assignments in one function check that the macro's temporaries do not collide.
Result<int> Quarter(int value) {
  LARDER_ASSIGN_OR_RETURN(int half, Half(value));
  LARDER_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

Status AssignIntoExisting(int value, int* out) {
  int result = -1;
  LARDER_ASSIGN_OR_RETURN(result, Half(value));
  *out = result;
  return Status();
}

TEST(StatusMacrosTest, AssignOrReturnAssignsOrPropagates) {
  Result<int> quarter = Quarter(12);
  ASSERT_TRUE(quarter.ok());
  EXPECT_EQ(*quarter, 3);

  Result<int> odd = Quarter(6);  // 6 / 2 = 3 is odd
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(odd.status().message(), "3 is odd");

  int out = 0;
  EXPECT_TRUE(AssignIntoExisting(8, &out).ok());
  EXPECT_EQ(out, 4);
  out = 0;
  EXPECT_EQ(AssignIntoExisting(7, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, 0);
}

Result<std::unique_ptr<int>> MakeBox(bool fail) {
  if (fail) return ResourceExhaustedError("no memory");
  return std::make_unique<int>(9);
}

Result<int> Unbox(bool fail) {
  LARDER_ASSIGN_OR_RETURN(std::unique_ptr<int> box, MakeBox(fail));
  return *box;
}

TEST(StatusMacrosTest, AssignOrReturnMovesMoveOnlyValues) {
  ASSERT_TRUE(Unbox(false).ok());
  EXPECT_EQ(*Unbox(false), 9);
  EXPECT_EQ(Unbox(true).status().code(), StatusCode::kResourceExhausted);
}

TEST(ErrnoToStatusTest, MapsNetworkErrorsToUnavailable) {
  for (int err : {ECONNREFUSED, ECONNRESET, ECONNABORTED, EPIPE, EHOSTUNREACH, ENETUNREACH}) {
    EXPECT_EQ(ErrnoToStatus(err, "connect").code(), StatusCode::kUnavailable) << err;
  }
}

TEST(ErrnoToStatusTest, MapsTheCommonErrnos) {
  EXPECT_EQ(ErrnoToStatus(ETIMEDOUT, "x").code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ErrnoToStatus(EACCES, "x").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(EPERM, "x").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(ENOENT, "x").code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(ENOMEM, "x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EMFILE, "x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EINVAL, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoToStatus(EADDRINUSE, "x").code(), StatusCode::kAlreadyExists);
  // Anything unrecognised is an internal error, never OK.
  EXPECT_EQ(ErrnoToStatus(EXDEV, "x").code(), StatusCode::kInternal);
}

TEST(ErrnoToStatusTest, MessageNamesTheOperationAndTheError) {
  Status status = ErrnoToStatus(ECONNREFUSED, "connect to 10.0.0.7:17001");
  EXPECT_EQ(status.message().rfind("connect to 10.0.0.7:17001: ", 0), 0u) << status.message();
  EXPECT_NE(status.message().find("refused"), std::string::npos) << status.message();
}

}  // namespace
}  // namespace larder
