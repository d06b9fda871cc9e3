// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The master's service as it is served, over gRPC and to the local control socket
// (local_control_server.h). Every method takes its request as the bytes that arrived: with a
// cluster token, the call's proof is checked over those very bytes before any of them is parsed
// (nothing is parsed for a caller that has not proven the token, and no message is serialized
// again to check it), then the request is parsed and handed to the typed handlers of service.cc,
// and their reply serialized once.
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/method_handler.h>

#include <google/protobuf/arena.h>
#include <google/protobuf/descriptor.h>

#include <array>
#include <cstddef>
#include <cstdlib>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/control_auth.h"
#include "common/logging.h"
#include "master/service.h"

namespace larder::master {
namespace {

constexpr size_t kArenaBlockBytes = 16 * 1024;

// What a call needs from its session.
enum class Need {
  kNothing,  // no session: the calls that open one
  kMember,   // any session (the caller holds the cluster token)
  kSelf,     // a session of the client the request names
  kAdmin,    // an operator session (the admin token)
};

class SignedService final : public ServedMaster {
 public:
  SignedService(std::unique_ptr<proto::Master::Service> handlers, SessionTable* sessions,
                const ServingGate* gate)
      : handlers_(std::move(handlers)),
        sessions_(sessions),
        gate_(gate),
        local_(static_cast<size_t>(Declared().method_count())) {
    using S = proto::Master::Service;
    Serve("Challenge", Need::kNothing, &S::Challenge);
    Serve("OpenSession", Need::kNothing, &S::OpenSession);
    Serve("MountSegments", Need::kSelf, &S::MountSegments);
    Serve("UnmountSegments", Need::kSelf, &S::UnmountSegments);
    Serve("Heartbeat", Need::kSelf, &S::Heartbeat);
    Serve("SyncCatalog", Need::kSelf, &S::SyncCatalog);
    Serve("BatchPutStart", Need::kSelf, &S::BatchPutStart);
    Serve("BatchPutEnd", Need::kSelf, &S::BatchPutEnd);
    Serve("BatchPutRevoke", Need::kSelf, &S::BatchPutRevoke);
    Serve("BatchGetReplicas", Need::kSelf, &S::BatchGetReplicas);
    Serve("ReleaseLeases", Need::kSelf, &S::ReleaseLeases);
    Serve("BatchExist", Need::kSelf, &S::BatchExist);
    Serve("BatchRemove", Need::kSelf, &S::BatchRemove);
    Serve("RemoveAll", Need::kAdmin, &S::RemoveAll);
    // A client removes keys by pattern as it removes them one by one (BatchRemove): in its own
    // name, with no operator session. RemoveAll, which names none of the keys, stays an
    // operator's call.
    Serve("RemoveByRegex", Need::kSelf, &S::RemoveByRegex);
    Serve("DiskPoll", Need::kSelf, &S::DiskPoll);
    Serve("DiskReport", Need::kSelf, &S::DiskReport);
    Serve("ListSegments", Need::kMember, &S::ListSegments);
    Serve("GetStats", Need::kMember, &S::GetStats);
  }

  size_t served() const { return paths_.size(); }

  grpc::Status ServeLocal(const LocalCall& call, std::string* reply) override {
    const int method = call.method;
    if (method < 0 || static_cast<size_t>(method) >= local_.size()) {
      return grpc::Status(
          grpc::StatusCode::UNIMPLEMENTED,
          fmt::format("{} has no method {}", proto::Master::service_full_name(), method));
    }
    if (!local_[method]) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          fmt::format("{} opens a session: over gRPC only, not on the local "
                                      "control socket",
                                      Declared().method(method)->name()));
    }
    return local_[method](call, reply);
  }

  // The service as proto/master.proto declares it.
  static const google::protobuf::ServiceDescriptor& Declared() {
    static const google::protobuf::ServiceDescriptor* declared =
        proto::ChallengeRequest::descriptor()->file()->FindServiceByName("Master");
    return *declared;
  }

 private:
  template <typename Request, typename Reply>
  using Handler = grpc::Status (proto::Master::Service::*)(grpc::ServerContext*, const Request*,
                                                           Reply*);

