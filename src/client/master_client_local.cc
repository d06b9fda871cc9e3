// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
// MasterClient: calls on the master's local control socket (common/local_control.h), for a client
// on the master's host.

#include <cerrno>
#include <cstring>

#include "client/master_client.h"
#include "common/control_auth.h"
#include "common/env.h"
#include "common/local_control.h"
#include "common/logging.h"
#include "common/proto_mac.h"

namespace larder::client {

void MasterClient::LearnLocal(const Connection& connection) const {
  proto::ChallengeRequest ask;
  proto::ChallengeReply challenge;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.timeout);
  grpc::Status asked = connection.stub->Challenge(&context, ask, &challenge);
  if (!asked.ok()) {
    // Asked again by a call a second from now: until then calls go over gRPC without waiting
    // for a master that may be away.
    MutexLock lock(connection.local_mu);
    connection.local_state = Connection::LocalState::kUnknown;
    connection.local_retry = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    return;
  }
  AdoptLocal(connection, challenge);
}

void MasterClient::AdoptLocal(const Connection& connection,
                              const proto::ChallengeReply& challenge) const {
  static const std::string host_id = DefaultHostId();
  MutexLock lock(connection.local_mu);
  if (connection.local_state == Connection::LocalState::kUsable ||
      connection.local_state == Connection::LocalState::kNone) {
    return;  // known already
  }
  // An abstract socket is reachable from this network namespace only: the host id says so. A
  // name of another form is no master's (LocalControlServer::Listen).
  const std::string& name = challenge.local_socket();
  if (name.empty() || challenge.host_id() != host_id || !name.starts_with("larder-master-") ||
      name.size() > 64) {
    connection.local_state = Connection::LocalState::kNone;
    return;
  }
  connection.local_state = Connection::LocalState::kUsable;
  connection.local_socket = name;
}

MasterClient::LocalLink MasterClient::TakeLocal(const Connection& connection, bool* fresh) const {
  if (!options_.tls_ca_file.empty()) return LocalLink{};  // TLS was asked for: gRPC only
  if (getpid() != connection.local_owner) return LocalLink{};
  std::string socket;
  {
    MutexLock lock(connection.local_mu);
    if (connection.local_state == Connection::LocalState::kUnknown &&
        std::chrono::steady_clock::now() >= connection.local_retry) {
      connection.local_state = Connection::LocalState::kLearning;
      lock.Unlock();
      LearnLocal(connection);
      lock.Lock();
    }
    if (connection.local_state != Connection::LocalState::kUsable) return LocalLink{};
    if (!connection.local_idle.empty()) {
      LocalLink link = std::move(connection.local_idle.back());
      connection.local_idle.pop_back();
      *fresh = false;
      return link;
    }
    if (connection.local_open >= kMaxLocalConnections) return LocalLink{};
    ++connection.local_open;
    socket = connection.local_socket;
  }
  *fresh = true;
  Result<Fd> connected = UnixConnectAbstract(socket, Deadline::max());
  if (connected.ok() && local_control::SetTimeouts(connected->get(), options_.timeout)) {
    return LocalLink{std::move(connected).value()};
  }
  // Not reachable from here after all (another mount of the network namespace's sockets,
  // another master on the name): this channel stays on gRPC.
  Log().info(
      "larder-master {}: its local control socket is not usable here ({}): calls go over "
      "gRPC",
      connection.address,
      connected.ok() ? std::string(std::strerror(errno)) : connected.status().ToString());
  MutexLock lock(connection.local_mu);
  --connection.local_open;
  connection.local_state = Connection::LocalState::kNone;
  return LocalLink{};
}

