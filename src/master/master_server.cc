// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/master_server.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <thread>

#include "common/logging.h"
#include "master/http_endpoint.h"
#include "master/service.h"

namespace larder::master {

struct MasterServer::Impl {
  MasterServerOptions options;
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
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->state = std::make_unique<MasterState>(options.master);
  impl->service = NewMasterService(impl->state.get());

  grpc::ServerBuilder builder;
  std::string address = options.listen_host + ":" + std::to_string(options.port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &impl->port);
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
    InstallHttpRoutes(*impl->http, *impl->state);
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
  Log().info("larder-master serving gRPC on {}:{}, HTTP on {}", options.listen_host, impl->port,
             impl->http_port);
  return std::unique_ptr<MasterServer>(new MasterServer(std::move(impl)));
}

uint16_t MasterServer::port() const { return static_cast<uint16_t>(impl_->port); }
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
