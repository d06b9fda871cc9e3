// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/grpc_process.h"
#include "common/mutex.h"
#include "etcd_rpc.grpc.pb.h"

namespace larder::etcd {

namespace {

namespace pb = ::etcdserverpb;
// gRPC's deadlines are on the system clock.
using Clock = std::chrono::system_clock;

// Concatenates string pieces (GCC 12 at -O3 warns falsely about `"x" + std::string`).
template <typename... Parts>
std::string Cat(const Parts&... parts) {
  std::string out;
  (out.append(std::string_view(parts)), ...);
  return out;
}

std::string JoinEndpoints(const std::vector<std::string>& endpoints) {
  std::string out;
  for (const std::string& endpoint : endpoints) {
    if (!out.empty()) out += ',';
    out += endpoint;
  }
  return out;
}

// gRPC's codes are abseil's canonical codes, which StatusCode mirrors.
StatusCode FromGrpc(grpc::StatusCode code) {
  int value = static_cast<int>(code);
  if (value < 0 || value > static_cast<int>(StatusCode::kUnauthenticated)) {
    return StatusCode::kUnknown;
  }
  return static_cast<StatusCode>(value);
}

// The member did not answer (down, unreachable, partitioned, without a raft leader, or too slow):
// the call may go to the next member.
bool MemberUnreachable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         status.error_code() == grpc::StatusCode::CANCELLED;
}

std::string Describe(const grpc::Status& status) {
  std::string message = status.error_message();
  if (message.empty()) message = std::string(StatusCodeName(FromGrpc(status.error_code())));
  // Connection errors from gRPC can be long; one line per member is enough.
  if (message.size() > 300) message.resize(300);
  return message;
}

Status CheckKey(std::string_view key) {
  if (key.empty()) return InvalidArgumentError("etcd keys cannot be empty");
  if (key.size() > kMaxEtcdKeyBytes) {
    return InvalidArgumentError(Cat("etcd key of ", std::to_string(key.size()),
                                    " bytes exceeds the limit of ",
                                    std::to_string(kMaxEtcdKeyBytes)));
  }
  return Status();
}

Status CheckValue(std::string_view key, std::string_view value) {
  if (value.size() > kMaxEtcdValueBytes) {
    return InvalidArgumentError(Cat("etcd value of ", std::to_string(value.size()),
                                    " bytes for key ", key, " exceeds the limit of ",
                                    std::to_string(kMaxEtcdValueBytes)));
  }
  return Status();
}

Status CheckLease(int64_t lease, const char* call) {
  if (lease == 0) return InvalidArgumentError(Cat("etcd ", call, " needs a lease (got 0)"));
  return Status();
}

// A key-value pair as etcd returned it, held to our bounds before we copy it.
Result<KeyValue> FromProto(const pb::KeyValue& kv, std::string_view asked) {
  if (kv.key().size() > kMaxEtcdKeyBytes || kv.key() != asked) {
    return InternalError(Cat("etcd returned key of ", std::to_string(kv.key().size()),
                             " bytes for a read of ", asked));
  }
  if (kv.value().size() > kMaxEtcdValueBytes) {
    return InternalError(Cat("etcd returned a value of ", std::to_string(kv.value().size()),
                             " bytes at ", asked, ", more than the limit of ",
                             std::to_string(kMaxEtcdValueBytes)));
  }
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.lease = kv.lease();
  return out;
}

// One member: its channel and stubs.
struct Member {
  std::string endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
};

// A LeaseKeepAlive stream to one member, driven through the async API so that each round trip
// has a deadline of its own (a synchronous stream's Read cannot time out).
class KeepAliveStream {
 public:
  explicit KeepAliveStream(Member* member) : member_(member) {
    context_.set_wait_for_ready(true);  // as for unary calls (see Invoke)
    stream_ = member->lease->PrepareAsyncLeaseKeepAlive(&context_, &queue_);
    stream_->StartCall(kStart);
    pending_ = 1;
  }

  ~KeepAliveStream() {
    Close();
    queue_.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (queue_.Next(&tag, &ok)) {
    }
  }

  KeepAliveStream(const KeepAliveStream&) = delete;
  KeepAliveStream& operator=(const KeepAliveStream&) = delete;

  const Member& member() const { return *member_; }
  bool broken() const { return broken_; }

