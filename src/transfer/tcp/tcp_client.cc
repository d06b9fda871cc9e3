// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "transfer/tcp/tcp_client.h"

#include <sys/socket.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "transfer/tcp/tcp_auth.h"
#include "transfer/tcp/tcp_frame.h"

namespace larder::transfer::tcp {
namespace {

constexpr size_t kPipelineDepth = 16;
constexpr uint64_t kPipelineBytes = 32ULL << 20;
constexpr auto kConnectTimeout = std::chrono::seconds(5);
constexpr auto kBackoffBase = std::chrono::milliseconds(100);
constexpr auto kBackoffMax = std::chrono::milliseconds(5000);

Status SendFrame(TcpStream& stream, const FrameHeader& h, const void* payload, size_t len,
                 Deadline deadline) {
  uint8_t header[kFrameHeaderSize];
  EncodeHeader(h, header);
  iovec iov[2] = {{header, sizeof(header)}, {const_cast<void*>(payload), len}};
  return stream.SendAllV(iov, len ? 2 : 1, deadline);
}

Status RecvHeader(TcpStream& stream, FrameHeader* h, Deadline deadline) {
  uint8_t raw[kFrameHeaderSize];
  LARDER_RETURN_IF_ERROR(stream.RecvAll(raw, sizeof(raw), deadline));
  Status s = DecodeHeader(raw, h);
  if (!s.ok()) {
    return DataLossError("peer " + stream.peer() + " sent a malformed frame: " + s.message());
  }
  return Status();
}

// Reads the message of an error frame into `reported` (the error the peer sent; the stream is
// still in sync). Returns the stream's status: not OK when the connection broke meanwhile.
Status ReadErrorFrame(TcpStream& stream, const FrameHeader& h, Deadline deadline,
                      Status* reported) {
  if (h.length > kMaxControlPayload) {
    return DataLossError("oversized error frame from " + stream.peer());
  }
  std::string message(h.length, '\0');
  LARDER_RETURN_IF_ERROR(stream.RecvAll(message.data(), message.size(), deadline));
  *reported = ErrorFrameStatus(h.code, "peer " + stream.peer() + ": " + message);
  return Status();
}

// The error frame's Status, or the stream's when it broke: for exchanges that end either way.
Status RecvErrorFrame(TcpStream& stream, const FrameHeader& h, Deadline deadline) {
  Status reported;
  Status broken = ReadErrorFrame(stream, h, deadline, &reported);
  return broken.ok() ? reported : broken;
}

// Reads the payload of a hello or auth-ok frame (at most kMaxAuthPayload bytes).
Result<std::string> RecvAuthPayload(TcpStream& stream, const FrameHeader& h, Deadline deadline) {
  if (h.length > kMaxAuthPayload) {
    return DataLossError("peer " + stream.peer() + " sent a " + std::to_string(h.length) +
                         "-byte handshake payload (at most " + std::to_string(kMaxAuthPayload) +
                         ")");
  }
  std::string payload(h.length, '\0');
  LARDER_RETURN_IF_ERROR(stream.RecvAll(payload.data(), payload.size(), deadline));
  return payload;
}

// The mutual proof on a connection whose hello asked for one (tcp_frame.h, step 3).
Status ProveToken(TcpStream& stream, const TcpClientConfig& config, const std::string& hello,
                  const std::string& dialed, Deadline deadline) {
  const std::string& peer = stream.peer();
  TcpAuthBinding binding;
  if (Status s = DecodeHello(hello, &binding.server_nonce, &binding.server_engine_id); !s.ok()) {
    return DataLossError("bad hello from peer " + peer + ": " + s.message());
  }
  if (config.token.empty()) {
    return PermissionDeniedError("peer " + peer +
                                 " requires a cluster token and none is configured");
  }
  AuthRequest request;
  RandomBytes(request.client_nonce.data(), request.client_nonce.size());
  request.client_engine_id = config.engine_id;
  request.dialed_endpoint = dialed;
  binding.client_nonce = request.client_nonce;
  binding.dialed_endpoint = dialed;
  binding.client_engine_id = config.engine_id;
  if (stream.tls()) {
    LARDER_ASSIGN_OR_RETURN(auto channel, stream.ChannelBinding());
    binding.channel_binding.assign(channel.begin(), channel.end());
  }
  request.mac = TcpClientMac(config.token, binding);
  std::string payload = EncodeAuth(request);
  FrameHeader auth;
  auth.type = FrameType::kAuth;
  auth.length = payload.size();
  LARDER_RETURN_IF_ERROR(SendFrame(stream, auth, payload.data(), payload.size(), deadline));

  FrameHeader reply;
  LARDER_RETURN_IF_ERROR(RecvHeader(stream, &reply, deadline));
  if (reply.type == FrameType::kError) return RecvErrorFrame(stream, reply, deadline);
  if (reply.type != FrameType::kAuthOk) return DataLossError("bad auth reply from " + peer);
  LARDER_ASSIGN_OR_RETURN(std::string ok_payload, RecvAuthPayload(stream, reply, deadline));
  AuthMac server_mac;
  if (Status s = DecodeAuthOk(ok_payload, &server_mac); !s.ok()) {
    return PermissionDeniedError("peer " + peer +
                                 " did not prove the cluster token: " + s.message());
  }
  auto expected = TcpServerMac(config.token, binding);
  if (!DigestEqual(expected.data(), server_mac.data())) {
    return PermissionDeniedError("peer " + peer + " (claiming engine " + binding.server_engine_id +
                                 ") failed to prove the cluster token: wrong token, or not the "
                                 "engine this connection reached");
  }
  return Status();
}

Status NotSentInTime(const std::string& peer) {
  return DeadlineExceededError("deadline passed before sending to peer " + peer);
}

}  // namespace

Result<std::shared_ptr<const TcpClientConfig>> TcpClientConfig::FromContext(
    const EngineContext& context) {
  auto config = std::make_shared<TcpClientConfig>();
  config->engine_id = context.engine_id;
  config->token = context.auth_token;
  if (!context.tls_ca_file.empty()) {
    LARDER_ASSIGN_OR_RETURN(config->tls, TlsContext::ForClient(context.tls_ca_file));
  }
  return std::shared_ptr<const TcpClientConfig>(std::move(config));
}

Result<TcpStream> ConnectAndAuthenticate(const HostPort& address, const TcpClientConfig& config,
                                         Deadline deadline) {
  std::string peer = address.ToString();
  auto conn = TcpConnect(address, deadline);
  if (!conn.ok()) {
    return Status(conn.status().code() == StatusCode::kDeadlineExceeded
                      ? StatusCode::kDeadlineExceeded
                      : StatusCode::kUnavailable,
                  "peer " + peer + " unreachable: " + conn.status().message());
  }
  // What the proof names as the endpoint this connection reached: the address actually connected
  // to, in the form the server compares with ("localhost" resolved).
  LARDER_ASSIGN_OR_RETURN(std::string dialed, SocketEndpoint(conn->get(), /*local=*/false));
  TcpStream stream(std::move(conn).value(), peer);
  FrameHeader hello;
  LARDER_RETURN_IF_ERROR(RecvHeader(stream, &hello, deadline));
  if (hello.type == FrameType::kError) return RecvErrorFrame(stream, hello, deadline);
  if (hello.type != FrameType::kHello) return DataLossError("peer " + peer + " did not greet");
  if ((hello.flags & ~(kFlagNeedAuth | kFlagTls)) != 0) {
    return DataLossError("hello from peer " + peer + " has unknown flags " +
                         std::to_string(hello.flags));
  }
  LARDER_ASSIGN_OR_RETURN(std::string payload, RecvAuthPayload(stream, hello, deadline));
  const bool need_auth = (hello.flags & kFlagNeedAuth) != 0;
  if (!need_auth && !payload.empty()) return DataLossError("bad hello from " + peer);

  if ((hello.flags & kFlagTls) != 0) {
    if (!config.tls) {
      return PermissionDeniedError("peer " + peer +
                                   " requires TLS; set LARDER_TLS_CA (or tls_ca_file) to the CA "
                                   "of the cluster's certificates");
    }
    LARDER_RETURN_IF_ERROR(stream.StartTls(*config.tls, deadline));
  } else if (config.tls) {
    return PermissionDeniedError("peer " + peer +
                                 " does not offer TLS, and this engine requires it (a CA is "
                                 "configured: LARDER_TLS_CA / tls_ca_file)");
  }
  if (need_auth) {
    LARDER_RETURN_IF_ERROR(ProveToken(stream, config, payload, dialed, deadline));
  } else if (!config.token.empty()) {
    // A server without the token could be anyone: it would capture our writes and answer our
    // reads with bytes of its choosing.
    return PermissionDeniedError("peer " + peer +
                                 " does not prove the cluster token (its hello asks for no "
                                 "proof); refusing it as a data server");
  }
  return stream;
}

Result<std::vector<SegmentDescriptor>> FetchDescriptors(const HostPort& address,
                                                        const TcpClientConfig& config,
                                                        Deadline deadline) {
  std::string peer = address.ToString();
  LARDER_ASSIGN_OR_RETURN(TcpStream stream, ConnectAndAuthenticate(address, config, deadline));
  FrameHeader ask;
  ask.type = FrameType::kDescribe;
  LARDER_RETURN_IF_ERROR(SendFrame(stream, ask, nullptr, 0, deadline));
  FrameHeader reply;
  LARDER_RETURN_IF_ERROR(RecvHeader(stream, &reply, deadline));
  if (reply.type == FrameType::kError) return RecvErrorFrame(stream, reply, deadline);
  if (reply.type != FrameType::kDescribeReply || reply.length > kMaxControlPayload) {
    return DataLossError("bad describe reply from " + peer);
  }
  std::string body(reply.length, '\0');
  LARDER_RETURN_IF_ERROR(stream.RecvAll(body.data(), body.size(), deadline));
  auto list = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!list.is_array()) return DataLossError("describe reply from " + peer + " is not a list");
  std::vector<SegmentDescriptor> out;
  for (const auto& item : list) {
    LARDER_ASSIGN_OR_RETURN(SegmentDescriptor d, SegmentDescriptor::FromJson(item.dump()));
    out.push_back(std::move(d));
  }
  return out;
}

