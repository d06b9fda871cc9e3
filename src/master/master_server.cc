// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/master_server.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "master/http_endpoint.h"
#include "master/service.h"

namespace larder::master {

namespace {

bool IsLoopback(const std::string& host) {
  return host.rfind("127.", 0) == 0 || host == "::1" || host == "localhost";
}

Result<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError(std::string("cannot read ") + what + " " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The listen address, or an error when it would expose an unauthenticated master.
Result<std::string> ListenHost(const MasterServerOptions& options) {
  const bool open = !options.auth.cluster_token.empty() || options.insecure;
  if (options.listen_host.empty()) return std::string(open ? "0.0.0.0" : "127.0.0.1");
  if (!open && !IsLoopback(options.listen_host)) {
    return FailedPreconditionError(
        "refusing to serve " + options.listen_host +
        " without a cluster token: anyone who reaches it could read and change the cache. Give "
        "the master --auth-token-file FILE (and the clients LARDER_AUTH_TOKEN), or pass "
        "--insecure on a network you trust");
  }
  return options.listen_host;
}

}  // namespace

struct MasterServer::Impl {
  MasterServerOptions options;
  std::unique_ptr<SessionTable> sessions;
  std::unique_ptr<MasterState> state;
  std::unique_ptr<proto::Master::Service> service;
  std::unique_ptr<grpc::Server> grpc_server;
  int port = 0;
  std::unique_ptr<httplib::Server> http;
  std::thread http_thread;
  int http_port = -1;
  std::mutex shutdown_mu;
  bool shut_down = false;  // guarded by shutdown_mu
};

MasterServer::MasterServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MasterServer::~MasterServer() { Shutdown(); }

Result<std::unique_ptr<MasterServer>> MasterServer::Start(MasterServerOptions options) {
  if (!options.auth.admin_token.empty() && options.auth.cluster_token.empty()) {
    return InvalidArgumentError("an admin token needs a cluster token (--auth-token-file)");
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return InvalidArgumentError("TLS needs both a certificate and its key (--tls-cert, --tls-key)");
  }
  LARDER_ASSIGN_OR_RETURN(options.listen_host, ListenHost(options));
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options.tls_cert_file.empty()) {
    LARDER_ASSIGN_OR_RETURN(std::string cert, ReadFile(options.tls_cert_file, "TLS certificate"));
    LARDER_ASSIGN_OR_RETURN(std::string key, ReadFile(options.tls_key_file, "TLS key"));
    grpc::SslServerCredentialsOptions tls;
    tls.pem_key_cert_pairs.push_back({key, cert});
    credentials = grpc::SslServerCredentials(tls);
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->sessions = std::make_unique<SessionTable>(options.auth);
  impl->state = std::make_unique<MasterState>(options.master);
  impl->service = NewMasterService(impl->state.get(), impl->sessions.get());

  grpc::ServerBuilder builder;
  std::string address = options.listen_host + ":" + std::to_string(options.port);
  builder.AddListeningPort(address, credentials, &impl->port);
  builder.RegisterService(impl->service.get());
  // gRPC sets SO_REUSEPORT by default: a second master on the same port would then start and
  // take half of the clients. Refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Batches of large keys exceed gRPC's 4 MiB default.
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  impl->grpc_server = builder.BuildAndStart();
  if (impl->grpc_server == nullptr || impl->port == 0) {
    return UnavailableError("larder-master cannot listen on " + address +
                            " (port in use, or bad address)");
  }

  if (options.http_port >= 0) {
    impl->http = std::make_unique<httplib::Server>();
    InstallHttpRoutes(*impl->http, *impl->state,
                      HttpAuth{impl->sessions->enabled(), options.auth.admin_token});
    if (options.http_port == 0) {
      impl->http_port = impl->http->bind_to_any_port(options.listen_host);
    } else {
      impl->http_port =
          impl->http->bind_to_port(options.listen_host, options.http_port) ? options.http_port : -1;
    }
    if (impl->http_port <= 0) {
      impl->grpc_server->Shutdown();
      return UnavailableError("larder-master cannot listen for HTTP on " + options.listen_host +
                              ":" + std::to_string(options.http_port) + " (port in use?)");
    }
    httplib::Server* http = impl->http.get();
    impl->http_thread = std::thread([http] { http->listen_after_bind(); });
  }
  impl->state->StartSweeper();
  Log().info("larder-master serving gRPC on {}:{}{}, HTTP on {}", options.listen_host, impl->port,
             options.tls_cert_file.empty() ? "" : " (TLS)", impl->http_port);
  if (!impl->sessions->enabled()) {
    if (IsLoopback(options.listen_host)) {
      Log().info("no cluster token: serving loopback only (--auth-token-file, or --insecure)");
    } else {
      Log().warn(
          "no cluster token and --insecure: anyone who reaches {} can read and change the "
          "cache",
          options.listen_host);
    }
  }
  return std::unique_ptr<MasterServer>(new MasterServer(std::move(impl)));
}

uint16_t MasterServer::port() const { return static_cast<uint16_t>(impl_->port); }
const std::string& MasterServer::listen_host() const { return impl_->options.listen_host; }
int MasterServer::http_port() const { return impl_->http_port; }
MasterState& MasterServer::state() { return *impl_->state; }

std::string MasterServer::address() const {
  std::string host = impl_->options.listen_host;
  if (host == "0.0.0.0" || host == "::" || host.empty()) host = "127.0.0.1";
  return host + ":" + std::to_string(impl_->port);
}

void MasterServer::Shutdown() {
  std::lock_guard lock(impl_->shutdown_mu);
  if (impl_->shut_down) return;
  impl_->shut_down = true;
  if (impl_->http) {
    impl_->http->stop();
    if (impl_->http_thread.joinable()) impl_->http_thread.join();
  }
  // In-flight calls get a short grace period to finish.
  impl_->grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  impl_->grpc_server->Wait();
}

}  // namespace larder::master
