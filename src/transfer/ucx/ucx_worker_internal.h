// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The pieces of UcxWorker's state, the attach protocol's messages and small helpers, shared by
// ucx_worker.cc only. Everything here belongs to the worker thread.
#pragma once

#include <ucp/api/ucp.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/net.h"
#include "larder/status.h"
#include "transfer/ucx/ucx_worker.h"

namespace larder::transfer::ucx::internal {

// Active-message ids of the attach protocol (see the header).
constexpr unsigned kAmAttach = 41;
constexpr unsigned kAmReply = 42;
constexpr unsigned kAmRevoke = 43;
constexpr unsigned kAmAck = 44;
constexpr unsigned kAmDetach = 45;

struct AttachMsg {
  uint64_t token;
  uint64_t segment_id;
  std::array<uint8_t, 32> nonce;  // fresh per attach: what the owner's proof answers
};                                // followed (as AM data) by the initiator's worker address
struct ReplyMsg {
  uint64_t token;
  uint64_t exported;  // 1: attached; 0: the segment is not exported
  // With a cluster token: AttachProof(token, nonce, the owner's engine id, segment, exported);
  // zeros without one.
  std::array<uint8_t, 32> proof;
};

// The owner's proof in a reply: HMAC-SHA256 under the cluster token of "larder-ucx-attach-v1",
// the attach's nonce, the owner's engine id, the segment id and the answer. The initiator checks
// it against the engine id of the segment's descriptor, so a descriptor that carries another
// engine's ucx address (a token holder's alias of someone else's memory) is refused, and no one
// without the token can answer for an owner.
std::array<uint8_t, 32> AttachProof(std::string_view cluster_token,
                                    const std::array<uint8_t, 32>& nonce,
                                    std::string_view owner_engine_id, uint64_t segment_id,
                                    uint64_t exported);
struct RevokeMsg {
  uint64_t token;
  uint64_t revoke_id;
};
struct AckMsg {
  uint64_t revoke_id;
};
struct DetachMsg {
  uint64_t token;
};

// Slices issued to UCX at once; the rest wait in order. Enough to keep a 100 Gb/s link busy with
// 4 MiB slices, few enough that a dead peer does not strand thousands of requests.
constexpr size_t kMaxInflightSlices = 64;
constexpr uint64_t kMaxInflightBytes = 512ull << 20;
// After the last sign of work, the thread polls this long before it sleeps on the worker's fd:
// a completion that comes sooner is seen without a system call.
constexpr auto kSpinWindow = std::chrono::microseconds(50);
constexpr int kMaxSleepMs = 100;
// How long the slices still in flight on an endpoint may take to end once one of them passed its
// deadline, before the endpoint is force-closed (ending them all). UCX 1.13 can abort the process
// when it force-closes a tcp endpoint whose send queue holds requests (uct_tcp_ep_pending_purge,
// "Assertion `0' failed"), which under load is most endpoints: letting the slices end first makes
// the force-close the rare case of a peer that stopped answering.
constexpr auto kExpiredSliceGrace = std::chrono::seconds(1);
// UCX parses worker addresses and rkeys without being told their length; peers' bytes are
// followed by this many zeros so that a truncated one cannot make it read past our buffer.
constexpr size_t kParsePadding = 4096;

inline std::string Padded(const std::string& bytes) {
  return bytes + std::string(kParsePadding, '\0');
}

inline std::string UcsText(ucs_status_t status) { return ucs_status_string(status); }

// The last whitespace-separated token of every line of `text` that contains `marker`.
inline std::vector<std::string> TokensAfter(const std::string& text, std::string_view marker,
                                            bool last_token) {
  std::vector<std::string> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    size_t at = line.find(marker);
    if (at == std::string::npos) continue;
    std::istringstream words(line.substr(at + marker.size()));
    std::string word, pick;
    while (words >> word) {
      if (pick.empty() || last_token) pick = word;
      if (!last_token) break;
    }
    if (!pick.empty()) out.push_back(pick);
  }
  return out;
}

// What a UCX print function writes, as a string.
template <typename Fn>
inline std::string PrintToString(Fn print) {
  char* data = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&data, &size);
  if (stream == nullptr) return std::string();
  print(stream);
  std::fclose(stream);
  std::string text(data, size);
  std::free(data);
  return text;
}

struct Key;
struct Op;

// One remote worker: our endpoint to it, replaced when it fails.
struct Peer {
  std::string worker_address;  // padded
  ucp_ep_h ep = nullptr;
  uint64_t generation = 0;  // bumped with every new endpoint
  Status failure;           // why the last endpoint went
  bool lanes_logged = false;
  std::set<Key*> keys;
  size_t inflight = 0;  // slices issued on its endpoints and not yet ended
  // A slice passed its deadline in flight: the endpoint is force-closed at `close_by` unless its
  // slices have all ended by then (kExpiredSliceGrace).
  std::optional<Clock::time_point> close_by;
};

enum class KeyState { kAttaching, kReady, kRevoked };

// A remote segment opened through Attach.
struct Key {
  uint64_t token = 0;
  std::shared_ptr<Peer> peer;
  PeerName owner;
  std::string packed_rkey;  // padded
  ucp_rkey_h rkey = nullptr;
  uint64_t generation = 0;  // of the endpoint the rkey was unpacked on
  SegmentId segment_id = 0;
  uint64_t base = 0;
  uint64_t size = 0;
  KeyState state = KeyState::kAttaching;
  Status refusal;  // with kRevoked
  bool detached = false;
  std::list<Op*> waiting;                             // slices waiting for the attach reply
  uint64_t ops = 0;                                   // live ops referring to this key
  uint64_t inflight = 0;                              // of which issued to UCX
  std::vector<uint64_t> acks;                         // revocations to ack once inflight is 0
  std::shared_ptr<std::promise<Status>> attach_done;  // while Attach waits
  std::array<uint8_t, 32> nonce{};                    // of the last attach sent
};

enum class OpPlace { kNew, kWaiting, kQueued, kIssued };

struct Op {
  std::vector<Op*>* completed = nullptr;  // the worker's list of ops to finish
  Slice* slice = nullptr;
  SliceCallback* done = nullptr;
  Key* key = nullptr;
  ucp_mem_h memh = nullptr;
  OpPlace place = OpPlace::kNew;
  std::list<Op*>::iterator in_list;
  bool timed = false;
  std::multimap<Deadline, Op*>::iterator in_deadlines;
  int parts = 0;  // UCX requests not yet complete
  ucs_status_t ucs = UCS_OK;
  bool expired = false;
  bool has_final = false;
  Status final_status;
};

// One Unexport waiting for acks.
struct Revocation {
  Mutex mu;
  CondVar cv;
  size_t remaining LARDER_GUARDED_BY(mu) = 0;
};

struct Exported {
  ucp_mem_h memh = nullptr;
  std::map<uint64_t, std::shared_ptr<Peer>> attached;  // by the initiator's token
};

struct AmMessage {
  std::string header;
  std::string data;
};

}  // namespace larder::transfer::ucx::internal
