// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#include "master/sessions.h"

#include "common/engine_key.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/net.h"

namespace larder::master {
namespace {

uint64_t RandomId() {
  uint64_t id = 0;
  while (id == 0) RandomBytes(reinterpret_cast<uint8_t*>(&id), sizeof(id));
  return id;
}

}  // namespace

SessionTable::SessionTable(AuthOptions options) : options_(std::move(options)) {}

std::string SessionTable::NewChallenge() {
  std::string nonce(control_auth::kNonceBytes, '\0');
  RandomBytes(reinterpret_cast<uint8_t*>(nonce.data()), nonce.size());
  Clock::time_point now = options_.clock();
  MutexLock lock(challenges_mu_);
  ForgetChallengesLocked(now);
  while (challenge_order_.size() >= options_.max_challenges) {
    challenges_.erase(challenge_order_.front());
    challenge_order_.pop_front();
  }
  challenges_.emplace(nonce, now + options_.challenge_ttl);
  challenge_order_.push_back(nonce);
  return nonce;
}

void SessionTable::ForgetChallengesLocked(Clock::time_point now) {
  while (!challenge_order_.empty()) {
    auto it = challenges_.find(challenge_order_.front());
    if (it != challenges_.end() && it->second > now) break;
    if (it != challenges_.end()) challenges_.erase(it);
    challenge_order_.pop_front();
  }
}

Result<SessionTable::Opened> SessionTable::Open(std::string_view client_id,
                                                std::string_view client_nonce,
                                                std::string_view server_nonce,
                                                std::string_view proof,
                                                std::string_view admin_proof, EngineProof engine) {
  if (!enabled()) return FailedPreconditionError("this master has no cluster token");
  if (client_id.empty() || client_id.size() > kMaxClientIdBytes) {
    return InvalidArgumentError("client id must have 1.." + std::to_string(kMaxClientIdBytes) +
                                " bytes");
  }
  if (client_nonce.size() != control_auth::kNonceBytes ||
      server_nonce.size() != control_auth::kNonceBytes) {
    return InvalidArgumentError("nonces must have 32 bytes");
  }
  {
    // A challenge is good for one attempt, right or wrong.
    MutexLock lock(challenges_mu_);
    auto it = challenges_.find(std::string(server_nonce));
    if (it == challenges_.end() || it->second <= options_.clock()) {
      return UnauthenticatedError("unknown or expired challenge; ask for a new one");
    }
    challenges_.erase(it);
  }
  if (!control_auth::Equal(
          control_auth::ClientProof(options_.cluster_token, client_id, client_nonce, server_nonce),
          proof)) {
    Log().warn("OpenSession for client {}: wrong cluster token", client_id.substr(0, 64));
    return UnauthenticatedError("wrong cluster token");
  }
  bool admin = false;
  if (!admin_proof.empty()) {
    if (!has_admin_token() ||
        !control_auth::Equal(
            control_auth::AdminProof(options_.admin_token, client_id, client_nonce, server_nonce),
            admin_proof)) {
      Log().warn("OpenSession for client {}: wrong admin token", client_id.substr(0, 64));
      return UnauthenticatedError(has_admin_token() ? "wrong admin token"
                                                    : "this master has no admin token");
    }
    admin = true;
  }
  if (std::string_view claimed = ClaimedFingerprint(client_id); !claimed.empty()) {
    // An engine's id: only the engine that holds the key it names may act for it.
    if (EngineKeyFingerprint(engine.key) != claimed ||
        !VerifyEngineSignature(engine.key,
                               control_auth::IdentityMessage(client_id, client_nonce, server_nonce),
                               engine.signature)) {
      Log().warn("OpenSession for client {}: no proof of that engine's key",
                 client_id.substr(0, 128));
      return PermissionDeniedError(
          "client id '" + std::string(client_id.substr(0, 128)) +
          "' names an engine by its key's fingerprint, and the session was not opened with that "
          "key: a client acts only under its own engine's id");
    }
  }
  auto session = std::make_shared<Session>();
  session->client_id = std::string(client_id);
  session->admin = admin;
  {
    MutexLock session_lock(session->mu);  // not shared yet; the lock is for the analysis
    session->last_used = options_.clock();
  }
  uint64_t id = RandomId();
  WriterLock lock(mu_);
  auto existing = by_client_.find(session->client_id);
  if (existing != by_client_.end()) {
    auto old = sessions_.find(existing->second);
    if (old != sessions_.end()) {
      MutexLock old_lock(old->second->mu);
      // A session no call used yet is one whose reply its client never got: replace it. One in
      // use belongs to a live client, whose id nobody else may take over.
      if (old->second->used) {
        return PermissionDeniedError("client id '" + session->client_id.substr(0, 64) +
                                     "' has a session in use");
      }
    }
    if (old != sessions_.end()) sessions_.erase(old);
    by_client_.erase(existing);
  }
  if (sessions_.size() >= options_.max_sessions) CloseIdleLocked(options_.clock());
  if (sessions_.size() >= options_.max_sessions) {
    return ResourceExhaustedError("too many sessions (" + std::to_string(sessions_.size()) + ")");
  }
  while (sessions_.contains(id)) id = RandomId();
  session->key =
      control_auth::SessionKey(options_.cluster_token, client_id, client_nonce, server_nonce, id);
  sessions_.emplace(id, session);
  by_client_.emplace(session->client_id, id);
  Opened opened;
  opened.session_id = id;
  opened.admin = admin;
  opened.proof = control_auth::ServerProof(options_.cluster_token, client_id, client_nonce,
                                           server_nonce, id, admin);
  return opened;
}

Result<CallIdentity> SessionTable::Verify(std::string_view metadata, std::string_view method,
                                          const std::function<control_auth::Digest()>& body_hash) {
  uint64_t session_id = 0, sequence = 0;
  control_auth::Digest mac{};
  if (metadata.empty()) {
    return UnauthenticatedError(
        "this master requires the cluster token: set LARDER_AUTH_TOKEN (see docs/security.md)");
  }
  if (!control_auth::DecodeMetadata(metadata, &session_id, &sequence, &mac) || sequence == 0) {
    return UnauthenticatedError("malformed authentication metadata");
  }
  LARDER_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Find(session_id));
  control_auth::Digest expected =
      control_auth::CallMac(session->key, method, sequence, body_hash());
  if (!DigestEqual(expected.data(), mac.data())) {
    return UnauthenticatedError("wrong proof for " + std::string(method));
  }
  MutexLock lock(session->mu);
  if (sequence > session->max_sequence) {
    uint64_t shift = sequence - session->max_sequence;
    session->window = shift >= kWindow ? std::bitset<kWindow>() : session->window << shift;
    session->window.set(0);
    session->max_sequence = sequence;
  } else {
    uint64_t age = session->max_sequence - sequence;
    if (age >= kWindow || session->window.test(age)) {
      return UnauthenticatedError("replayed or stale call (sequence " + std::to_string(sequence) +
                                  ")");
    }
    session->window.set(age);
  }
  return UseLocked(*session, session_id);
}

