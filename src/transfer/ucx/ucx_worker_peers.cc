// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
// UcxWorker::Impl: peers and their endpoints, the attach protocol over active messages (attach,
// reply, revoke, ack, detach), and the remote keys it grants and revokes.

#include "common/logging.h"
#include "transfer/ucx/ucx_worker_impl.h"

namespace larder::transfer::ucx {

using namespace internal;  // NOLINT: this file implements them

std::shared_ptr<Peer> UcxWorker::Impl::PeerFor(const std::string& worker_address) {
  std::string padded = Padded(worker_address);
  auto& peer = peers[padded];
  if (!peer) {
    peer = std::make_shared<Peer>();
    peer->worker_address = std::move(padded);
  }
  return peer;
}

void UcxWorker::Impl::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* impl = static_cast<Impl*>(arg);
  auto it = impl->by_ep.find(ep);
  if (it == impl->by_ep.end()) return;
  impl->CloseEndpoint(it->second, UnavailableError("ucx endpoint failed: " + UcsText(status)));
}

Status UcxWorker::Impl::Connect(Peer* peer) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peer->worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Impl::OnEndpointError;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  ucs_status_t status = ucp_ep_create(worker, &params, &ep);
  if (status != UCS_OK) {
    peer->failure = UnavailableError("ucx cannot create an endpoint: " + UcsText(status));
    return peer->failure;
  }
  peer->ep = ep;
  ++peer->generation;
  by_ep[ep] = peer;
  return Status();
}

void UcxWorker::Impl::CloseEndpoint(Peer* peer, Status why) {
  if (peer->ep == nullptr) return;
  ucp_ep_h ep = peer->ep;
  peer->ep = nullptr;
  peer->failure = why;
  by_ep.erase(ep);
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &params);
  if (UCS_PTR_IS_PTR(request)) ucp_request_free(request);
  for (Key* key : peer->keys) {
    if (key->state != KeyState::kAttaching) continue;
    Status failed =
        why.WithContext("segment '" + key->owner.segment + "' of " + key->owner.ToString());
    FailWaiting(key, failed);
    SettleAttach(key, failed);
  }
}

void UcxWorker::Impl::LogLanes(Peer* peer, const PeerName& owner) {
  peer->lanes_logged = true;
  std::string text = PrintToString([&](FILE* f) { ucp_ep_print_info(peer->ep, f); });
  std::string lanes;
  std::set<std::string> seen;
  for (std::string lane : TokensAfter(text, "]:", false)) {
    if (size_t colon = lane.find(':'); colon != std::string::npos) lane = lane.substr(colon + 1);
    if (seen.insert(lane).second) lanes += (lanes.empty() ? "" : " ") + lane;
  }
  Log().info("ucx endpoint to {}: transports [{}]", owner.ToString(), lanes);
}

void UcxWorker::Impl::OnAmSent(void* request, ucs_status_t, void* user_data) {
  delete static_cast<AmMessage*>(user_data);
  ucp_request_free(request);
}

bool UcxWorker::Impl::SendAm(ucp_ep_h ep, unsigned id, std::string header, std::string data,
                             bool reply) {
  if (ep == nullptr) return false;
  auto* message = new AmMessage{std::move(header), std::move(data)};
  ucp_request_param_t params{};
  params.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = reply ? UCP_AM_SEND_FLAG_REPLY : 0;
  params.cb.send = &Impl::OnAmSent;
  params.user_data = message;
  ucs_status_ptr_t request = ucp_am_send_nbx(ep, id, message->header.data(), message->header.size(),
                                             message->data.empty() ? nullptr : message->data.data(),
                                             message->data.size(), &params);
  if (UCS_PTR_IS_PTR(request)) return true;
  delete message;
  return !UCS_PTR_IS_ERR(request);
}

