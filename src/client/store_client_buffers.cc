// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
// StoreClientImpl: the copying and zero-copy forms of put and get, and the buffers a caller
// registers for them.

#include <algorithm>
#include <unordered_map>

#include "client/store_client_impl.h"
#include "client/store_client_internal.h"
#include "common/env.h"
#include "common/logging.h"

namespace larder::client {

std::vector<Status> StoreClientImpl::BatchPut(std::span<const std::string> keys,
                                              std::span<const std::span<const std::byte>> values,
                                              const PutConfig& config) {
  if (keys.size() != values.size()) return MismatchedStatuses(keys.size());
  std::vector<const void*> ptrs;
  std::vector<size_t> sizes;
  for (const auto& value : values) {
    ptrs.push_back(value.data());
    sizes.push_back(value.size());
  }
  SingleSlices single(ptrs, sizes);
  return PutImpl(keys, single.pieces, config);
}

std::vector<Result<std::string>> StoreClientImpl::BatchGet(std::span<const std::string> keys) {
  std::vector<std::string> values(keys.size());
  std::vector<Status> statuses =
      GetImpl(keys, [&](size_t i, uint64_t size, std::vector<Fragment>* out) {
        values[i].resize(size);
        out->push_back(Fragment{values[i].data(), 0, size});
        return Status::Ok();
      });
  return ValuesOrErrors<std::string>(statuses, std::move(values));
}

Status StoreClientImpl::RegisterBuffer(void* ptr, size_t size) {
  if (ptr == nullptr || size == 0) return InvalidArgumentError("RegisterBuffer: null or empty");
  auto begin = reinterpret_cast<uintptr_t>(ptr);
  {
    WriterLock lock(buffers_mu_);
    if (OverlapsRange(buffers_, begin, size)) {
      return InvalidArgumentError("RegisterBuffer: [" + FormatHex(begin) + ", +" +
                                  std::to_string(size) + ") overlaps a registered buffer");
    }
    buffers_.emplace(begin, size);
  }
  Status status = engine_->RegisterLocalMemory(ptr, size);
  if (!status.ok()) {
    WriterLock lock(buffers_mu_);
    buffers_.erase(begin);
  }
  return status;
}

Status StoreClientImpl::UnregisterBuffer(void* ptr) {
  {
    WriterLock lock(buffers_mu_);
    if (buffers_.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
      return NotFoundError("UnregisterBuffer: no buffer registered at " +
                           FormatHex(reinterpret_cast<uintptr_t>(ptr)));
    }
  }
  return engine_->UnregisterLocalMemory(ptr);
}

std::vector<Status> StoreClientImpl::BatchPutFrom(std::span<const std::string> keys,
                                                  std::span<void* const> ptrs,
                                                  std::span<const size_t> sizes,
                                                  const PutConfig& config) {
  if (keys.size() != ptrs.size() || keys.size() != sizes.size()) {
    return MismatchedStatuses(keys.size());
  }
  std::vector<const void*> srcs(ptrs.begin(), ptrs.end());
  SingleSlices single(srcs, sizes);
  return PutRegistered(keys, single.pieces, config);
}

std::vector<Status> StoreClientImpl::BatchPutFromSlices(
    std::span<const std::string> keys, std::span<const std::vector<BufferSlice>> slices,
    const PutConfig& config) {
  if (keys.size() != slices.size()) return MismatchedStatuses(keys.size());
  std::vector<std::span<const BufferSlice>> pieces(slices.begin(), slices.end());
  return PutRegistered(keys, pieces, config);
}

std::vector<Result<size_t>> StoreClientImpl::BatchGetInto(std::span<const std::string> keys,
                                                          std::span<void* const> ptrs,
                                                          std::span<const size_t> capacities) {
  std::vector<Result<size_t>> results;
  if (keys.size() != ptrs.size() || keys.size() != capacities.size()) {
    for (const Status& status : MismatchedStatuses(keys.size())) results.emplace_back(status);
    return results;
  }
  std::vector<uint64_t> sizes(keys.size(), 0);
  std::vector<Status> statuses =
      GetImpl(keys, [&](size_t i, uint64_t size, std::vector<Fragment>* out) {
        if (size > capacities[i]) {
          return InvalidArgumentError("value of key '" + keys[i] + "' has " + std::to_string(size) +
                                      " bytes; the buffer holds " + std::to_string(capacities[i]));
        }
        LARDER_RETURN_IF_ERROR(CheckRegistered(ptrs[i], capacities[i]));
        sizes[i] = size;
        out->push_back(Fragment{ptrs[i], 0, size});
        return Status::Ok();
      });
  return ValuesOrErrors<size_t>(statuses, std::move(sizes));
}

std::vector<Result<size_t>> StoreClientImpl::BatchGetAllocated(std::span<const std::string> keys,
                                                               const Allocator& allocate) {
  std::vector<uint64_t> sizes(keys.size(), 0);
  std::vector<Status> statuses =
      GetImpl(keys, [&](size_t i, uint64_t size, std::vector<Fragment>* out) {
        LARDER_ASSIGN_OR_RETURN(void* dst, allocate(i, size));
        sizes[i] = size;
        out->push_back(Fragment{dst, 0, size});
        return Status::Ok();
      });
  return ValuesOrErrors<size_t>(statuses, std::move(sizes));
}

std::vector<Result<size_t>> StoreClientImpl::BatchGetIntoSlices(
    std::span<const std::string> keys, std::span<const std::vector<BufferSlice>> slices) {
  if (keys.size() != slices.size()) {
    std::vector<Status> mismatched = MismatchedStatuses(keys.size());
    return ValuesOrErrors<size_t>(mismatched, std::vector<uint64_t>(keys.size()));
  }
  std::vector<uint64_t> sizes(keys.size(), 0);
  std::vector<Status> statuses =
      GetImpl(keys, [&](size_t i, uint64_t size, std::vector<Fragment>* out) {
        uint64_t capacity = 0;
        for (const BufferSlice& slice : slices[i]) {
          LARDER_RETURN_IF_ERROR(CheckRegistered(slice.ptr, slice.size));
          capacity += slice.size;
        }
        if (size > capacity) {
          return InvalidArgumentError("value of key '" + keys[i] + "' has " + std::to_string(size) +
                                      " bytes; its " + std::to_string(slices[i].size()) +
                                      " buffers hold " + std::to_string(capacity));
        }
        uint64_t offset = 0;
        for (const BufferSlice& slice : slices[i]) {
          if (offset == size) break;
          uint64_t n = std::min<uint64_t>(slice.size, size - offset);
          if (n > 0) out->push_back(Fragment{slice.ptr, offset, n});
          offset += n;
        }
        sizes[i] = size;
        return Status::Ok();
      });
  return ValuesOrErrors<size_t>(statuses, std::move(sizes));
}

std::vector<Result<size_t>> StoreClientImpl::BatchGetRanges(std::span<const ObjectRange> ranges) {
  // The distinct keys, and for each the ranges to read from it.
  std::vector<std::string> keys;
  std::unordered_map<std::string_view, size_t> key_index;
  std::vector<std::vector<size_t>> ranges_of;
  for (size_t r = 0; r < ranges.size(); ++r) {
    auto [it, inserted] = key_index.emplace(ranges[r].key, keys.size());
    if (inserted) {
      keys.push_back(ranges[r].key);
      ranges_of.emplace_back();
    }
    ranges_of[it->second].push_back(r);
  }
  std::vector<Status> range_status(ranges.size());
  std::vector<Status> statuses =
      GetImpl(keys, [&](size_t i, uint64_t size, std::vector<Fragment>* out) {
        for (size_t r : ranges_of[i]) {
          const ObjectRange& range = ranges[r];
          if (range.offset > size || range.size > size - range.offset) {
            range_status[r] = OutOfRangeError(
                "range [" + std::to_string(range.offset) + ", +" + std::to_string(range.size) +
                ") of key '" + range.key + "' runs past its " + std::to_string(size) + " bytes");
          } else if (Status registered = CheckRegistered(range.ptr, range.size); !registered.ok()) {
            range_status[r] = registered;
          } else if (range.size > 0) {
            out->push_back(Fragment{range.ptr, range.offset, range.size});
          }
        }
        return Status::Ok();
      });
  std::vector<Result<size_t>> results;
  results.reserve(ranges.size());
  for (size_t r = 0; r < ranges.size(); ++r) {
    const Status& key_status = statuses[key_index[ranges[r].key]];
    if (!key_status.ok()) {
      results.emplace_back(key_status);
    } else if (!range_status[r].ok()) {
      results.emplace_back(range_status[r]);
    } else {
      results.emplace_back(ranges[r].size);
    }
  }
  return results;
}

std::vector<Status> StoreClientImpl::PutRegistered(
    std::span<const std::string> keys, std::span<const std::span<const BufferSlice>> pieces,
    const PutConfig& config) {
  std::vector<Status> results(keys.size());
  std::vector<size_t> valid;
  for (size_t i = 0; i < keys.size(); ++i) {
    for (const BufferSlice& slice : pieces[i]) {
      results[i] = CheckRegistered(slice.ptr, slice.size);
      if (!results[i].ok()) break;
    }
    if (results[i].ok()) valid.push_back(i);
  }
  if (valid.size() == keys.size()) return PutImpl(keys, pieces, config);
  std::vector<std::string> sub_keys;
  std::vector<std::span<const BufferSlice>> sub_pieces;
  for (size_t i : valid) {
    sub_keys.push_back(keys[i]);
    sub_pieces.push_back(pieces[i]);
  }
  ScatterResults(valid, PutImpl(sub_keys, sub_pieces, config), &results);
  return results;
}

Status StoreClientImpl::CheckRegistered(const void* ptr, size_t size) const {
  auto begin = reinterpret_cast<uintptr_t>(ptr);
  ReaderLock lock(buffers_mu_);
  if (FindEnclosingRange(buffers_, begin, size) != buffers_.end()) {
    return Status::Ok();
  }
  return FailedPreconditionError("buffer [" + FormatHex(begin) + ", +" + std::to_string(size) +
                                 ") is not inside a registered buffer; call RegisterBuffer first");
}

}  // namespace larder::client