Result<CallIdentity> SessionTable::Bound(uint64_t session_id) {
  LARDER_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Find(session_id));
  MutexLock lock(session->mu);
  return UseLocked(*session, session_id);
}

Result<std::shared_ptr<SessionTable::Session>> SessionTable::Find(uint64_t session_id) const {
  ReaderLock lock(mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return UnauthenticatedError("unknown session (the master restarted, or the session expired)")
        .WithDetail(ErrorDetail::kUnknownSession);
  }
  return it->second;
}

CallIdentity SessionTable::UseLocked(Session& session, uint64_t session_id) {
  session.used = true;
  session.last_used = options_.clock();
  return CallIdentity{session.client_id, session.admin, session_id};
}

void SessionTable::CloseClient(std::string_view client_id) {
  WriterLock lock(mu_);
  auto it = by_client_.find(std::string(client_id));
  if (it == by_client_.end()) return;
  sessions_.erase(it->second);
  by_client_.erase(it);
}

void SessionTable::ExpireIdle() {
  Clock::time_point now = options_.clock();
  {
    MutexLock lock(challenges_mu_);
    ForgetChallengesLocked(now);
  }
  WriterLock lock(mu_);
  CloseIdleLocked(now);
}

void SessionTable::CloseIdleLocked(Clock::time_point now) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    bool idle;
    {
      MutexLock session_lock(it->second->mu);
      idle = now - it->second->last_used > options_.session_idle_ttl;
    }
    if (idle) {
      by_client_.erase(it->second->client_id);
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t SessionTable::size() const {
  ReaderLock lock(mu_);
  return sessions_.size();
}

}  // namespace larder::master