  // Sends one keep-alive of `lease` and reads its reply, before `deadline`. A failed round trip
  // leaves the stream broken (to be discarded) and returns the call's status.
  grpc::Status RoundTrip(int64_t lease, Clock::time_point deadline,
                         pb::LeaseKeepAliveResponse* reply) {
    if (broken_) return final_status_;
    // The call must have started before its first message goes out.
    if (grpc::Status started = WaitAll(deadline); !started.ok()) return started;
    pb::LeaseKeepAliveRequest request;
    request.set_id(lease);
    stream_->Write(request, kWrite);
    stream_->Read(reply, kRead);
    pending_ += 2;
    return WaitAll(deadline);
  }

 private:
  // Waits for every pending operation; a failed or late one breaks the stream.
  grpc::Status WaitAll(Clock::time_point deadline) {
    while (pending_ > 0) {
      void* tag = nullptr;
      bool ok = false;
      auto next = queue_.AsyncNext(&tag, &ok, deadline);
      if (next == grpc::CompletionQueue::TIMEOUT) {
        Close();
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no keep-alive reply in time");
      }
      if (next != grpc::CompletionQueue::GOT_EVENT) {
        Close();
        return grpc::Status(grpc::StatusCode::CANCELLED, "keep-alive stream shut down");
      }
      --pending_;
      if (!ok) return Close();
    }
    return grpc::Status::OK;
  }

  static inline void* const kStart = reinterpret_cast<void*>(1);
  static inline void* const kWrite = reinterpret_cast<void*>(2);
  static inline void* const kRead = reinterpret_cast<void*>(3);
  static inline void* const kFinish = reinterpret_cast<void*>(4);

  // Ends the call (idempotent) and returns how it ended.
  grpc::Status Close() {
    if (broken_) return final_status_;
    broken_ = true;
    context_.TryCancel();
    void* tag = nullptr;
    bool ok = false;
    // Cancelled operations complete promptly; every tag must come back before Finish.
    while (pending_ > 0 && queue_.Next(&tag, &ok)) --pending_;
    stream_->Finish(&final_status_, kFinish);
    while (queue_.Next(&tag, &ok)) {
      if (tag == kFinish) break;
    }
    if (final_status_.ok()) {
      final_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream closed");
    }
    return final_status_;
  }

  Member* member_;
  grpc::ClientContext context_;
  grpc::CompletionQueue queue_;
  std::unique_ptr<
      grpc::ClientAsyncReaderWriter<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>>
      stream_;
  int pending_ = 0;
  bool broken_ = false;
  grpc::Status final_status_;
};

class GrpcEtcdClient final : public EtcdClient {
 public:
  explicit GrpcEtcdClient(EtcdOptions options) : options_(std::move(options)) {
    grpc::ChannelArguments args;
    // Answers are small; refuse anything near etcd's own request limit rather than buffer it.
    args.SetMaxReceiveMessageSize(static_cast<int>(2 * kMaxEtcdValueBytes));
    // A restarted member must be reachable again within a fraction of a lease TTL, not after
    // gRPC's default backoff (up to two minutes). The connect timeout stays gRPC's default
    // (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS also bounds each connection attempt).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    PrepareGrpcRuntime();
    for (const std::string& endpoint : options_.endpoints) {
      auto member = std::make_unique<Member>();
      member->endpoint = endpoint;
      member->channel =
          grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
      member->kv = pb::KV::NewStub(member->channel);
      member->lease = pb::Lease::NewStub(member->channel);
      members_.push_back(std::move(member));
    }
  }

  ~GrpcEtcdClient() override {
    MutexLock lock(keepalive_mu_);
    keepalive_.reset();
  }

  Result<std::optional<KeyValue>> Get(std::string_view key) override {
    LARDER_RETURN_IF_ERROR(CheckKey(key));
    pb::RangeRequest request;
    request.set_key(std::string(key));
    pb::RangeResponse reply;
    LARDER_RETURN_IF_ERROR(Invoke(Cat("Range ", key), [&](Member& m, grpc::ClientContext* c) {
      return m.kv->Range(c, request, &reply);
    }));
    if (reply.kvs_size() == 0) return std::optional<KeyValue>();
    if (reply.kvs_size() > 1) {
      return InternalError(Cat("etcd returned ", std::to_string(reply.kvs_size()),
                               " keys for a read of the single key ", key));
    }
    LARDER_ASSIGN_OR_RETURN(KeyValue kv, FromProto(reply.kvs(0), key));
    return std::optional<KeyValue>(std::move(kv));
  }

