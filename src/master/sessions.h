// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
#pragma once

// The control plane's sessions (proto/master.proto, "authentication"; src/common/control_auth.h
// for the proofs): challenges handed out, sessions opened with a proof of the cluster token, and
// the check of every call's proof.

#include <bitset>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/control_auth.h"
#include "common/mutex.h"
#include "larder/status.h"
#include "master/types.h"

namespace larder::master {

struct AuthOptions {
  // Empty: no authentication (every call is served; the master then listens on loopback only
  // unless started --insecure).
  std::string cluster_token;
  // Proven at OpenSession for an operator session (RemoveAll, /keys, /segments). Empty: no
  // operator sessions, and those operations are refused while a cluster token is set.
  std::string admin_token;
  // A session not used for this long is closed when room is needed for a new one (or by
  // ExpireIdle); its client then opens a new one.
  std::chrono::milliseconds session_idle_ttl{std::chrono::minutes(2)};
  size_t max_sessions = 65536;
  // Challenges handed out and not yet used (the oldest is dropped when more are asked for).
  size_t max_challenges = 4096;
  std::chrono::milliseconds challenge_ttl{std::chrono::seconds(30)};
  // Clients are offered to carry a call's proof after its request's bytes (ChallengeReply's
  // proof_in_body). False: the master takes proofs in metadata only, as one of an older version
  // does (for the tests of clients that talk to such a master).
  bool offer_proof_in_body = true;
  std::function<Clock::time_point()> clock = [] { return Clock::now(); };
};

// Who a call acts for, once its proof checked.
struct CallIdentity {
  std::string client_id;
  bool admin = false;
  uint64_t session_id = 0;
};

// Longest client id a session may be opened for.
inline constexpr size_t kMaxClientIdBytes = 256;

// Thread-safe.
class SessionTable {
 public:
  explicit SessionTable(AuthOptions options);

  bool enabled() const { return !options_.cluster_token.empty(); }
  bool has_admin_token() const { return !options_.admin_token.empty(); }
  bool offers_proof_in_body() const { return options_.offer_proof_in_body; }

  // A fresh 32-byte nonce that one OpenSession may use within the challenge TTL.
  std::string NewChallenge();

  struct Opened {
    uint64_t session_id = 0;
    control_auth::Digest proof{};  // ServerProof
    bool admin = false;
  };
  // The proof that an engine opens the session for its own id: its public key and signature.
  struct EngineProof {
    std::string_view key;
    std::string_view signature;
  };
  // Opens a session for `client_id`. Errors: Unauthenticated (unknown or reused challenge, wrong
  // proof of either token), InvalidArgument (malformed fields), PermissionDenied (an id of the
  // engine form without that engine's proof; the client id has a session in use already: nobody
  // takes over another client's id), ResourceExhausted.
  Result<Opened> Open(std::string_view client_id, std::string_view client_nonce,
                      std::string_view server_nonce, std::string_view proof,
                      std::string_view admin_proof, EngineProof engine = {});

  // Checks a call's proof (`metadata`: the value of its `larder-auth-bin` metadata entry or of the
  // trailer after its request's bytes, control_auth.h) against the method and the request.
  // Errors: Unauthenticated (missing or malformed proof, wrong mac, replayed sequence number; an
  // unknown session has the detail ErrorDetail::kUnknownSession).
  // `body_hash` hashes the request as it was sent (control_auth::BodyHash); it is called only once
  // the metadata names a known session, so a caller without one costs no work proportional to its
  // request.
  Result<CallIdentity> Verify(std::string_view metadata, std::string_view method,
                              const std::function<control_auth::Digest()>& body_hash);

  // Who a call acts for on a connection of the local control socket that a proof checked by
  // Verify bound to `session_id` (common/local_control.h: no other process can write on it), as
  // long as the session is open. Errors: Unauthenticated, with the detail
  // ErrorDetail::kUnknownSession, once it is closed.
  Result<CallIdentity> Bound(uint64_t session_id);

  // Closes the sessions of a client that left.
  void CloseClient(std::string_view client_id);
  // Closes sessions idle past the TTL and forgets expired challenges.
  void ExpireIdle();
  size_t size() const;

 private:
  struct Session {
    std::string client_id;
    std::string key;
    bool admin = false;
    Mutex mu;
    Clock::time_point last_used LARDER_GUARDED_BY(mu);
    bool used LARDER_GUARDED_BY(mu) = false;  // a call checked on it
    uint64_t max_sequence LARDER_GUARDED_BY(mu) = 0;
    std::bitset<1024> window LARDER_GUARDED_BY(mu);  // bit i = max_sequence - i was seen
  };
  static constexpr uint64_t kWindow = 1024;

  // The open session `session_id`; Unauthenticated with kUnknownSession when there is none.
  Result<std::shared_ptr<Session>> Find(uint64_t session_id) const;
  // Marks a call checked on `session` (its mu held) and says who it acts for.
  CallIdentity UseLocked(Session& session, uint64_t session_id) LARDER_REQUIRES(session.mu);
  void ForgetChallengesLocked(Clock::time_point now) LARDER_REQUIRES(challenges_mu_);
  void CloseIdleLocked(Clock::time_point now) LARDER_REQUIRES(mu_);

  AuthOptions options_;
  mutable SharedMutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Session>> sessions_ LARDER_GUARDED_BY(mu_);
  std::unordered_map<std::string, uint64_t> by_client_ LARDER_GUARDED_BY(mu_);
  Mutex challenges_mu_;
  std::unordered_map<std::string, Clock::time_point> challenges_ LARDER_GUARDED_BY(challenges_mu_);
  std::deque<std::string> challenge_order_ LARDER_GUARDED_BY(challenges_mu_);
};

}  // namespace larder::master
