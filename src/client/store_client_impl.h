// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// The store client (StoreClient::Create): a transfer engine, a segment mounted at the master, and
// the master's RPCs. Its calls live by concern: store_client.cc (start), store_client_buffers.cc
// (the copying and zero-copy forms, registered buffers), store_client_metadata.cc (exist, sizes,
// removal, object info, routes), store_client_segments.cc (opened peers' segments, lease
// releases), store_client_put.cc and store_client_get.cc (the two data paths), store_client_disk.cc
// (the disk holder). Not part of the public API.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/lease_releaser.h"
#include "client/master_client.h"
#include "client/master_membership.h"
#include "client/store_pieces.h"
#include "common/mutex.h"
#include "disk/disk_io.h"
#include "disk/disk_store.h"
#include "larder/store_client.h"

namespace larder::client {

// How a store client's put or get names its keys, and what kind of call it is.
struct CallScope {
  bool master_keys = false;  // the keys are the master's already (a disk holder's calls)
  bool promotion = false;    // a disk holder putting back an object from its disk
  bool quiet = false;        // a disk holder's demotion read: no use of the objects
};

class StoreClientImpl final : public StoreClient {
 public:
  StoreClientImpl(StoreClientOptions options, std::unique_ptr<TransferEngine> engine)
      : options_(std::move(options)),
        engine_(std::move(engine)),
        master_(MasterOptionsFor(options_, *engine_)) {}

  ~StoreClientImpl() override {
    StopDiskHolder();
    releases_.Stop();
    if (membership_) membership_->Stop();
  }

  Status Init();

  const std::string& segment_name() const override { return segment_name_; }
  const std::string& client_id() const override { return engine_->id(); }
  TransferEngine& engine() override { return *engine_; }

  // ---- copying API ----

  std::vector<Status> BatchPut(std::span<const std::string> keys,
                               std::span<const std::span<const std::byte>> values,
                               const PutConfig& config) override;

  std::vector<Result<std::string>> BatchGet(std::span<const std::string> keys) override;

  // ---- zero-copy API ----

  Status RegisterBuffer(void* ptr, size_t size) override;

  Status UnregisterBuffer(void* ptr) override;

  std::vector<Status> BatchPutFrom(std::span<const std::string> keys, std::span<void* const> ptrs,
                                   std::span<const size_t> sizes, const PutConfig& config) override;

  std::vector<Status> BatchPutFromSlices(std::span<const std::string> keys,
                                         std::span<const std::vector<BufferSlice>> slices,
                                         const PutConfig& config) override;

  std::vector<Result<size_t>> BatchGetInto(std::span<const std::string> keys,
                                           std::span<void* const> ptrs,
                                           std::span<const size_t> capacities) override;

  std::vector<Result<size_t>> BatchGetAllocated(std::span<const std::string> keys,
                                                const Allocator& allocate) override;

  std::vector<Result<size_t>> BatchGetIntoSlices(
      std::span<const std::string> keys, std::span<const std::vector<BufferSlice>> slices) override;

  std::vector<Result<size_t>> BatchGetRanges(std::span<const ObjectRange> ranges) override;

  // ---- metadata ----

  std::vector<Result<bool>> BatchExist(std::span<const std::string> keys) override;

  Result<uint64_t> GetSize(std::string_view key) override;

  std::vector<Status> BatchRemoveReplicas(std::span<const std::string> keys,
                                          const RemoveScope& scope) override;

  Result<uint64_t> RemoveAll(bool force) override;

  Result<uint64_t> RemoveByRegex(std::string_view pattern, bool force) override;

  std::vector<Result<ObjectInfo>> BatchGetObjectInfo(std::span<const std::string> keys) override;

  uint64_t CatalogSize() const override { return membership_ ? membership_->catalog().size() : 0; }

  Result<RouteKind> RouteTo(std::string_view segment_name) override;

 private:
  using Stub = proto::Master::Stub;
  using SteadyClock = std::chrono::steady_clock;

  // Where the value of keys[index] (of `size` bytes) goes: appends its fragments to `out`.
  using DestinationFn =
      std::function<Status(size_t index, uint64_t size, std::vector<Fragment>* out)>;

  // The key the master knows `key` of this client's tenant by.
  std::string MasterKey(std::string_view key) const { return ScopedKey(options_.tenant_id, key); }
  std::string MasterKey(std::string_view key, const CallScope& scope) const {
    return scope.master_keys ? std::string(key) : MasterKey(key);
  }

  template <typename Repeated>
  void AddKeys(std::span<const std::string> keys, Repeated* out,
               const CallScope& scope = {}) const {
    out->Reserve(static_cast<int>(keys.size()));
    for (const std::string& key : keys) out->Add(MasterKey(key, scope));
  }

  // Puts the keys whose every slice lies in a registered buffer; the others fail with
  // FailedPrecondition.
  std::vector<Status> PutRegistered(std::span<const std::string> keys,
                                    std::span<const std::span<const BufferSlice>> pieces,
                                    const PutConfig& config);

  static std::vector<Status> MismatchedStatuses(size_t n) {
    return std::vector<Status>(n, InvalidArgumentError("batch arguments have different lengths"));
  }

  Status CheckRegistered(const void* ptr, size_t size) const;

