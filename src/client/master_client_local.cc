// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
// MasterClient: calls on the master's local control socket (common/local_control.h), for a client
// on the master's host.

#include <cerrno>
#include <cstring>

#include "client/master_client.h"
#include "common/env.h"
#include "common/local_control.h"
#include "common/logging.h"

namespace larder::client {

void MasterClient::LearnLocal(const Connection& connection) const {
  proto::ChallengeRequest ask;
  proto::ChallengeReply challenge;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.timeout);
  grpc::Status asked = connection.stub->Challenge(&context, ask, &challenge);
  static const std::string host_id = DefaultHostId();
  MutexLock lock(connection.local_mu);
  if (!asked.ok()) {
    // Asked again by a call a second from now: until then calls go over gRPC without waiting
    // for a master that may be away.
    connection.local_state = Connection::LocalState::kUnknown;
    connection.local_retry = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    return;
  }
  // An abstract socket is reachable from this network namespace only: the host id says so.
  if (challenge.local_socket().empty() || challenge.host_id() != host_id) {
    connection.local_state = Connection::LocalState::kNone;
    return;
  }
  connection.local_state = Connection::LocalState::kUsable;
  connection.local_socket = challenge.local_socket();
}

Fd MasterClient::TakeLocal(const Connection& connection, bool* fresh) const {
  if (!options_.tls_ca_file.empty()) return Fd();  // TLS was asked for: gRPC only
  if (getpid() != connection.local_owner) return Fd();
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
    if (connection.local_state != Connection::LocalState::kUsable) return Fd();
    if (!connection.local_idle.empty()) {
      Fd fd = std::move(connection.local_idle.back());
      connection.local_idle.pop_back();
      *fresh = false;
      return fd;
    }
    if (connection.local_open >= kMaxLocalConnections) return Fd();
    ++connection.local_open;
    socket = connection.local_socket;
  }
  *fresh = true;
  Result<Fd> connected = UnixConnectAbstract(socket, Deadline::max());
  if (connected.ok() && local_control::SetTimeouts(connected->get(), options_.timeout)) {
    return std::move(connected).value();
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
  return Fd();
}

bool MasterClient::CallLocal(const Connection& connection, const char* name,
                             const google::protobuf::MessageLite& request,
                             const grpc::ByteBuffer& signed_body,
                             google::protobuf::MessageLite* reply, grpc::Status* status) const {
  static const google::protobuf::ServiceDescriptor* service =
      proto::ChallengeRequest::descriptor()->file()->FindServiceByName("Master");
  const google::protobuf::MethodDescriptor* method = service->FindMethodByName(name);
  if (method == nullptr) return false;
  // The request's bytes: as signed (one slice), or serialized here without a token. One too
  // large for the socket goes to gRPC, which refuses it.
  std::string serialized;
  std::vector<grpc::Slice> slices;
  std::string_view bytes;
  if (signed_body.Valid()) {
    if (!signed_body.Dump(&slices).ok() || slices.size() != 1) return false;
    bytes = std::string_view(reinterpret_cast<const char*>(slices[0].begin()), slices[0].size());
  } else if (!request.SerializeToString(&serialized)) {
    return false;
  } else {
    bytes = serialized;
  }
  if (bytes.size() > local_control::kMaxBodyBytes) return false;
  bool fresh = false;
  Fd fd = TakeLocal(connection, &fresh);
  if (!fd.valid()) return false;
  local_control::RequestHead head;
  head.length = static_cast<uint32_t>(bytes.size());
  head.method = static_cast<uint16_t>(method->index());
  head.version = local_control::kVersion;
  iovec out[2] = {{&head, sizeof(head)}, {const_cast<char*>(bytes.data()), bytes.size()}};
  local_control::ReplyHead in;
  std::string message, details, body;
  const bool answered =
      local_control::WriteAll(fd.get(), out) && local_control::ReadAll(fd.get(), &in, sizeof(in));
  const int error = errno;
  const auto drop = [&](Connection::LocalState next) {
    fd.Reset();
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
                           (in.code == 0 || in.body_length == 0);
  if (!well_formed || !local_control::ReadBody(fd.get(), in.message_length, &message) ||
      !local_control::ReadBody(fd.get(), in.details_length, &details) ||
      !local_control::ReadBody(fd.get(), in.body_length, &body)) {
    drop(Connection::LocalState::kNone);
    *status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           well_formed ? "the local control socket closed mid-reply"
                                       : "malformed reply on the local control socket");
    return true;
  }
  if (in.code != 0) {
    *status = grpc::Status(static_cast<grpc::StatusCode>(in.code), message, details);
  } else if (!reply->ParseFromString(body)) {
    *status = grpc::Status(grpc::StatusCode::INTERNAL, "the reply does not parse");
  } else {
    *status = grpc::Status::OK;
  }
  MutexLock lock(connection.local_mu);
  if (connection.local_state == Connection::LocalState::kUsable) {
    connection.local_idle.push_back(std::move(fd));
  } else {
    fd.Reset();
    --connection.local_open;
  }
  return true;
}

}  // namespace larder::client
