// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "client/master_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

#include "common/control_auth.h"
#include "common/grpc_process.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/proto_mac.h"

namespace larder::client {

namespace {

std::string RandomClientId() {
  uint8_t bytes[8];
  RandomBytes(bytes, sizeof(bytes));
  std::string out = "client/";
  for (uint8_t b : bytes) out += fmt::format("{:02x}", b);
  return out;
}

}  // namespace

namespace {

// "host:port" with a port in 1-65535 (gRPC target forms with a scheme pass as they are). Without a
// port gRPC would dial 443 and the first call would wait out its whole deadline.
Status CheckMasterAddress(const std::string& address) {
  if (address.find(':') != std::string::npos &&
      (address.starts_with("unix:") || address.starts_with("dns:") ||
       address.starts_with("ipv4:") || address.starts_with("ipv6:"))) {
    return Status();
  }
  size_t colon = address.rfind(':');
  std::string_view port =
      colon == std::string::npos ? std::string_view() : std::string_view(address).substr(colon + 1);
  unsigned value = 0;
  auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (colon == 0 || port.empty() || error != std::errc() || end != port.data() + port.size() ||
      value == 0 || value > 65535) {
    return InvalidArgumentError("master address '" + address +
                                "' needs a port: host:port, e.g. 127.0.0.1:50051 (larder-master's "
                                "default port), or etcd://host:port/cluster for HA");
  }
  return Status();
}

}  // namespace

MasterClient::MasterClient(std::string address, std::chrono::milliseconds timeout)
    : MasterClient([&] {
        MasterClientOptions options;
        options.address = std::move(address);
        options.timeout = timeout;
        return options;
      }()) {}

MasterClient::MasterClient(MasterClientOptions options) : options_(std::move(options)) {
  if (options_.client_id.empty()) options_.client_id = RandomClientId();
  credentials_ = grpc::InsecureChannelCredentials();
  if (!options_.tls_ca_file.empty()) {
    std::ifstream in(options_.tls_ca_file, std::ios::binary);
    std::ostringstream ca;
    if (in) ca << in.rdbuf();
    if (!in || ca.str().empty()) {
      init_status_ = InvalidArgumentError("cannot read the TLS CA file " + options_.tls_ca_file +
                                          " (LARDER_TLS_CA)");
    }
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ca.str();
    credentials_ = grpc::SslCredentials(tls);
  }
  if (!etcd::IsEtcdAddress(options_.address)) {
    if (Status address = CheckMasterAddress(options_.address); !address.ok()) {
      init_status_ = address;
      return;
    }
    connection_ = Connect(options_.address);
    return;
  }
  auto target = etcd::ParseEtcdAddress(options_.address);
  if (!target.ok()) {
    init_status_ = target.status().WithContext("master address");
    return;
  }
  etcd_target_ = *target;
  etcd::EtcdOptions etcd_options;
  etcd_options.endpoints = target->endpoints;
  etcd_options.timeout = std::min(options_.timeout, std::chrono::milliseconds(2000));
  auto etcd = etcd::EtcdClient::Create(etcd_options);
  if (!etcd.ok()) {
    init_status_ = etcd.status().WithContext("master address " + options_.address);
    return;
  }
  etcd_ = std::move(*etcd);
}

std::shared_ptr<const MasterClient::Connection> MasterClient::Connect(
    const std::string& address) const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // Reconnect quickly to a restarted master (gRPC's default backoff grows to two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  PrepareGrpcRuntime();
  auto connection = std::make_shared<Connection>();
  connection->address = address;
  connection->channel = grpc::CreateCustomChannel(address, credentials_, args);
  connection->stub = proto::Master::NewStub(connection->channel);
  return connection;
}

std::string MasterClient::Describe() const {
  if (!etcd_target_) return options_.address;
  MutexLock lock(connection_mu_);
  if (connection_ == nullptr) return options_.address + " (no leader known)";
  return options_.address + " (leader " + connection_->address + ")";
}