  Status Put(std::string_view key, std::string_view value, int64_t lease) override {
    LARDER_RETURN_IF_ERROR(CheckKey(key));
    LARDER_RETURN_IF_ERROR(CheckValue(key, value));
    pb::PutRequest request;
    request.set_key(std::string(key));
    request.set_value(std::string(value));
    request.set_lease(lease);
    pb::PutResponse reply;
    return Invoke(Cat("Put ", key),
                  [&](Member& m, grpc::ClientContext* c) { return m.kv->Put(c, request, &reply); });
  }

  Result<bool> PutIfAbsent(std::string_view key, std::string_view value, int64_t lease) override {
    LARDER_RETURN_IF_ERROR(CheckKey(key));
    LARDER_RETURN_IF_ERROR(CheckValue(key, value));
    LARDER_RETURN_IF_ERROR(CheckLease(lease, "PutIfAbsent"));
    pb::TxnRequest request;
    pb::Compare* absent = request.add_compare();
    absent->set_key(std::string(key));
    absent->set_target(pb::Compare::CREATE);
    absent->set_result(pb::Compare::EQUAL);
    absent->set_create_revision(0);
    pb::PutRequest* put = request.add_success()->mutable_request_put();
    put->set_key(std::string(key));
    put->set_value(std::string(value));
    put->set_lease(lease);
    // When the key exists, read it back: it may be ours from an attempt whose reply was lost.
    request.add_failure()->mutable_request_range()->set_key(std::string(key));
    pb::TxnResponse reply;
    LARDER_RETURN_IF_ERROR(
        Invoke(Cat("Txn put-if-absent ", key),
               [&](Member& m, grpc::ClientContext* c) { return m.kv->Txn(c, request, &reply); }));
    if (reply.succeeded()) return true;
    if (reply.responses_size() != 1 || !reply.responses(0).has_response_range()) {
      return InternalError(Cat("etcd answered a put-if-absent of ", key, " without its read"));
    }
    const pb::RangeResponse& existing = reply.responses(0).response_range();
    if (existing.kvs_size() != 1) return false;  // deleted in between: absent now, not ours
    LARDER_ASSIGN_OR_RETURN(KeyValue kv, FromProto(existing.kvs(0), key));
    return kv.lease == lease && kv.value == value;
  }

  Result<bool> DeleteIfLease(std::string_view key, int64_t lease) override {
    LARDER_RETURN_IF_ERROR(CheckKey(key));
    LARDER_RETURN_IF_ERROR(CheckLease(lease, "DeleteIfLease"));
    pb::TxnRequest request;
    pb::Compare* held = request.add_compare();
    held->set_key(std::string(key));
    held->set_target(pb::Compare::LEASE);
    held->set_result(pb::Compare::EQUAL);
    held->set_lease(lease);
    request.add_success()->mutable_request_delete_range()->set_key(std::string(key));
    pb::TxnResponse reply;
    LARDER_RETURN_IF_ERROR(
        Invoke(Cat("Txn delete-if-lease ", key),
               [&](Member& m, grpc::ClientContext* c) { return m.kv->Txn(c, request, &reply); }));
    return reply.succeeded();
  }

  Result<Lease> GrantLease(std::chrono::milliseconds ttl) override {
    if (ttl.count() <= 0) {
      return InvalidArgumentError(
          Cat("etcd lease TTL must be positive (got ", std::to_string(ttl.count()), " ms)"));
    }
    // etcd counts TTLs in whole seconds; round up so that a lease never lasts less than asked.
    const int64_t seconds = (ttl.count() + 999) / 1000;
    pb::LeaseGrantRequest request;
    request.set_ttl(seconds);
    pb::LeaseGrantResponse reply;
    LARDER_RETURN_IF_ERROR(Invoke("LeaseGrant", [&](Member& m, grpc::ClientContext* c) {
      return m.lease->LeaseGrant(c, request, &reply);
    }));
    if (!reply.error().empty()) {
      return UnavailableError(Cat("etcd LeaseGrant failed: ", reply.error()));
    }
    if (reply.id() == 0 || reply.ttl() <= 0) {
      return InternalError(Cat("etcd LeaseGrant returned lease ", LeaseIdText(reply.id()),
                               " with TTL ", std::to_string(reply.ttl()), " s"));
    }
    return Lease{reply.id(), std::chrono::seconds(reply.ttl())};
  }