  template <typename Request, typename Reply>
  void Serve(const char* name, Need need, Handler<Request, Reply> handler) {
    const google::protobuf::MethodDescriptor* method = Declared().FindMethodByName(name);
    if (method == nullptr || method->input_type() != Request::descriptor() ||
        method->output_type() != Reply::descriptor()) {
      Log().critical("larder-master serves {} as proto/master.proto does not declare it", name);
      std::abort();
    }
    paths_.push_back(fmt::format("/{}/{}", proto::Master::service_full_name(), name));
    AddMethod(new grpc::internal::RpcServiceMethod(
        paths_.back().c_str(), grpc::internal::RpcMethod::NORMAL_RPC,
        new grpc::internal::RpcMethodHandler<SignedService, grpc::ByteBuffer, grpc::ByteBuffer>(
            [name, need, handler](SignedService* self, grpc::ServerContext* context,
                                  const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
              return self->Handle<Request, Reply>(name, need, handler, context, *in, out);
            },
            this)));
    if (need != Need::kNothing) {
      local_[static_cast<size_t>(method->index())] = [this, name, need, handler](
                                                         const LocalCall& call, std::string* out) {
        return Dispatch<Request, Reply>(name, need, handler, nullptr, &call, call.bytes,
                                        [out](size_t size) {
                                          out->resize(size);
                                          return reinterpret_cast<uint8_t*>(out->data());
                                        });
      };
    }
  }

  // A gRPC call: its bytes made one piece, served, and the reply's bytes into one slice.
  template <typename Request, typename Reply>
  grpc::Status Handle(const char* name, Need need, Handler<Request, Reply> handler,
                      grpc::ServerContext* context, const grpc::ByteBuffer& in,
                      grpc::ByteBuffer* out) {
    std::vector<grpc::Slice> slices;
    if (grpc::Status dumped = in.Dump(&slices); !dumped.ok()) return dumped;
    std::string joined;  // a request that arrived in pieces, made whole
    std::string_view bytes;
    if (slices.size() == 1) {
      bytes = std::string_view(reinterpret_cast<const char*>(slices[0].begin()), slices[0].size());
    } else {
      joined.reserve(in.Length());
      for (const grpc::Slice& slice : slices) {
        joined.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
      }
      bytes = joined;
    }
    std::optional<grpc::Slice> slice;
    grpc::Status status = Dispatch<Request, Reply>(name, need, handler, context, nullptr, bytes,
                                                   [&slice](size_t size) {
                                                     slice.emplace(size);
                                                     return const_cast<uint8_t*>(slice->begin());
                                                   });
    if (status.ok()) *out = grpc::ByteBuffer(&*slice, 1);
    return status;
  }

