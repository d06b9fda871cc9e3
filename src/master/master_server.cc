// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/master_server.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/env.h"
#include "common/grpc_process.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/net.h"
#include "etcd/etcd_client.h"
#include "master/http_endpoint.h"
#include "master/http_server.h"
#include "master/leader_election.h"
#include "master/local_control_server.h"
#include "master/service.h"
#include "master/status_history.h"

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

// The gate the service is built with before the election exists (the election needs the
// bound ports): nothing is served until Set, then the election decides.
class DeferredGate final : public ServingGate {
 public:
  explicit DeferredGate(std::string cluster_id) : cluster_id_(std::move(cluster_id)) {}
  Status CheckServing() const override {
    const ServingGate* target = target_.load(std::memory_order_acquire);
    if (target != nullptr) return target->CheckServing();
    std::string message = "larder-master of cluster ";
    message += cluster_id_;
    message += " is starting and has not joined the leader election yet";
    return UnavailableError(message);
  }
  void Set(const ServingGate* target) { target_.store(target, std::memory_order_release); }

 private:
  const std::string cluster_id_;
  std::atomic<const ServingGate*> target_{nullptr};
};

// "host:port" with a non-empty host and a port 1..65535.
Status ValidateAdvertiseAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  bool valid = colon != std::string::npos && colon > 0 && colon + 1 < address.size() &&
               address.size() - colon - 1 <= 5;
  if (valid) {
    for (size_t i = colon + 1; i < address.size(); ++i) {
      if (address[i] < '0' || address[i] > '9') valid = false;
    }
  }
  if (valid) {
    const int port = std::stoi(address.substr(colon + 1));
    valid = port >= 1 && port <= 65535;
  }
  if (valid) return Status();
  std::string message = "advertise address '";
  message += address;
  message += "' is not HOST:PORT (a port 1..65535)";
  return InvalidArgumentError(message);
}

// Without etcd, one master per cluster and host: an abstract Unix socket named after the cluster
// is the lock (the kernel releases it with the process, even after SIGKILL).
Result<Fd> LockClusterOnHost(const std::string& cluster_id) {
  std::string name = "larder-master/";
  name += cluster_id;
  auto lock = UnixListenAbstract(name);
  if (lock.ok()) return lock;
  std::string message;
  if (lock.status().code() == StatusCode::kAlreadyExists) {
    message = "cluster ";
    message += cluster_id;
    message +=
        " already has a master on this host; several masters of one cluster need --etcd (a "
        "leader and standbys)";
    return FailedPreconditionError(message);
  }
  message = "cannot take the host lock of cluster ";
  message += cluster_id;
  return lock.status().WithContext(message);
}

}  // namespace

struct MasterServer::Impl {
  MasterServerOptions options;
  std::unique_ptr<SessionTable> sessions;
  std::unique_ptr<MasterState> state;
  LocalControl local_control;  // named in ChallengeReply
  std::unique_ptr<ServedMaster> service;
  std::unique_ptr<grpc::Server> grpc_server;
  std::unique_ptr<LocalControlServer> local;  // stopped before the service goes
  int port = 0;
  std::unique_ptr<GuardedHttpServer> http;
  std::thread http_thread;
  std::atomic<bool> http_done{false};  // listen_after_bind returned
  int http_port = -1;
  // With HTTP: the counters every options.status_interval, for /api/history.
  StatusHistory history;
  std::thread sampler;
  Mutex sampler_mu;
  CondVar sampler_cv;
  bool sampler_stop LARDER_GUARDED_BY(sampler_mu) = false;
  Fd cluster_lock;                           // without etcd, with a cluster id
  std::unique_ptr<DeferredGate> gate;        // with etcd
  std::unique_ptr<LeaderElection> election;  // with etcd; set before any thread reads it
  Mutex shutdown_mu;
  bool shut_down LARDER_GUARDED_BY(shutdown_mu) = false;