  Result<std::chrono::milliseconds> KeepAlive(int64_t lease) override {
    LARDER_RETURN_IF_ERROR(CheckLease(lease, "KeepAlive"));
    MutexLock lock(keepalive_mu_);
    std::string failures;
    const size_t count = members_.size();
    const size_t first = preferred_.load(std::memory_order_relaxed);
    for (size_t i = 0; i < count; ++i) {
      Member& member = *members_[(first + i) % count];
      if (keepalive_ != nullptr && (keepalive_->broken() || &keepalive_->member() != &member)) {
        keepalive_.reset();
      }
      if (keepalive_ == nullptr) keepalive_ = std::make_unique<KeepAliveStream>(&member);
      pb::LeaseKeepAliveResponse reply;
      grpc::Status status = keepalive_->RoundTrip(lease, Clock::now() + options_.timeout, &reply);
      if (status.ok()) {
        preferred_.store((first + i) % count, std::memory_order_relaxed);
        if (reply.ttl() <= 0) {
          return NotFoundError(Cat("etcd lease ", LeaseIdText(lease), " expired or was revoked"));
        }
        if (reply.id() != lease) {
          return InternalError(Cat("etcd answered a keep-alive of lease ", LeaseIdText(lease),
                                   " for lease ", LeaseIdText(reply.id())));
        }
        return std::chrono::milliseconds(std::chrono::seconds(reply.ttl()));
      }
      keepalive_.reset();
      if (!MemberUnreachable(status)) return MemberError("LeaseKeepAlive", member, status);
      AddFailure(&failures, member, status);
    }
    return Unreachable("LeaseKeepAlive", failures);
  }

  Status RevokeLease(int64_t lease) override {
    LARDER_RETURN_IF_ERROR(CheckLease(lease, "RevokeLease"));
    pb::LeaseRevokeRequest request;
    request.set_id(lease);
    pb::LeaseRevokeResponse reply;
    return Invoke(Cat("LeaseRevoke ", LeaseIdText(lease)), [&](Member& m, grpc::ClientContext* c) {
      return m.lease->LeaseRevoke(c, request, &reply);
    });
  }

  const std::vector<std::string>& endpoints() const override { return options_.endpoints; }

 private:
  // Runs `call(member, context)` on each member in turn until one answers.
  template <typename Call>
  Status Invoke(std::string_view what, Call&& call) {
    std::string failures;
    const size_t count = members_.size();
    const size_t first = preferred_.load(std::memory_order_relaxed);
    for (size_t i = 0; i < count; ++i) {
      Member& member = *members_[(first + i) % count];
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + options_.timeout);
      // Without wait_for_ready a call to a channel in backoff fails at once, and nothing polls
      // its reconnection between calls (gRPC's synchronous API), so a restarted member would
      // stay unreachable; waiting lets the call drive the connection until its deadline.
      context.set_wait_for_ready(true);
      grpc::Status status = call(member, &context);
      if (status.ok()) {
        preferred_.store((first + i) % count, std::memory_order_relaxed);
        return Status();
      }
      if (!MemberUnreachable(status)) return MemberError(what, member, status);
      AddFailure(&failures, member, status);
    }
    return Unreachable(what, failures);
  }

  void AddFailure(std::string* failures, const Member& member, const grpc::Status& status) const {
    if (!failures->empty()) failures->append("; ");
    failures->append(Cat(member.endpoint, ": "));
    // A call that waited for a connection until its deadline says only "Deadline Exceeded".
    const auto state = member.channel->GetState(/*try_to_connect=*/false);
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && state != GRPC_CHANNEL_READY) {
      failures->append(Cat("no connection within ", std::to_string(options_.timeout.count()),
                           " ms (refused, or nothing answers there)"));
    } else {
      failures->append(Describe(status));
    }
  }

  Status Unreachable(std::string_view what, const std::string& failures) const {
    return UnavailableError(
        Cat("etcd ", JoinEndpoints(options_.endpoints), " unreachable (", what, "): ", failures));
  }

  static Status MemberError(std::string_view what, const Member& member,
                            const grpc::Status& status) {
    return Status(FromGrpc(status.error_code()),
                  Cat("etcd ", what, " on ", member.endpoint, ": ", Describe(status)));
  }

  const EtcdOptions options_;
  std::vector<std::unique_ptr<Member>> members_;
  // The member that answered last: calls start there.
  std::atomic<size_t> preferred_{0};
  Mutex keepalive_mu_;
  std::unique_ptr<KeepAliveStream> keepalive_ LARDER_GUARDED_BY(keepalive_mu_);
};

