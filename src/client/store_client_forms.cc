// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// StoreClient's single-key forms: each is its batch form called with one key, in every
// implementation alike.
#include <string>
#include <utility>

#include "larder/store_client.h"

namespace larder {

Status StoreClient::Put(std::string_view key, std::span<const std::byte> value,
                        const PutConfig& config) {
  const std::string k(key);
  return BatchPut(std::span(&k, 1), std::span(&value, 1), config)[0];
}

Result<std::string> StoreClient::Get(std::string_view key) {
  const std::string k(key);
  return std::move(BatchGet(std::span(&k, 1))[0]);
}

Status StoreClient::PutFrom(std::string_view key, const void* ptr, size_t size,
                            const PutConfig& config) {
  const std::string k(key);
  void* p = const_cast<void*>(ptr);
  return BatchPutFrom(std::span(&k, 1), std::span(&p, 1), std::span(&size, 1), config)[0];
}

Result<size_t> StoreClient::GetInto(std::string_view key, void* ptr, size_t capacity) {
  const std::string k(key);
  return std::move(BatchGetInto(std::span(&k, 1), std::span(&ptr, 1), std::span(&capacity, 1))[0]);
}

Result<bool> StoreClient::Exist(std::string_view key) {
  const std::string k(key);
  return std::move(BatchExist(std::span(&k, 1))[0]);
}

Status StoreClient::Remove(std::string_view key, bool force) {
  const std::string k(key);
  return BatchRemove(std::span(&k, 1), force)[0];
}

std::vector<Status> StoreClient::BatchRemove(std::span<const std::string> keys, bool force) {
  RemoveScope scope;
  scope.force = force;
  return BatchRemoveReplicas(keys, scope);
}

}  // namespace larder