Result<std::shared_ptr<const MasterClient::Connection>> MasterClient::CurrentConnection() const {
  LARDER_RETURN_IF_ERROR(init_status_);
  {
    MutexLock lock(connection_mu_);
    if (connection_ != nullptr) return connection_;
  }
  return LookUpLeader();
}

Result<std::shared_ptr<const MasterClient::Connection>> MasterClient::LookUpLeader() const {
  auto leader = etcd::FindLeader(*etcd_, etcd_target_->cluster_id);
  if (!leader.ok()) {
    return UnavailableError("larder-master of cluster '" + etcd_target_->cluster_id +
                            "' unreachable: " + leader.status().message());
  }
  MutexLock lock(connection_mu_);
  if (connection_ == nullptr || connection_->address != leader->address) {
    Log().info("larder-master: following the leader of cluster '{}' at {} (incarnation {:x})",
               etcd_target_->cluster_id, leader->address, leader->incarnation);
    connection_ = Connect(leader->address);
  }
  return connection_;
}

bool MasterClient::FollowLeader(const Connection& stale) const {
  if (!etcd_target_) return false;
  auto leader = LookUpLeader();
  return leader.ok() && (*leader)->address != stale.address;
}

bool MasterClient::IsUnknownSession(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
         ErrorDetailFromWire(status.error_details()) == ErrorDetail::kUnknownSession;
}

MasterClient::Reconnect MasterClient::AwaitReconnect(std::chrono::milliseconds bound) const {
  Result<std::shared_ptr<const Connection>> connection = CurrentConnection();
  if (!connection.ok()) return Reconnect::kAttemptFailed;
  grpc::Channel& channel = *(*connection)->channel;
  const auto deadline = std::chrono::system_clock::now() + bound;
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  // A failure already seen is not the outcome waited for. gRPC keeps a channel in
  // TRANSIENT_FAILURE through its later attempts until one connects, so from there this waits
  // until the channel is READY or the bound passes; from IDLE or CONNECTING, the first attempt's
  // outcome ends the wait (a refused connection: at once).
  if (state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
    if (!channel.WaitForStateChange(state, deadline)) return Reconnect::kTimedOut;
    state = channel.GetState(true);
  }
  while (state != GRPC_CHANNEL_READY && state != GRPC_CHANNEL_TRANSIENT_FAILURE &&
         state != GRPC_CHANNEL_SHUTDOWN) {
    if (!channel.WaitForStateChange(state, deadline)) return Reconnect::kTimedOut;
    state = channel.GetState(true);
  }
  return state == GRPC_CHANNEL_READY ? Reconnect::kConnected : Reconnect::kAttemptFailed;
}

void MasterClient::AwaitReconnectUnlessGone() const {
  if (unreachable_.load()) return;
  if (AwaitReconnect(kReconnectWait) == Reconnect::kTimedOut) unreachable_.store(true);
}

bool MasterClient::IsUnreachable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

Status MasterClient::SessionFor(const Connection& connection,
                                std::shared_ptr<const Session>* session) const {
  LARDER_RETURN_IF_ERROR(init_status_);
  if (options_.auth_token.empty()) return Status::Ok();
  LARDER_ASSIGN_OR_RETURN(*session, CurrentSession(connection));
  return Status::Ok();
}

bool MasterClient::SignInto(const Session& session, const char* name,
                            const google::protobuf::MessageLite& request, size_t size,
                            uint8_t* out) const {
  if (!SerializeForMacTo(request, size, out)) return false;
  const uint64_t sequence = sequence_.fetch_add(1, std::memory_order_relaxed) + 1;
  control_auth::Digest mac = control_auth::CallMac(
      session.key, name, sequence,
      control_auth::BodyHash(std::string_view(reinterpret_cast<const char*>(out), size)));
  control_auth::EncodeTrailer(session.id, sequence, mac, out + size);
  return true;
}