ucs_status_t UcxWorker::Impl::OnAttach(void* arg, const void* header, size_t header_length,
                                       void* data, size_t length,
                                       const ucp_am_recv_param_t* param) {
  auto* impl = static_cast<Impl*>(arg);
  AttachMsg msg;
  if (!Read(header, header_length, &msg) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
      !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || length == 0 ||
      length > kMaxWorkerAddressBytes) {
    return UCS_OK;
  }
  auto it = impl->exports.find(msg.segment_id);
  ReplyMsg reply{msg.token, it == impl->exports.end() ? 0u : 1u, {}};
  if (!impl->cluster_token.empty()) {
    reply.proof = AttachProof(impl->cluster_token, msg.nonce, impl->engine_id, msg.segment_id,
                              reply.exported);
  }
  if (it != impl->exports.end()) {
    it->second.attached[msg.token] =
        impl->PeerFor(std::string(static_cast<const char*>(data), length));
  }
  impl->SendAm(param->reply_ep, kAmReply, Bytes(reply), std::string(), false);
  return UCS_OK;
}

ucs_status_t UcxWorker::Impl::OnReply(void* arg, const void* header, size_t header_length, void*,
                                      size_t, const ucp_am_recv_param_t*) {
  auto* impl = static_cast<Impl*>(arg);
  ReplyMsg msg;
  if (!Read(header, header_length, &msg)) return UCS_OK;
  auto it = impl->keys.find(msg.token);
  if (it == impl->keys.end() || it->second->state != KeyState::kAttaching) return UCS_OK;
  Key* key = it->second.get();
  if (!impl->cluster_token.empty()) {
    const std::array<uint8_t, 32> expected = AttachProof(
        impl->cluster_token, key->nonce, key->owner.engine_id, key->segment_id, msg.exported);
    if (!DigestEqual(expected.data(), msg.proof.data())) {
      impl->Revoke(key, PermissionDeniedError(
                            "the ucx worker at the address of segment '" + key->owner.segment +
                            "' did not prove it is " + key->owner.ToString() +
                            ": the descriptor points at another engine's memory, or the peer "
                            "lacks the cluster token"));
      return UCS_OK;
    }
  }
  if (msg.exported == 1) {
    key->state = KeyState::kReady;
    for (Op* op : key->waiting) {
      op->place = OpPlace::kQueued;
      op->in_list = impl->queued.insert(impl->queued.end(), op);
    }
    key->waiting.clear();
    impl->SettleAttach(key, Status());
  } else {
    impl->Revoke(key, NotFoundError("segment '" + key->owner.segment + "' is not exported by " +
                                    key->owner.ToString() + " any more"));
  }
  return UCS_OK;
}

ucs_status_t UcxWorker::Impl::OnRevoke(void* arg, const void* header, size_t header_length, void*,
                                       size_t, const ucp_am_recv_param_t* param) {
  auto* impl = static_cast<Impl*>(arg);
  RevokeMsg msg;
  if (!Read(header, header_length, &msg)) return UCS_OK;
  auto it = impl->keys.find(msg.token);
  if (it != impl->keys.end()) {
    Key* key = it->second.get();
    impl->Revoke(key, NotFoundError("segment '" + key->owner.segment + "' was unregistered by " +
                                    key->owner.ToString()));
    if (key->inflight > 0) {
      key->acks.push_back(msg.revoke_id);
      return UCS_OK;
    }
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
    impl->SendAm(param->reply_ep, kAmAck, Bytes(AckMsg{msg.revoke_id}), std::string(), false);
  }
  return UCS_OK;
}

ucs_status_t UcxWorker::Impl::OnAck(void* arg, const void* header, size_t header_length, void*,
                                    size_t, const ucp_am_recv_param_t*) {
  auto* impl = static_cast<Impl*>(arg);
  AckMsg msg;
  if (Read(header, header_length, &msg)) impl->Acknowledged(msg.revoke_id);
  return UCS_OK;
}