  // The sampler thread: one sample now, then one every `interval` until stopped.
  void Sample(std::chrono::milliseconds interval) {
    MutexLock lock(sampler_mu);
    while (!sampler_stop) {
      lock.Unlock();
      const int64_t unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
      const int64_t steady_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now().time_since_epoch())
                                    .count();
      history.Record(SampleStatus(*state, unix_ms, steady_ns));
      lock.Lock();
      const auto deadline = std::chrono::steady_clock::now() + interval;
      while (!sampler_stop && sampler_cv.WaitUntil(lock, deadline)) {
      }
    }
  }
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
  const bool with_etcd = !options.etcd_endpoints.empty();
  if (with_etcd && options.cluster_id.empty()) {
    return InvalidArgumentError("a master with etcd needs a cluster id (--cluster-id)");
  }
  if (!options.cluster_id.empty()) {
    LARDER_RETURN_IF_ERROR(etcd::ValidateClusterId(options.cluster_id));
  }
  if (!options.advertise_address.empty()) {
    LARDER_RETURN_IF_ERROR(ValidateAdvertiseAddress(options.advertise_address));
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
  if (!with_etcd && !options.cluster_id.empty()) {
    LARDER_ASSIGN_OR_RETURN(impl->cluster_lock, LockClusterOnHost(options.cluster_id));
  }
  if (with_etcd) impl->gate = std::make_unique<DeferredGate>(options.cluster_id);
  // With TLS, clients hold a CA and stay on gRPC (MasterClient): no local socket then.
  if (options.local_control_socket && options.tls_cert_file.empty()) {
    auto local = LocalControlServer::Listen();
    if (local.ok()) {
      impl->local = std::move(local).value();
      impl->local_control = LocalControl{impl->local->name(), DefaultHostId()};
    } else {
      Log().warn(
          "larder-master serves no local control socket (its clients on this host use "
          "gRPC): {}",
          local.status().ToString());
    }
  }
  impl->service = NewMasterService(impl->state.get(), impl->sessions.get(), impl->gate.get(),
                                   &impl->local_control);

  PrepareGrpcRuntime();
  grpc::ServerBuilder builder;
  std::string address = options.listen_host + ":" + std::to_string(options.port);
  builder.AddListeningPort(address, credentials, &impl->port);
  builder.RegisterService(impl->service.get());
  // gRPC sets SO_REUSEPORT by default: a second master on the same port would then start and
  // take half of the clients. Refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Threads that wait for calls: gRPC's defaults (1 to 2) make a thread end after each call
  // served while two others waited, and another start for the next: under a few busy clients
  // that was a thread per four calls. Up to 8 waiting threads stay.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 2);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 8);
  // Batches of large keys exceed gRPC's 4 MiB default.
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  impl->grpc_server = builder.BuildAndStart();
  if (impl->grpc_server == nullptr || impl->port == 0) {
    return UnavailableError("larder-master cannot listen on " + address +
                            " (port in use, or bad address)");
  }

  if (options.http_port >= 0) {
    impl->http = std::make_unique<GuardedHttpServer>();
    Impl* raw = impl.get();
    InstallHttpRoutes(
        *impl->http, *impl->state, HttpAuth{impl->sessions->enabled(), options.auth.admin_token},
        [raw] {
          return raw->election == nullptr
                     ? std::string("single")
                     : std::string(LeaderElection::RoleName(raw->election->role()));
        },
        &impl->history);
    if (options.http_port == 0) {
      impl->http_port = impl->http->BindToAnyPort(options.listen_host);
    } else {
      impl->http_port =
          impl->http->Bind(options.listen_host, options.http_port) ? options.http_port : -1;
    }
    if (impl->http_port <= 0) {
      impl->grpc_server->Shutdown();
      return UnavailableError("larder-master cannot listen for HTTP on " + options.listen_host +
                              ":" + std::to_string(options.http_port) + " (port in use?)");
    }
  }
  if (with_etcd) {
    LeaderElectionOptions election;
    election.etcd_endpoints = options.etcd_endpoints;
    election.cluster_id = options.cluster_id;
    election.advertise_address = options.advertise_address;
    if (election.advertise_address.empty()) {
      std::string host = options.listen_host;
      if (host == "0.0.0.0" || host == "::" || host.empty()) {
        host = "127.0.0.1";
        Log().warn(
            "larder-master listens on every interface but advertises {}:{} to clients through "
            "etcd: give --advertise HOST:PORT for clients on other hosts",
            host, impl->port);
      }
      election.advertise_address = host;
      election.advertise_address += ':';
      election.advertise_address += std::to_string(impl->port);
    }
    election.http_port = impl->http_port;
    election.incarnation = impl->state->incarnation();
    election.lease_ttl = options.leader_ttl;
    election.on_lost = options.on_leadership_lost;
    election.on_role_change = options.on_role_change;
    auto started = LeaderElection::Start(std::move(election));
    if (!started.ok()) {
      if (impl->http) impl->http->stop();
      impl->grpc_server->Shutdown();
      return started.status();
    }
    impl->election = std::move(started).value();
    impl->gate->Set(impl->election.get());
  }
  if (impl->http) {
    // Started after the election exists: /health reads it.
    httplib::Server* http = impl->http.get();
    std::atomic<bool>* done = &impl->http_done;
    impl->http_thread = std::thread([http, done] {
      http->listen_after_bind();
      done->store(true);
    });
    Impl* raw = impl.get();
    auto interval = std::max(options.status_interval, std::chrono::milliseconds(10));
    impl->sampler = std::thread([raw, interval] { raw->Sample(interval); });
  }
  impl->state->StartSweeper();
  if (impl->local) impl->local->Start(impl->service.get());
  Log().info("larder-master serving gRPC on {}:{}{}, HTTP on {}{}", options.listen_host, impl->port,
             options.tls_cert_file.empty() ? "" : " (TLS)", impl->http_port,
             impl->local
                 ? ", and this host's clients on the local control socket @" + impl->local->name()
                 : std::string());
  if (with_etcd) {
    std::string endpoints;
    for (const std::string& endpoint : options.etcd_endpoints) {
      if (!endpoints.empty()) endpoints += ',';
      endpoints += endpoint;
    }
    Log().info("larder-master campaigns for the leadership of cluster {} in etcd {}",
               options.cluster_id, endpoints);
  }
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

uint64_t MasterServer::local_control_calls() const {
  return impl_->local ? impl_->local->calls() : 0;
}

uint16_t MasterServer::port() const { return static_cast<uint16_t>(impl_->port); }
const std::string& MasterServer::listen_host() const { return impl_->options.listen_host; }
int MasterServer::http_port() const { return impl_->http_port; }

const GuardedHttpServer* MasterServer::http_server() const { return impl_->http.get(); }
MasterState& MasterServer::state() { return *impl_->state; }

std::string MasterServer::role() const {
  if (impl_->election == nullptr) return "single";
  return std::string(LeaderElection::RoleName(impl_->election->role()));
}

std::string MasterServer::address() const {
  std::string host = impl_->options.listen_host;
  if (host == "0.0.0.0" || host == "::" || host.empty()) host = "127.0.0.1";
  return host + ":" + std::to_string(impl_->port);
}

void MasterServer::Shutdown() {
  MutexLock lock(impl_->shutdown_mu);
  if (impl_->shut_down) return;
  impl_->shut_down = true;
  {
    MutexLock sampler_lock(impl_->sampler_mu);
    impl_->sampler_stop = true;
  }
  impl_->sampler_cv.SignalAll();
  if (impl_->sampler.joinable()) impl_->sampler.join();
  if (impl_->http) {
    // httplib's stop() does nothing before the listening thread has started, which would then
    // accept forever: wait for it to run (it starts at once) or to have ended.
    while (impl_->http_thread.joinable() && !impl_->http->is_running() &&
           !impl_->http_done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    impl_->http->stop();
    if (impl_->http_thread.joinable()) impl_->http_thread.join();
  }
  if (impl_->local) impl_->local->Stop();
  // In-flight calls get a short grace period to finish.
  impl_->grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  impl_->grpc_server->Wait();
  // Only once no call of ours is in flight: then the key goes and a standby takes over.
  if (impl_->election) impl_->election->Stop();
}

}  // namespace larder::master