  // Calls the master for this client; when the master no longer knows the client (it expired or
  // the master restarted), mounts again and retries once. Calls whose request can carry lease
  // releases take every release waiting to be sent.
  template <typename Request, typename Reply>
  Status Rpc(const char* name,
             grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Reply*),
             Request* request, Reply* reply) {
    uint64_t generation = membership_->generation();
    request->set_client_id(engine_->id());
    if constexpr (requires { request->mutable_release_leases(); }) {
      std::vector<uint64_t> releases = releases_.TakeForCall();
      request->mutable_release_leases()->Add(releases.begin(), releases.end());
    } else {
      // A call that cannot carry releases (RemoveAll, RemoveByRegex) sends them first, so that
      // this client's own finished reads never stand in its way.
      SendReleases(releases_.TakeForCall());
    }
    // MasterClient::Call repeats what a broken connection, a restarted master or a new leader
    // failed; this adds the one recovery that is the store client's own: a mount.
    Status status = master_.Call(name, method, *request, reply);
    // Only a master that does not know this client asks for a mount; any other
    // FailedPrecondition stands.
    if (status.detail() != ErrorDetail::kRemountRequired) return status;
    LARDER_RETURN_IF_ERROR(membership_->Remount(generation));
    reply->Clear();
    return master_.Call(name, method, *request, reply);
  }

  // Closes the opened segments the master no longer lists (unmounted, or lost with their owner),
  // so that their mappings go. False when the master could not be asked.
  bool CloseGoneSegments();

  // Sends lease releases that no call carried (LeaseReleaser's thread, and Stop).
  void SendReleases(std::vector<uint64_t> ids);

  // Opens (and caches) the segments; a segment that cannot be opened is left out of `opened`, and
  // why is appended to *failed (when given).
  void OpenSegments(std::span<const uint64_t> ids, SegmentHandles* opened,
                    std::vector<Status>* failed = nullptr);

  // A segment this client failed to reach is placed last in its puts for a while: until the
  // master drops it (its owner expired), or kAvoidFor, whichever comes first.
  static constexpr auto kAvoidFor = std::chrono::seconds(30);

  void MarkUnreachable(uint64_t id);

  void AddUnreachable(proto::BatchPutStartRequest* request);

  void ForgetSegment(uint64_t id);

  // Object i is the concatenation of pieces[i].
  std::vector<Status> PutImpl(std::span<const std::string> keys,
                              std::span<const std::span<const BufferSlice>> pieces,
                              const PutConfig& config, const CallScope& scope = {});

  // Reads the keys' values where `destination` says. Repeats the reads a lease outran once, and
  // the gets of keys a disk holder is bringing back (kOnDisk) until they are back or
  // transfer_timeout passed.
  std::vector<Status> GetImpl(std::span<const std::string> keys, const DestinationFn& destination,
                              const CallScope& scope = {});

  std::vector<Status> GetOnce(std::span<const std::string> keys, const DestinationFn& destination,
                              const CallScope& scope);

  // ---- the disk tier's holder (store_client_disk.cc) ----

  // Opens the disk (options_.disk_path), registers it with the master (its first poll, and the
  // announcement of what it holds, which that poll asks for) and starts the thread that serves
  // the master's work: a put or get right after the client starts finds the disk tier there.
  Status StartDiskHolder();
  void StopDiskHolder();
  void DiskLoop();
  // One poll of the master as the disk's holder, waiting up to `wait_ms` for work, and that work
  // done (promotions handed to PromoteLoop).
  Status PollDisk(uint32_t wait_ms);
  proto::DiskHolder DiskHolderInfo() const;
  // Sends a report; the stored keys the master refused are dropped from the disk.
  Status SendDiskReport(proto::DiskReportRequest* request);
  void Announce();
  // Promotions, handed over by DiskLoop.
  void PromoteLoop();
  void Demote(const std::vector<std::string>& keys);
  struct DemoteBatch {
    std::vector<std::string> keys;
    std::vector<disk::AlignedBuffer> values;
    std::vector<uint64_t> sizes;
    std::vector<Status> got;
  };
  // Writes a batch read for demotion to disk and reports it (on a thread of its own while the
  // next batch is read).
  void StoreDemoted(const DemoteBatch& batch);
  void Promote(const std::vector<std::string>& keys);

  const StoreClientOptions options_;
  std::unique_ptr<TransferEngine> engine_;
  MasterClient master_;
  std::shared_ptr<MemoryRegion> segment_memory_;
  SegmentId local_segment_ = 0;
  std::string segment_name_;
  SegmentDescriptor descriptor_;  // of segment_memory_, as mounted

  std::unique_ptr<MasterMembership> membership_;

  Mutex cache_mu_;
  std::unordered_map<uint64_t, SegmentHandleRank> cache_ LARDER_GUARDED_BY(cache_mu_);
  // Avoid until.
  std::map<uint64_t, SteadyClock::time_point> unreachable_ LARDER_GUARDED_BY(cache_mu_);

  mutable SharedMutex buffers_mu_;
  std::map<uintptr_t, size_t> buffers_ LARDER_GUARDED_BY(buffers_mu_);

  std::unique_ptr<disk::DiskStore> disk_;
  std::thread disk_thread_;  // polls, drops and demotes
  std::thread promote_thread_;
  std::atomic<bool> disk_stopping_{false};
  Mutex promote_mu_;
  CondVar promote_wake_;
  std::vector<std::string> promote_queue_ LARDER_GUARDED_BY(promote_mu_);

  // Declared last: destroyed first, while master_ can still send what is left.
  LeaseReleaser releases_{options_.lease_release_delay,
                          [this](std::vector<uint64_t> ids) { SendReleases(std::move(ids)); }};
};

}  // namespace larder::client