bool IsDigits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool IsHostChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

// An endpoint as gRPC dials it ("host:port", "[v6]:port"), or why it is not one.
Result<std::string> ParseEndpoint(std::string_view text) {
  std::string_view endpoint = text;
  if (endpoint.starts_with("https://")) {
    return InvalidArgumentError(Cat("etcd endpoint ", text,
                                    ": TLS to etcd is not supported; give HOST:PORT of a "
                                    "plain-text client URL"));
  }
  if (endpoint.starts_with("http://")) endpoint.remove_prefix(7);
  if (!endpoint.empty() && endpoint.back() == '/') endpoint.remove_suffix(1);
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError(Cat("etcd endpoint '", text, "' is not HOST:PORT: ", why));
  };
  if (endpoint.empty()) return bad("it is empty");
  std::string_view host;
  std::string_view port;
  if (endpoint.front() == '[') {
    size_t close = endpoint.find(']');
    if (close == std::string_view::npos) return bad("an IPv6 address lacks its ']'");
    host = endpoint.substr(1, close - 1);
    if (host.empty()) return bad("the IPv6 address is empty");
    for (char c : host) {
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
            c == ':' || c == '.')) {
        return bad("the IPv6 address has a character that is not hex, ':' or '.'");
      }
    }
    if (close + 1 >= endpoint.size() || endpoint[close + 1] != ':') return bad("no :PORT");
    port = endpoint.substr(close + 2);
  } else {
    size_t colon = endpoint.rfind(':');
    if (colon == std::string_view::npos) return bad("no :PORT");
    host = endpoint.substr(0, colon);
    port = endpoint.substr(colon + 1);
    if (host.empty()) return bad("the host is empty");
    if (host.size() > 253) return bad("the host is longer than 253 characters");
    for (char c : host) {
      if (!IsHostChar(c)) return bad("the host has a character outside [A-Za-z0-9._-]");
    }
  }
  if (!IsDigits(port) || port.size() > 5) return bad("the port is not a number");
  const int number = std::stoi(std::string(port));
  if (number < 1 || number > 65535) return bad("the port is outside 1..65535");
  return std::string(endpoint);
}

}  // namespace

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  if (options.endpoints.empty()) return InvalidArgumentError("etcd client needs an endpoint");
  for (std::string& endpoint : options.endpoints) {
    LARDER_ASSIGN_OR_RETURN(endpoint, ParseEndpoint(endpoint));
  }
  if (options.timeout.count() < 1) {
    return InvalidArgumentError(Cat("etcd call timeout must be at least 1 ms (got ",
                                    std::to_string(options.timeout.count()), " ms)"));
  }
  return std::unique_ptr<EtcdClient>(new GrpcEtcdClient(std::move(options)));
}

Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list) {
  std::vector<std::string> endpoints;
  if (list.empty()) return InvalidArgumentError("no etcd endpoint given (HOST:PORT[,HOST:PORT])");
  size_t start = 0;
  for (;;) {
    size_t comma = list.find(',', start);
    std::string_view item = list.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty()) {
      return InvalidArgumentError(Cat("etcd endpoint list '", list, "' has an empty entry"));
    }
    LARDER_ASSIGN_OR_RETURN(std::string endpoint, ParseEndpoint(item));
    endpoints.push_back(std::move(endpoint));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return endpoints;
}

bool IsEtcdAddress(std::string_view address) { return address.starts_with("etcd://"); }