  // Serves one call, gRPC's (`context`) or the local socket's (`local`): `bytes` as they
  // arrived; the reply is serialized where reply_bytes(size) says.
  template <typename Request, typename Reply, typename ReplyBytes>
  grpc::Status Dispatch(const char* name, Need need, Handler<Request, Reply> handler,
                        grpc::ServerContext* context, const LocalCall* local,
                        std::string_view bytes, const ReplyBytes& reply_bytes) {
    if (gate_ != nullptr) {
      if (Status serving = gate_->CheckServing(); !serving.ok()) return ToGrpc(serving);
    }
    std::optional<CallIdentity> identity;
    if (need != Need::kNothing && sessions_->enabled()) {
      Result<CallIdentity> proven =
          local != nullptr ? ProveLocal(name, *local, &bytes) : Prove(name, context, &bytes);
      if (!proven.ok()) return ToGrpc(proven.status());
      identity = std::move(proven).value();
    }
    // The request and its reply live on an arena that starts on this stack: a batch's keys and
    // replicas cost no allocation each. (Not thread_local: gRPC starts threads as calls come,
    // and each would clear the block.)
    alignas(std::max_align_t) std::array<char, kArenaBlockBytes> block;
    google::protobuf::ArenaOptions arena_options;
    arena_options.initial_block = block.data();
    arena_options.initial_block_size = block.size();
    google::protobuf::Arena arena(arena_options);
    Request* request = google::protobuf::Arena::CreateMessage<Request>(&arena);
    if (!request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          std::string("the request of ") + name + " does not parse");
    }
    if (identity) {
      if (grpc::Status denied = Permit(name, need, *request, *identity); !denied.ok()) {
        return denied;
      }
    }
    Reply* reply = google::protobuf::Arena::CreateMessage<Reply>(&arena);
    std::optional<grpc::ServerContext> no_context;  // a local call's: the handlers read none of it
    grpc::Status status = (handlers_.get()->*handler)(
        context != nullptr ? context : &no_context.emplace(), request, reply);
    if (!status.ok()) return status;
    const size_t size = reply->ByteSizeLong();
    reply->SerializeWithCachedSizesToArray(reply_bytes(size));
    return grpc::Status::OK;
  }

  // A local call: proven by the proof after its bytes (flagged: which then binds its connection
  // to the proof's session), else by the session its connection is bound to.
  Result<CallIdentity> ProveLocal(const char* name, const LocalCall& call,
                                  std::string_view* bytes) {
    if (!call.proof_after_bytes && *call.bound_session != 0) {
      Result<CallIdentity> bound = sessions_->Bound(*call.bound_session);
      if (!bound.ok()) *call.bound_session = 0;  // closed: the next call proves itself again
      return bound;
    }
    std::string_view proof;
    if (call.proof_after_bytes && !control_auth::SplitTrailer(*bytes, bytes, &proof)) {
      return UnauthenticatedError("a call flagged with its proof after its bytes ends with none");
    }
    Result<CallIdentity> proven =
        sessions_->Verify(proof, name, [bytes] { return control_auth::BodyHash(*bytes); });
    if (proven.ok()) {
      *call.bound_session = proven->session_id;
      *call.bound = true;
    }
    return proven;
  }

  // Checks a gRPC call's proof: at the end of `bytes` (which then loses it), or else in its
  // metadata (an older client's), which is looked at only then: gRPC builds a map of all the
  // call's metadata when asked for any.
  Result<CallIdentity> Prove(const char* name, grpc::ServerContext* context,
                             std::string_view* bytes) {
    std::string_view proof;
    if (!sessions_->offers_proof_in_body() || !control_auth::SplitTrailer(*bytes, bytes, &proof)) {
      const auto& entries = context->client_metadata();
      if (auto it = entries.find(control_auth::kMetadataKey); it != entries.end()) {
        proof = std::string_view(it->second.data(), it->second.size());
      }
    }
    return sessions_->Verify(proof, name, [bytes] { return control_auth::BodyHash(*bytes); });
  }

  // Whether the proven session may act as the request says.
  template <typename Request>
  grpc::Status Permit(const char* name, Need need, const Request& request,
                      const CallIdentity& identity) {
    if constexpr (requires { request.client_id(); }) {
      if (need == Need::kSelf && request.client_id() != identity.client_id) {
        Log().warn("{}: session of client {} refused acting for client {}", name,
                   identity.client_id, QuoteKey(request.client_id()));
        return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                            "this session acts for client '" + identity.client_id +
                                "' only, not for " + QuoteKey(request.client_id()));
      }
    }
    if (need == Need::kAdmin && !identity.admin) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          std::string(name) + " needs an operator session: " +
                              (sessions_->has_admin_token()
                                   ? "set LARDER_ADMIN_TOKEN to the master's admin token"
                                   : "this master has no admin token (--admin-token-file)"));
    }
    return grpc::Status::OK;
  }

  std::unique_ptr<proto::Master::Service> handlers_;
  SessionTable* sessions_;
  const ServingGate* gate_;
  std::deque<std::string> paths_;  // the methods' full names, which gRPC keeps pointers to
  // The local socket's calls, by method number (empty: not served there).
  std::vector<std::function<grpc::Status(const LocalCall&, std::string*)>> local_;
};

}  // namespace

std::unique_ptr<ServedMaster> NewMasterService(MasterState* state, SessionTable* sessions,
                                               const ServingGate* gate, const LocalControl* local) {
  auto service =
      std::make_unique<SignedService>(NewMasterHandlers(state, sessions, local), sessions, gate);
  // Every method of the proto is served here (each as declared: Serve): one left out would
  // answer UNIMPLEMENTED to every client.
  if (service->served() != static_cast<size_t>(SignedService::Declared().method_count())) {
    Log().critical("larder-master serves {} of the {} methods of {}", service->served(),
                   SignedService::Declared().method_count(), proto::Master::service_full_name());
    std::abort();
  }
  return service;
}

}  // namespace larder::master