Result<std::vector<SegmentDescriptor>> FetchDescriptors(const HostPort& address,
                                                        const EngineContext& context,
                                                        Deadline deadline) {
  LARDER_ASSIGN_OR_RETURN(auto config, TcpClientConfig::FromContext(context));
  return FetchDescriptors(address, *config, deadline);
}

TcpPeer::TcpPeer(HostPort address, std::shared_ptr<const TcpClientConfig> config,
                 size_t connections)
    : address_(std::move(address)),
      config_(std::move(config)),
      name_(address_.ToString()),
      connections_(std::max<size_t>(1, connections)) {}

TcpPeer::~TcpPeer() { Stop(); }

void TcpPeer::Enqueue(uint64_t segment_id, std::span<Slice* const> slices, SliceCallback* done) {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      for (Slice* s : slices) queue_.push_back({s, segment_id, done});
      while (workers_.size() < connections_) workers_.emplace_back([this] { Worker(); });
      cv_.notify_all();
      return;
    }
  }
  for (Slice* s : slices) done->OnSliceDone(s, CancelledError("engine is shutting down"));
}

void TcpPeer::Stop() {
  std::vector<std::thread> workers;
  std::deque<Job> orphans;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    workers.swap(workers_);
    orphans.swap(queue_);
  }
  cv_.notify_all();
  for (auto& j : orphans) j.done->OnSliceDone(j.slice, CancelledError("engine is shutting down"));
  for (auto& t : workers) t.join();
}