Result<EtcdTarget> ParseEtcdAddress(std::string_view address) {
  constexpr std::string_view kForm = " (etcd://HOST:PORT[,HOST:PORT...]/CLUSTER_ID)";
  if (!IsEtcdAddress(address)) {
    return InvalidArgumentError(Cat("'", address, "' is not an etcd address", kForm));
  }
  std::string_view rest = address.substr(7);
  size_t slash = rest.find('/');
  if (slash == std::string_view::npos) {
    return InvalidArgumentError(Cat("etcd address '", address, "' names no cluster id", kForm));
  }
  if (slash == 0) {
    return InvalidArgumentError(Cat("etcd address '", address, "' names no endpoint", kForm));
  }
  EtcdTarget target;
  auto endpoints = ParseEtcdEndpoints(rest.substr(0, slash));
  if (!endpoints.ok()) return endpoints.status().WithContext(Cat("etcd address '", address, "'"));
  target.endpoints = std::move(endpoints).value();
  std::string_view cluster_id = rest.substr(slash + 1);
  if (Status valid = ValidateClusterId(cluster_id); !valid.ok()) {
    return valid.WithContext(Cat("etcd address '", address, "'"));
  }
  target.cluster_id = std::string(cluster_id);
  return target;
}

std::string LeaseIdText(int64_t lease) {
  char buffer[24];
  snprintf(buffer, sizeof(buffer), "%llx",
           static_cast<unsigned long long>(static_cast<uint64_t>(lease)));
  return buffer;
}

Status ValidateClusterId(std::string_view cluster_id) {
  if (cluster_id.empty()) return InvalidArgumentError("the cluster id is empty");
  if (cluster_id.size() > 128) {
    return InvalidArgumentError(
        Cat("cluster id of ", std::to_string(cluster_id.size()), " characters is longer than 128"));
  }
  for (char c : cluster_id) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!allowed) {
      return InvalidArgumentError(
          Cat("cluster id '", cluster_id, "' has a character outside [A-Za-z0-9._-]"));
    }
  }
  if (cluster_id == "." || cluster_id == "..") {
    return InvalidArgumentError(Cat("cluster id '", cluster_id, "' is reserved"));
  }
  return Status();
}

std::string LeaderKey(std::string_view cluster_id) {
  return Cat("/larder/clusters/", cluster_id, "/leader");
}

std::string EncodeLeaderRecord(const LeaderRecord& record) {
  nlohmann::json j = {{"address", record.address},
                      {"incarnation", record.incarnation},
                      {"http_port", record.http_port}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<LeaderRecord> DecodeLeaderRecord(std::string_view json) {
  if (json.size() > kMaxLeaderRecordBytes) {
    return InvalidArgumentError(Cat("leader record of ", std::to_string(json.size()),
                                    " bytes exceeds the limit of ",
                                    std::to_string(kMaxLeaderRecordBytes)));
  }
  auto j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgumentError("leader record is not a JSON object");
  LeaderRecord record;
  auto address = j.find("address");
  if (address == j.end() || !address->is_string()) {
    return InvalidArgumentError("leader record has no string \"address\"");
  }
  record.address = address->get<std::string>();
  if (record.address.empty() || record.address.size() > 255) {
    return InvalidArgumentError(Cat("leader record's address has ",
                                    std::to_string(record.address.size()),
                                    " bytes (1..255 allowed)"));
  }
  auto incarnation = j.find("incarnation");
  if (incarnation == j.end() || !incarnation->is_number_unsigned()) {
    return InvalidArgumentError("leader record has no unsigned \"incarnation\"");
  }
  record.incarnation = incarnation->get<uint64_t>();
  auto http_port = j.find("http_port");
  if (http_port == j.end() || !http_port->is_number_integer()) {
    return InvalidArgumentError("leader record has no integer \"http_port\"");
  }
  const int64_t port = http_port->get<int64_t>();
  if (port < -1 || port > 65535) {
    return InvalidArgumentError(
        Cat("leader record's http_port ", std::to_string(port), " is outside -1..65535"));
  }
  record.http_port = static_cast<int>(port);
  return record;
}

Result<LeaderRecord> FindLeader(EtcdClient& etcd, std::string_view cluster_id) {
  LARDER_RETURN_IF_ERROR(ValidateClusterId(cluster_id));
  const std::string key = LeaderKey(cluster_id);
  LARDER_ASSIGN_OR_RETURN(std::optional<KeyValue> kv, etcd.Get(key));
  if (!kv.has_value()) {
    return UnavailableError(Cat("no leader of cluster ", cluster_id, " yet (no ", key, " in etcd ",
                                JoinEndpoints(etcd.endpoints()), ")"));
  }
  auto record = DecodeLeaderRecord(kv->value);
  if (!record.ok()) {
    return InternalError(Cat("the leader record of cluster ", cluster_id, " at ", key,
                             " does not parse: ", record.status().message()));
  }
  return record;
}

}  // namespace larder::etcd