ucs_status_t UcxWorker::Impl::OnDetach(void* arg, const void* header, size_t header_length, void*,
                                       size_t, const ucp_am_recv_param_t*) {
  auto* impl = static_cast<Impl*>(arg);
  DetachMsg msg;
  if (!Read(header, header_length, &msg)) return UCS_OK;
  for (auto& [id, exported] : impl->exports) exported.attached.erase(msg.token);
  std::vector<uint64_t> settled;
  for (auto& [revoke_id, entry] : impl->revocations) {
    if (entry.second == msg.token) settled.push_back(revoke_id);
  }
  for (uint64_t revoke_id : settled) impl->Acknowledged(revoke_id);
  return UCS_OK;
}

void UcxWorker::Impl::Acknowledged(uint64_t revoke_id) {
  auto it = revocations.find(revoke_id);
  if (it == revocations.end()) return;
  std::shared_ptr<Revocation> revocation = it->second.first;
  revocations.erase(it);
  MutexLock lock(revocation->mu);
  if (revocation->remaining > 0 && --revocation->remaining == 0) revocation->cv.SignalAll();
}

Status UcxWorker::Impl::SetHandler(unsigned id, ucp_am_recv_callback_t cb) {
  ucp_am_handler_param_t params{};
  params.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG;
  params.id = id;
  params.cb = cb;
  params.arg = this;
  ucs_status_t status = ucp_worker_set_am_recv_handler(worker, &params);
  if (status != UCS_OK) return UnavailableError("ucx active-message handler: " + UcsText(status));
  return Status();
}

Status UcxWorker::Impl::EnsureAttached(Key* key) {
  Peer* peer = key->peer.get();
  if (peer->ep == nullptr) LARDER_RETURN_IF_ERROR(Connect(peer));
  if (key->generation == peer->generation && key->rkey != nullptr) return Status();
  if (key->rkey != nullptr) ucp_rkey_destroy(key->rkey);
  key->rkey = nullptr;
  ucs_status_t status = ucp_ep_rkey_unpack(peer->ep, key->packed_rkey.data(), &key->rkey);
  if (status != UCS_OK) {
    key->rkey = nullptr;
    return InvalidArgumentError("ucx refuses the rkey of segment '" + key->owner.segment + "' of " +
                                key->owner.ToString() + ": " + UcsText(status));
  }
  key->generation = peer->generation;
  key->state = KeyState::kAttaching;
  RandomBytes(key->nonce.data(), key->nonce.size());
  AttachMsg msg{key->token, key->segment_id, key->nonce};
  if (!SendAm(peer->ep, kAmAttach, Bytes(msg), own_address, true)) {
    return UnavailableError("ucx cannot send to " + key->owner.ToString());
  }
  return Status();
}

void UcxWorker::Impl::SettleAttach(Key* key, const Status& status) {
  if (!key->attach_done) return;
  key->attach_done->set_value(status);
  key->attach_done.reset();
}

void UcxWorker::Impl::FailWaiting(Key* key, const Status& status) {
  std::list<Op*> waiting;
  waiting.swap(key->waiting);
  for (Op* op : waiting) {
    op->place = OpPlace::kNew;
    Complete(op, status);
  }
}

void UcxWorker::Impl::Revoke(Key* key, Status why) {
  key->state = KeyState::kRevoked;
  key->refusal = why;
  FailWaiting(key, why);
  SettleAttach(key, why);
}

void UcxWorker::Impl::MaybeRelease(Key* key) {
  if (key->inflight == 0 && !key->acks.empty()) {
    for (uint64_t id : key->acks) {
      SendAm(key->peer->ep, kAmAck, Bytes(AckMsg{id}), std::string(), false);
    }
    key->acks.clear();
  }
  if (!key->detached || key->ops > 0) return;
  if (key->rkey != nullptr) ucp_rkey_destroy(key->rkey);
  key->rkey = nullptr;
  if (key->state != KeyState::kRevoked && key->peer->ep != nullptr) {
    SendAm(key->peer->ep, kAmDetach, Bytes(DetachMsg{key->token}), std::string(), false);
  }
  key->peer->keys.erase(key);
  SettleAttach(key, CancelledError("detached"));
  keys.erase(key->token);
}

}  // namespace larder::transfer::ucx