Status MasterClient::Sign(const Session& session, const char* name,
                          const google::protobuf::MessageLite& request,
                          grpc::ClientContext* context, grpc::ByteBuffer* body) const {
  // The request is serialized once, deterministically, and sent as the very bytes its proof
  // covers: followed by the proof where the master takes it there, else with the proof in
  // metadata (an older master hashes its own deterministic serialization of what it parsed: the
  // same bytes).
  const size_t size = request.ByteSizeLong();
  grpc::Slice bytes(size + control_auth::kTrailerBytes);
  uint8_t* out = const_cast<uint8_t*>(bytes.begin());
  if (!SignInto(session, name, request, size, out)) {
    return InternalError(std::string("cannot serialize the request of ") + name);
  }
  if (session.proof_in_body) {
    *body = grpc::ByteBuffer(&bytes, 1);
    return Status::Ok();
  }
  // The trailer's value is the metadata's.
  std::string_view request_bytes;
  std::string_view proof;
  control_auth::SplitTrailer(
      std::string_view(reinterpret_cast<const char*>(out), size + control_auth::kTrailerBytes),
      &request_bytes, &proof);
  context->AddMetadata(control_auth::kMetadataKey, std::string(proof));
  grpc::Slice unsigned_bytes(request_bytes.data(), request_bytes.size());
  *body = grpc::ByteBuffer(&unsigned_bytes, 1);
  return Status::Ok();
}

const grpc::internal::RpcMethod& MasterClient::Connection::Method(const char* name) const {
  MutexLock lock(methods_mu);
  for (const std::unique_ptr<RegisteredMethod>& known : methods) {
    if (known->name == name) return *known->method;
  }
  auto added = std::make_unique<RegisteredMethod>();
  added->name = name;
  added->path = "/" + std::string(proto::Master::service_full_name()) + "/" + name;
  added->method = std::make_unique<grpc::internal::RpcMethod>(
      added->path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC, channel);
  methods.push_back(std::move(added));
  return *methods.back()->method;
}

Result<std::shared_ptr<const MasterClient::Session>> MasterClient::CurrentSession(
    const Connection& connection) const {
  MutexLock lock(connection.session_mu);
  if (connection.session != nullptr) return connection.session;
  LARDER_ASSIGN_OR_RETURN(connection.session, OpenSession(connection));
  return connection.session;
}

void MasterClient::ForgetSession(const Connection& connection, uint64_t session_id) const {
  MutexLock lock(connection.session_mu);
  if (connection.session != nullptr && connection.session->id == session_id) {
    connection.session.reset();
  }
}

Result<std::shared_ptr<const MasterClient::Session>> MasterClient::OpenSession(
    const Connection& connection) const {
  proto::ChallengeRequest ask;
  proto::ChallengeReply challenge;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + options_.timeout);
    LARDER_RETURN_IF_ERROR(
        FromGrpc(connection, "Challenge", connection.stub->Challenge(&context, ask, &challenge)));
  }
  AdoptLocal(connection, challenge);  // the session's challenge names the local socket too
  const std::string& address = connection.address;
  if (!challenge.auth_required()) {
    return PermissionDeniedError("larder-master " + address +
                                 " does not prove the cluster token (it runs without one): "
                                 "refusing to use it while LARDER_AUTH_TOKEN is set");
  }
  if (challenge.server_nonce().size() != control_auth::kNonceBytes) {
    return InternalError("larder-master " + address + " sent a malformed challenge");
  }
  std::string client_nonce(control_auth::kNonceBytes, '\0');
  RandomBytes(reinterpret_cast<uint8_t*>(client_nonce.data()), client_nonce.size());
  proto::OpenSessionRequest open;
  open.set_client_id(options_.client_id);
  open.set_client_nonce(client_nonce);
  open.set_server_nonce(challenge.server_nonce());
  control_auth::Digest proof = control_auth::ClientProof(options_.auth_token, options_.client_id,
                                                         client_nonce, challenge.server_nonce());
  open.set_proof(proof.data(), proof.size());
  if (options_.engine != nullptr) {
    open.set_identity_key(options_.engine->identity_key());
    open.set_identity_signature(options_.engine->SignAsEngine(
        control_auth::IdentityMessage(options_.client_id, client_nonce, challenge.server_nonce())));
  }
  if (!options_.admin_token.empty()) {
    control_auth::Digest admin = control_auth::AdminProof(options_.admin_token, options_.client_id,
                                                          client_nonce, challenge.server_nonce());
    open.set_admin_proof(admin.data(), admin.size());
  }
  proto::OpenSessionReply opened;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + options_.timeout);
    LARDER_RETURN_IF_ERROR(
        FromGrpc(connection, "OpenSession", connection.stub->OpenSession(&context, open, &opened)));
  }
  if (!control_auth::Equal(
          control_auth::ServerProof(options_.auth_token, options_.client_id, client_nonce,
                                    challenge.server_nonce(), opened.session_id(), opened.admin()),
          opened.proof())) {
    return PermissionDeniedError("larder-master " + address +
                                 " did not prove the cluster token: refusing to use it");
  }
  auto session = std::make_shared<Session>();
  session->id = opened.session_id();
  session->key = control_auth::SessionKey(options_.auth_token, options_.client_id, client_nonce,
                                          challenge.server_nonce(), opened.session_id());
  session->proof_in_body = challenge.proof_in_body();
  return std::shared_ptr<const Session>(std::move(session));
}