Status TcpPeer::CheckBackoff() {
  std::lock_guard lock(mu_);
  if (failures_ > 0 && Clock::now() < retry_after_) {
    // A refusal (token, TLS, certificate) does not go away by retrying: it keeps its code.
    StatusCode code = last_failure_.code() == StatusCode::kPermissionDenied
                          ? StatusCode::kPermissionDenied
                          : StatusCode::kUnavailable;
    return Status(code, "peer " + name_ + " is backed off after " + std::to_string(failures_) +
                            " failed attempt(s); last: " + last_failure_.ToString());
  }
  return Status();
}

void TcpPeer::RecordFailure(const Status& status) {
  std::lock_guard lock(mu_);
  ++failures_;
  auto backoff = kBackoffBase * (1 << std::min(failures_ - 1, 6));
  retry_after_ = Clock::now() + std::min<Clock::duration>(backoff, kBackoffMax);
  last_failure_ = status;
  if (failures_ == 1) Log().warn("tcp peer {} failed: {}", name_, status.ToString());
}

void TcpPeer::RecordSuccess() {
  std::lock_guard lock(mu_);
  failures_ = 0;
}

void TcpPeer::Worker() {
  TcpStream conn;
  std::vector<Job> jobs;
  for (;;) {
    jobs.clear();
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      uint64_t bytes = 0;
      bool window_has_read = false;
      while (!queue_.empty() && jobs.size() < kPipelineDepth && bytes < kPipelineBytes) {
        // Replies are only read once the whole window is sent. A write behind a read would let
        // the peer block sending the read's reply while we block sending the write's payload, a
        // deadlock as soon as both exceed the socket buffers; such a write waits for the next
        // window. (Reads behind writes are fine: read requests are headers only.)
        bool is_read = queue_.front().slice->op == TransferOp::kRead;
        if (window_has_read && !is_read) break;
        window_has_read |= is_read;
        bytes += queue_.front().slice->length;
        jobs.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    RunJobs(&conn, jobs);
  }
}

void TcpPeer::RunJobs(TcpStream* conn, std::vector<Job>& jobs) {
  auto fail_from = [&](size_t first, const Status& status) {
    for (size_t i = first; i < jobs.size(); ++i) jobs[i].done->OnSliceDone(jobs[i].slice, status);
  };
  if (!conn->valid()) {
    if (Status s = CheckBackoff(); !s.ok()) return fail_from(0, s);
    Deadline deadline = Clock::now() + kConnectTimeout;
    for (const Job& j : jobs) deadline = std::min(deadline, j.slice->deadline);
    auto connected = ConnectAndAuthenticate(address_, *config_, deadline);
    if (!connected.ok()) {
      RecordFailure(connected.status());
      return fail_from(0, connected.status());
    }
    RecordSuccess();
    *conn = std::move(connected).value();
  }
  TcpStream& stream = *conn;
  Deadline now = Clock::now();
  // Send phase: every request of the window goes out before any reply is read.
  std::vector<bool> sent(jobs.size(), false);
  for (size_t i = 0; i < jobs.size(); ++i) {
    Slice* s = jobs[i].slice;
    if (now >= s->deadline) continue;
    FrameHeader h;
    h.type = s->op == TransferOp::kRead ? FrameType::kRead : FrameType::kWrite;
    h.request_id = i;
    h.segment_id = jobs[i].segment_id;
    h.offset = s->offset;
    h.length = s->length;
    Status st =
        SendFrame(stream, h, s->local, s->op == TransferOp::kWrite ? s->length : 0, s->deadline);
    if (!st.ok()) {
      conn->Reset();
      RecordFailure(st);
      // Replies to what was sent can no longer be read; everything in the window fails.
      for (size_t k = 0; k < jobs.size(); ++k) {
        Status fail = (k < i && !sent[k]) ? NotSentInTime(name_) : st;
        jobs[k].done->OnSliceDone(jobs[k].slice, fail);
      }
      return;
    }
    sent[i] = true;
  }
  // Receive phase: replies arrive in request order.
  for (size_t i = 0; i < jobs.size(); ++i) {
    Slice* s = jobs[i].slice;
    if (!sent[i]) {
      jobs[i].done->OnSliceDone(s, NotSentInTime(name_));
      continue;
    }
    FrameHeader h;
    Status st = RecvHeader(stream, &h, s->deadline);
    if (st.ok() && h.request_id != i) {
      st = DataLossError("peer " + name_ + " answered out of order");
    }
    if (st.ok()) {
      switch (h.type) {
        case FrameType::kError: {
          Status reported;
          st = ReadErrorFrame(stream, h, s->deadline, &reported);
          if (st.ok()) {
            // The stream is still in sync after an error frame: only this request failed.
            jobs[i].done->OnSliceDone(s, reported);
            continue;
          }
          break;
        }
        case FrameType::kReadReply:
          if (s->op != TransferOp::kRead || h.length != s->length) {
            st = DataLossError("peer " + name_ + " sent a read reply of the wrong size");
          } else {
            st = stream.RecvAll(s->local, s->length, s->deadline);
          }
          break;
        case FrameType::kWriteReply:
          if (s->op != TransferOp::kWrite || h.length != 0) {
            st = DataLossError("peer " + name_ + " sent an unexpected write reply");
          }
          break;
        default:
          st = DataLossError("peer " + name_ + " sent an unexpected frame");
      }
    }
    if (!st.ok()) {
      // The stream is out of sync (or gone): drop the connection and fail the rest of the window.
      conn->Reset();
      if (st.code() != StatusCode::kDeadlineExceeded) RecordFailure(st);
      for (size_t k = i; k < jobs.size(); ++k) {
        jobs[k].done->OnSliceDone(jobs[k].slice, k == i || sent[k] ? st : NotSentInTime(name_));
      }
      return;
    }
    jobs[i].done->OnSliceDone(s, Status());
  }
}

}  // namespace larder::transfer::tcp
