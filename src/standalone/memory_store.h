// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// An in-memory StoreClient for the daemon's request handling (AttachConnection) in tests and the
// fuzz_attach_connection target. Test-only; header-only, so that a fuzz build needs no test
// library.
#pragma once

#include <cstdlib>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "larder/store_client.h"

namespace larder::standalone::testing {

// Keeps values in a map; the zero-copy calls read and write the daemon pointers they are given,
// so that what a test sees in the client's mapping is what crossed the translation.
class MemoryStore final : public StoreClient {
 public:
  const std::string& segment_name() const override { return name_; }
  const std::string& client_id() const override { return id_; }
  TransferEngine& engine() override { std::abort(); }

  std::vector<Status> BatchPut(std::span<const std::string> keys,
                               std::span<const std::span<const std::byte>> values,
                               const PutConfig&) override {
    std::vector<Status> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      out.push_back(
          Store(keys[i], {reinterpret_cast<const char*>(values[i].data()), values[i].size()}));
    }
    return out;
  }
  std::vector<Result<std::string>> BatchGet(std::span<const std::string> keys) override {
    std::vector<Result<std::string>> out;
    for (const auto& key : keys) out.push_back(Load(key));
    return out;
  }
  Status RegisterBuffer(void* ptr, size_t size) override {
    MutexLock lock(mu_);
    registered_[ptr] = size;
    return Status::Ok();
  }
  Status UnregisterBuffer(void* ptr) override {
    MutexLock lock(mu_);
    return registered_.erase(ptr) > 0 ? Status::Ok() : NotFoundError("not registered");
  }
  std::vector<Status> BatchPutFrom(std::span<const std::string> keys, std::span<void* const> ptrs,
                                   std::span<const size_t> sizes, const PutConfig&) override {
    std::vector<Status> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      out.push_back(Store(keys[i], {static_cast<const char*>(ptrs[i]), sizes[i]}));
    }
    return out;
  }
  std::vector<Result<size_t>> BatchGetInto(std::span<const std::string> keys,
                                           std::span<void* const> ptrs,
                                           std::span<const size_t> capacities) override {
    return ReadEach(keys, [&](size_t i, const std::string& value) -> Result<size_t> {
      if (value.size() > capacities[i]) return InvalidArgumentError("capacity");
      std::memcpy(ptrs[i], value.data(), value.size());
      return value.size();
    });
  }
  std::vector<Status> BatchPutFromSlices(std::span<const std::string> keys,
                                         std::span<const std::vector<BufferSlice>> slices,
                                         const PutConfig&) override {
    std::vector<Status> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      std::string value;
      for (const BufferSlice& s : slices[i]) value.append(static_cast<const char*>(s.ptr), s.size);
      out.push_back(Store(keys[i], value));
    }
    return out;
  }
  std::vector<Result<size_t>> BatchGetIntoSlices(
      std::span<const std::string> keys,
      std::span<const std::vector<BufferSlice>> slices) override {
    return ReadEach(keys, [&](size_t i, const std::string& value) -> Result<size_t> {
      size_t at = 0;
      for (const BufferSlice& s : slices[i]) {
        size_t n = std::min(s.size, value.size() - at);
        std::memcpy(s.ptr, value.data() + at, n);
        at += n;
      }
      return value.size();
    });
  }
  std::vector<Result<size_t>> BatchGetAllocated(std::span<const std::string> keys,
                                                const Allocator& allocate) override {
    return ReadEach(keys, [&](size_t i, const std::string& value) -> Result<size_t> {
      LARDER_ASSIGN_OR_RETURN(void* dst, allocate(i, value.size()));
      std::memcpy(dst, value.data(), value.size());
      return value.size();
    });
  }
  std::vector<Result<size_t>> BatchGetRanges(std::span<const ObjectRange> ranges) override {
    std::vector<Result<size_t>> out;
    for (const ObjectRange& r : ranges) {
      auto value = Load(r.key);
      if (!value.ok()) {
        out.emplace_back(value.status());
      } else if (r.offset > value->size() || r.size > value->size() - r.offset) {
        out.emplace_back(OutOfRangeError("past the value"));
      } else {
        std::memcpy(r.ptr, value->data() + r.offset, r.size);
        out.emplace_back(r.size);
      }
    }
    return out;
  }
  std::vector<Result<bool>> BatchExist(std::span<const std::string> keys) override {
    std::vector<Result<bool>> out;
    for (const auto& key : keys) out.push_back(Load(key).ok());
    return out;
  }
  Result<uint64_t> GetSize(std::string_view key) override {
    LARDER_ASSIGN_OR_RETURN(std::string value, Load(key));
    return value.size();
  }
  // One segment, one replica per object: the segment's name is this store's.
  // It keeps no use times: `unused_for` is refused.
  std::vector<Status> BatchRemoveReplicas(std::span<const std::string> keys,
                                          const RemoveScope& scope) override {
    if (scope.unused_for.count() > 0) {
      return std::vector<Status>(keys.size(),
                                 UnimplementedError("the in-memory store keeps no use times"));
    }
    if (!scope.segment.empty() && scope.segment != name_) {
      return std::vector<Status>(keys.size(),
                                 NotFoundError("no segment named '" + scope.segment + "'"));
    }
    std::vector<Status> out;
    MutexLock lock(mu_);
    for (const auto& key : keys) {
      out.push_back(values_.erase(key) > 0 ? Status::Ok() : NotFoundError("no key"));
    }
    return out;
  }
  Result<uint64_t> RemoveAll(bool) override {
    MutexLock lock(mu_);
    uint64_t n = values_.size();
    values_.clear();
    return n;
  }
  Result<uint64_t> RemoveByRegex(std::string_view, bool) override { return uint64_t{0}; }
  std::vector<Result<ObjectInfo>> BatchGetObjectInfo(std::span<const std::string> keys) override {
    std::vector<Result<ObjectInfo>> out;
    for (const auto& key : keys) {
      auto size = GetSize(key);
      if (!size.ok()) {
        out.emplace_back(size.status());
      } else {
        out.emplace_back(ObjectInfo{*size, {ReplicaInfo{name_, 0, 0, ""}}});
      }
    }
    return out;
  }
  Result<RouteKind> RouteTo(std::string_view) override { return RouteKind::kLocal; }

  size_t registered() {
    MutexLock lock(mu_);
    return registered_.size();
  }

 private:
  // As the store: an existing key keeps its value.
  Status Store(const std::string& key, std::string_view value) {
    if (key.empty()) return InvalidArgumentError("empty key");
    if (value.empty()) return InvalidArgumentError("empty value");
    MutexLock lock(mu_);
    values_.try_emplace(key, value);
    return Status::Ok();
  }
  Result<std::string> Load(std::string_view key) {
    MutexLock lock(mu_);
    auto it = values_.find(std::string(key));
    if (it == values_.end()) return NotFoundError("no " + std::string(key));
    return it->second;
  }
  // A result per key: Load's error, or what `read` (index, value) makes of the value.
  template <typename ReadFn>
  std::vector<Result<size_t>> ReadEach(std::span<const std::string> keys, ReadFn read) {
    std::vector<Result<size_t>> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      Result<std::string> value = Load(keys[i]);
      if (value.ok()) {
        out.push_back(read(i, *value));
      } else {
        out.emplace_back(value.status());
      }
    }
    return out;
  }

  std::string name_ = "daemon-segment";
  std::string id_ = "daemon-id";
  Mutex mu_;
  std::map<std::string, std::string> values_ LARDER_GUARDED_BY(mu_);
  std::map<void*, size_t> registered_ LARDER_GUARDED_BY(mu_);
};

}  // namespace larder::standalone::testing