Status MasterClient::FromGrpc(const Connection& connection, const char* name,
                              const grpc::Status& status) const {
  if (status.ok()) return Status::Ok();
  auto code = static_cast<StatusCode>(status.error_code());
  if (code == StatusCode::kUnavailable || code == StatusCode::kDeadlineExceeded) {
    std::string where = connection.address;
    if (etcd_target_) where += " (leader of cluster '" + etcd_target_->cluster_id + "')";
    return Status(code, std::string("larder-master ") + where + " unreachable (" + name +
                            "): " + status.error_message());
  }
  if (static_cast<int>(code) < 0 || static_cast<int>(code) > 16) code = StatusCode::kUnknown;
  return Status(code, std::string(name) + ": " + status.error_message())
      .WithDetail(ErrorDetailFromWire(status.error_details()));
}

std::vector<Status> ItemStatuses(
    size_t count, const google::protobuf::RepeatedPtrField<proto::KeyError>& errors) {
  std::vector<Status> statuses(count);
  for (const proto::KeyError& error : errors) {
    if (error.index() >= count || error.status().code() == 0) {
      return std::vector<Status>(
          count,
          InternalError("larder-master sent a malformed reply: error for item " +
                        std::to_string(error.index()) + " of a batch of " + std::to_string(count)));
    }
    statuses[error.index()] = FromItemStatus(error.status());
  }
  return statuses;
}

Status CheckReplicaColumns(const proto::BatchGetReplicasReply& reply, size_t count) {
  uint64_t replicas = 0;
  for (uint32_t n : reply.replica_count()) replicas += n;
  if (static_cast<size_t>(reply.size_size()) != count ||
      static_cast<size_t>(reply.replica_count_size()) != count ||
      static_cast<uint64_t>(reply.segment_id_size()) != replicas ||
      static_cast<uint64_t>(reply.offset_size()) != replicas) {
    return InternalError(
        "larder-master sent a malformed GetReplicas reply: " + std::to_string(reply.size_size()) +
        " sizes and " + std::to_string(reply.replica_count_size()) + " replica counts for " +
        std::to_string(count) + " keys, " + std::to_string(reply.segment_id_size()) +
        " segments and " + std::to_string(reply.offset_size()) + " offsets for " +
        std::to_string(replicas) + " replicas");
  }
  return Status::Ok();
}

Status CheckPutStartReply(const proto::BatchPutStartReply& reply, size_t count) {
  if (static_cast<size_t>(reply.results_size()) != count) {
    return InternalError(
        "larder-master sent a malformed PutStart reply: " + std::to_string(reply.results_size()) +
        " results for " + std::to_string(count) + " keys");
  }
  return Status::Ok();
}

}  // namespace larder::client