bool MasterClient::CallLocal(const Connection& connection, const char* name,
                             const google::protobuf::MessageLite& request, const Session* session,
                             google::protobuf::MessageLite* reply, grpc::Status* status) const {
  static const google::protobuf::ServiceDescriptor* service =
      proto::ChallengeRequest::descriptor()->file()->FindServiceByName("Master");
  const google::protobuf::MethodDescriptor* method = service->FindMethodByName(name);
  // A master names its socket only where it takes proofs after the request's bytes.
  if (method == nullptr || (session != nullptr && !session->proof_in_body)) return false;
  // One too large for the socket goes to gRPC, which refuses it.
  const size_t size = request.ByteSizeLong();
  if (size + control_auth::kTrailerBytes > local_control::kMaxBodyBytes) return false;
  bool fresh = false;
  LocalLink link = TakeLocal(connection, &fresh);
  if (!link.fd.valid()) return false;
  // The request's bytes; with its proof after them on a connection not bound to the session yet.
  const bool prove = session != nullptr && link.bound_session != session->id;
  std::string bytes(size + (prove ? control_auth::kTrailerBytes : 0), '\0');
  uint8_t* out = reinterpret_cast<uint8_t*>(bytes.data());
  const bool serialized =
      prove ? SignInto(*session, name, request, size, out) : SerializeForMacTo(request, size, out);
  local_control::RequestHead head;
  head.length = static_cast<uint32_t>(bytes.size());
  head.method = static_cast<uint16_t>(method->index());
  head.version = local_control::kVersion;
  head.flags = prove ? local_control::kProofAfterBytes : 0;
  iovec pieces[2] = {{&head, sizeof(head)}, {bytes.data(), bytes.size()}};
  local_control::ReplyHead in;
  std::string message, details, body;
  const bool answered = serialized && local_control::WriteAll(link.fd.get(), pieces) &&
                        local_control::ReadAll(link.fd.get(), &in, sizeof(in));
  const int error = errno;
  const auto drop = [&](Connection::LocalState next) {
    link.fd.Reset();
    MutexLock lock(connection.local_mu);
    --connection.local_open;
    if (next != Connection::LocalState::kUsable) {
      // Connections to a master that left go with it; the next call learns where it is now.
      connection.local_open -= connection.local_idle.size();
      connection.local_idle.clear();
      if (connection.local_state == Connection::LocalState::kUsable) {
        connection.local_state = next;
      }
    }
  };
  if (!serialized) {
    drop(Connection::LocalState::kUsable);
    *status = grpc::Status(grpc::StatusCode::INTERNAL,
                           std::string("cannot serialize the request of ") + name);
    return true;
  }
  if (!answered) {
    if (error == EAGAIN || error == EWOULDBLOCK) {
      drop(Connection::LocalState::kUsable);
      *status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
      return true;
    }
    // The master closed the connection: it refused it (at its limit: this channel stays on
    // gRPC), or it went away (a restart: the next call asks it again). The call goes over gRPC.
    drop(fresh ? Connection::LocalState::kNone : Connection::LocalState::kUnknown);
    return false;
  }
  const bool well_formed = in.code <= static_cast<uint32_t>(grpc::StatusCode::UNAUTHENTICATED) &&
                           in.message_length <= local_control::kMaxStatusBytes &&
                           in.details_length <= local_control::kMaxStatusBytes &&
                           in.body_length <= local_control::kMaxBodyBytes &&
                           (in.code == 0 || in.body_length == 0) &&
                           (in.flags & ~local_control::kBound) == 0 &&
                           (prove || (in.flags & local_control::kBound) == 0);
  if (!well_formed || !local_control::ReadBody(link.fd.get(), in.message_length, &message) ||
      !local_control::ReadBody(link.fd.get(), in.details_length, &details) ||
      !local_control::ReadBody(link.fd.get(), in.body_length, &body)) {
    drop(Connection::LocalState::kNone);
    *status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           well_formed ? "the local control socket closed mid-reply"
                                       : "malformed reply on the local control socket");
    return true;
  }
  const auto code = static_cast<grpc::StatusCode>(in.code);
  if (code != grpc::StatusCode::OK) {
    *status = grpc::Status(code, message, details);
  } else if (!reply->ParseFromString(body)) {
    *status = grpc::Status(grpc::StatusCode::INTERNAL, "the reply does not parse");
  } else {
    *status = grpc::Status::OK;
  }
  // A proof the master took binds the connection to its session there (it says so); a call
  // refused for its session (one the master closed) leaves it bound to none.
  if ((in.flags & local_control::kBound) != 0) {
    link.bound_session = session->id;
  } else if (code == grpc::StatusCode::UNAUTHENTICATED) {
    link.bound_session = 0;
  }
  MutexLock lock(connection.local_mu);
  if (connection.local_state == Connection::LocalState::kUsable) {
    connection.local_idle.push_back(std::move(link));
  } else {
    link.fd.Reset();
    --connection.local_open;
  }
  return true;
}

}  // namespace larder::client
