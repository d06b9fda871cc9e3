// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder.Store: StoreClient with Pythonic names. Single-key calls raise on error; batch calls
// return one item per key, the LarderError instance in place of a failed item.
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "buffers.h"
#include "errors.h"
#include "gil.h"
#include "larder/standalone.h"
#include "larder/store_client.h"
#include "value_buffer.h"

namespace larder::python {
namespace {

// soft_pin: None or "preserve" (keep an overwritten key's soft pin), True or "enable", False or
// "disable"; soft_pin_ttl: None (the master's default) or seconds / "10m".
PutConfig MakePutConfig(uint32_t replica_num,
                        const std::optional<std::vector<std::string>>& preferred_segments, bool pin,
                        py::handle soft_pin = py::none(), py::handle soft_pin_ttl = py::none(),
                        bool overwrite = false, bool disk_write_through = false) {
  PutConfig config;
  config.replica_num = replica_num;
  if (preferred_segments) config.preferred_segments = *preferred_segments;
  config.pin = pin;
  if (py::isinstance<py::bool_>(soft_pin)) {
    config.soft_pin_action =
        soft_pin.cast<bool>() ? SoftPinAction::kEnable : SoftPinAction::kDisable;
  } else if (py::isinstance<py::str>(soft_pin)) {
    std::string action = soft_pin.cast<std::string>();
    if (action == "preserve") {
      config.soft_pin_action = SoftPinAction::kPreserve;
    } else if (action == "enable") {
      config.soft_pin_action = SoftPinAction::kEnable;
    } else if (action == "disable") {
      config.soft_pin_action = SoftPinAction::kDisable;
    } else {
      throw StatusError(
          InvalidArgumentError("soft_pin must be 'preserve', 'enable' or 'disable', "
                               "not '" +
                               action + "'"));
    }
  } else if (!soft_pin.is_none()) {
    throw py::type_error("soft_pin must be None, a bool or 'preserve' / 'enable' / 'disable'");
  }
  if (!soft_pin_ttl.is_none()) config.soft_pin_ttl = ToMilliseconds(soft_pin_ttl, "soft_pin_ttl");
  config.overwrite = overwrite;
  config.disk_write_through = disk_write_through;
  return config;
}

// Per-key lists of slices (buffers, or addresses with `sizes`), as batch_put_from_slices takes
// them. `views` keeps the buffer views alive.
std::vector<std::vector<BufferSlice>> ResolveSlices(size_t keys, const py::sequence& buffers,
                                                    py::handle sizes, bool writable,
                                                    std::vector<ByteRange>* views) {
  if (buffers.size() != keys) {
    throw StatusError(InvalidArgumentError("got " + std::to_string(keys) + " keys but " +
                                           std::to_string(buffers.size()) + " buffer lists"));
  }
  std::optional<py::sequence> size_lists;
  if (!sizes.is_none()) {
    size_lists = py::reinterpret_borrow<py::sequence>(sizes);
    if (size_lists->size() != keys) {
      throw StatusError(InvalidArgumentError("got " + std::to_string(keys) + " keys but " +
                                             std::to_string(size_lists->size()) + " size lists"));
    }
  }
  std::vector<std::vector<BufferSlice>> slices(keys);
  for (size_t i = 0; i < keys; ++i) {
    auto items = py::reinterpret_borrow<py::sequence>(buffers[i]);
    std::optional<py::sequence> item_sizes;
    if (size_lists) {
      item_sizes = py::reinterpret_borrow<py::sequence>((*size_lists)[i]);
      if (item_sizes->size() != items.size()) {
        throw StatusError(InvalidArgumentError("key " + std::to_string(i) + ": " +
                                               std::to_string(items.size()) + " buffers but " +
                                               std::to_string(item_sizes->size()) + " sizes"));
      }
    }
    for (size_t j = 0; j < items.size(); ++j) {
      py::object size = item_sizes ? py::object((*item_sizes)[j]) : py::object(py::none());
      views->push_back(ByteRange::From(items[j], size, writable));
      slices[i].push_back(BufferSlice{views->back().data(), views->back().size()});
    }
  }
  return slices;
}

py::list SizeList(const std::vector<Result<size_t>>& read) {
  py::list list(read.size());
  for (size_t i = 0; i < read.size(); ++i) {
    list[i] = read[i].ok() ? py::object(py::int_(*read[i])) : ErrorObject(read[i].status());
  }
  return list;
}

// Resolves the buffers (and optional sizes) of a batch call. Raises InvalidArgumentError when the
// lengths differ from the number of keys.
std::vector<ByteRange> ResolveBatch(size_t keys, const py::sequence& buffers, py::handle sizes,
                                    bool writable) {
  if (buffers.size() != keys) {
    throw StatusError(InvalidArgumentError("got " + std::to_string(keys) + " keys but " +
                                           std::to_string(buffers.size()) + " buffers"));
  }
  std::optional<py::sequence> size_list;
  if (!sizes.is_none()) {
    size_list = py::reinterpret_borrow<py::sequence>(sizes);
    if (size_list->size() != keys) {
      throw StatusError(InvalidArgumentError("got " + std::to_string(keys) + " keys but " +
                                             std::to_string(size_list->size()) + " sizes"));
    }
  }
  std::vector<ByteRange> ranges;
  ranges.reserve(keys);
  for (size_t i = 0; i < keys; ++i) {
    py::object size = size_list ? py::object((*size_list)[i]) : py::object(py::none());
    ranges.push_back(ByteRange::From(buffers[i], size, writable));
  }
  return ranges;
}

py::list StatusList(const std::vector<Status>& statuses) {
  py::list list(statuses.size());
  for (size_t i = 0; i < statuses.size(); ++i) list[i] = ErrorObject(statuses[i]);
  return list;
}

class PyStore {
 public:
  explicit PyStore(const StoreClientOptions& options)
      : buffers_(std::make_shared<BufferCache>(
            std::max<uint64_t>(options.local_buffer_size, kMinBufferCache))) {
    auto created = WithoutGil([&] { return StoreClient::Create(options); });
    client_ = std::shared_ptr<StoreClient>(ValueOrThrow(std::move(created)));
  }

  // A client attached to a larder-client daemon (standalone mode).
  PyStore(std::unique_ptr<AttachedStoreClient> attached, uint64_t staging_bytes)
      : buffers_(std::make_shared<BufferCache>(std::max<uint64_t>(staging_bytes, kMinBufferCache))),
        attached_(attached.get()),
        client_(std::move(attached)) {}

  ~PyStore() { Close(); }

  // The attached client, or FailedPrecondition for a client that owns its segment.
  AttachedStoreClient* Attached() const {
    Client();
    if (attached_ == nullptr) {
      throw StatusError(FailedPreconditionError(
          "this store owns its segment; shared-memory calls need Store.attach (a larder-client "
          "daemon)"));
    }
    return attached_;
  }
  bool attached() const { return attached_ != nullptr; }

  uintptr_t AllocateShared(py::handle size) {
    auto client = Client();
    AttachedStoreClient* attached = Attached();
    size_t n = ToByteSize(size, "size");
    void* ptr = ValueOrThrow(WithoutGil([&] { return attached->AllocateShared(n); }));
    return reinterpret_cast<uintptr_t>(ptr);
  }

  void FreeShared(uintptr_t address) {
    auto client = Client();
    AttachedStoreClient* attached = Attached();
    ThrowIfError(
        WithoutGil([&] { return attached->FreeShared(reinterpret_cast<void*>(address)); }));
  }

  void RegisterSharedBuffer(uintptr_t address, size_t size, int fd, uint64_t fd_offset) {
    auto client = Client();
    AttachedStoreClient* attached = Attached();
    ThrowIfError(WithoutGil([&] {
      return attached->RegisterSharedBuffer(reinterpret_cast<void*>(address), size, fd, fd_offset);
    }));
  }

  // Unmounts the segment and stops heartbeats. Calls in flight in other threads finish first
  // (they hold their own reference). Idempotent.
  void Close() {
    std::shared_ptr<StoreClient> client = std::move(client_);
    attached_ = nullptr;
    if (client) WithoutGil([&] { client.reset(); });
    pinned_.clear();
  }

  bool closed() const { return client_ == nullptr; }

  std::shared_ptr<StoreClient> Client() const {
    if (!client_) throw StatusError(FailedPreconditionError("the store is closed"));
    return client_;
  }

  // ---- copying API ----

  void Put(const std::string& key, py::handle value, const PutConfig& config) {
    auto client = Client();
    ByteRange range = ByteRange::From(value, py::none(), /*writable=*/false);
    auto span = std::span(static_cast<const std::byte*>(range.data()), range.size());
    ThrowIfError(WithoutGil([&] { return client->Put(key, span, config); }));
  }

  py::bytes Get(const std::string& key) {
    auto client = Client();
    auto value = WithoutGil([&] { return client->Get(key); });
    return py::bytes(ValueOrThrow(std::move(value)));
  }

  py::list BatchPut(const std::vector<std::string>& keys, const py::sequence& values,
                    const PutConfig& config) {
    auto client = Client();
    std::vector<ByteRange> ranges = ResolveBatch(keys.size(), values, py::none(), false);
    std::vector<std::span<const std::byte>> spans;
    spans.reserve(ranges.size());
    for (const ByteRange& r : ranges) {
      spans.emplace_back(static_cast<const std::byte*>(r.data()), r.size());
    }
    return StatusList(WithoutGil([&] { return client->BatchPut(keys, spans, config); }));
  }

  py::list BatchGet(const std::vector<std::string>& keys) {
    auto client = Client();
    auto values = WithoutGil([&] { return client->BatchGet(keys); });
    py::list list(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      list[i] =
          values[i].ok() ? py::object(py::bytes(*values[i])) : ErrorObject(values[i].status());
    }
    return list;
  }

  // ---- zero-copy API ----

  void RegisterBuffer(py::handle buffer, py::handle size) {
    auto client = Client();
    ByteRange range = ByteRange::From(buffer, size, /*writable=*/false);
    ThrowIfError(WithoutGil([&] { return client->RegisterBuffer(range.data(), range.size()); }));
    if (range.holds_view()) {
      auto address = reinterpret_cast<uintptr_t>(range.data());
      pinned_.insert_or_assign(address, std::move(range));
    }
  }

  void UnregisterBuffer(py::handle buffer) {
    auto client = Client();
    auto address = AddressOf(buffer);
    ThrowIfError(
        WithoutGil([&] { return client->UnregisterBuffer(reinterpret_cast<void*>(address)); }));
    pinned_.erase(address);
  }

  void PutFrom(const std::string& key, py::handle buffer, py::handle size,
               const PutConfig& config) {
    auto client = Client();
    ByteRange range = ByteRange::From(buffer, size, /*writable=*/false);
    ThrowIfError(
        WithoutGil([&] { return client->PutFrom(key, range.data(), range.size(), config); }));
  }

  uint64_t GetInto(const std::string& key, py::handle buffer, py::handle size) {
    auto client = Client();
    ByteRange range = ByteRange::From(buffer, size, /*writable=*/true);
    auto read = WithoutGil([&] { return client->GetInto(key, range.data(), range.size()); });
    return ValueOrThrow(std::move(read));
  }

  py::list BatchPutFrom(const std::vector<std::string>& keys, const py::sequence& buffers,
                        py::handle sizes, const PutConfig& config) {
    auto client = Client();
    std::vector<ByteRange> ranges = ResolveBatch(keys.size(), buffers, sizes, false);
    std::vector<void*> ptrs;
    std::vector<size_t> lengths;
    ptrs.reserve(ranges.size());
    lengths.reserve(ranges.size());
    for (const ByteRange& r : ranges) {
      ptrs.push_back(r.data());
      lengths.push_back(r.size());
    }
    return StatusList(
        WithoutGil([&] { return client->BatchPutFrom(keys, ptrs, lengths, config); }));
  }

  py::list BatchGetInto(const std::vector<std::string>& keys, const py::sequence& buffers,
                        py::handle sizes) {
    auto client = Client();
    std::vector<ByteRange> ranges = ResolveBatch(keys.size(), buffers, sizes, true);
    std::vector<void*> ptrs;
    std::vector<size_t> capacities;
    ptrs.reserve(ranges.size());
    capacities.reserve(ranges.size());
    for (const ByteRange& r : ranges) {
      ptrs.push_back(r.data());
      capacities.push_back(r.size());
    }
    return SizeList(WithoutGil([&] { return client->BatchGetInto(keys, ptrs, capacities); }));
  }

  py::list BatchGetBuffers(const std::vector<std::string>& keys) {
    auto client = Client();
    std::vector<std::shared_ptr<ValueBuffer>> buffers(keys.size());
    BatchArena arena(buffers_);
    auto read = WithoutGil([&] {
      return client->BatchGetAllocated(keys, [&](size_t i, uint64_t size) -> Result<void*> {
        auto [block, offset] = arena.Allocate(size);
        if (!block) {
          return ResourceExhaustedError("no memory for a value of " + std::to_string(size) +
                                        " bytes");
        }
        buffers[i] = std::make_shared<ValueBuffer>(std::move(block), offset, size);
        return buffers[i]->data();
      });
    });
    py::list list(read.size());
    for (size_t i = 0; i < read.size(); ++i) {
      list[i] = read[i].ok() ? py::cast(buffers[i]) : ErrorObject(read[i].status());
    }
    return list;
  }

  std::string StatsJson() {
    auto client = Client();
    return client->engine().Stats().ToJson();
  }

  py::list BatchPutFromSlices(const std::vector<std::string>& keys, const py::sequence& buffers,
                              py::handle sizes, const PutConfig& config) {
    auto client = Client();
    std::vector<ByteRange> views;
    auto slices = ResolveSlices(keys.size(), buffers, sizes, false, &views);
    return StatusList(WithoutGil([&] { return client->BatchPutFromSlices(keys, slices, config); }));
  }

  py::list BatchGetIntoSlices(const std::vector<std::string>& keys, const py::sequence& buffers,
                              py::handle sizes) {
    auto client = Client();
    std::vector<ByteRange> views;
    auto slices = ResolveSlices(keys.size(), buffers, sizes, true, &views);
    return SizeList(WithoutGil([&] { return client->BatchGetIntoSlices(keys, slices); }));
  }

  py::list BatchGetRanges(const std::vector<std::string>& keys,
                          const std::vector<uint64_t>& offsets, const py::sequence& buffers,
                          py::handle sizes) {
    auto client = Client();
    if (offsets.size() != keys.size()) {
      throw StatusError(InvalidArgumentError("got " + std::to_string(keys.size()) + " keys but " +
                                             std::to_string(offsets.size()) + " offsets"));
    }
    std::vector<ByteRange> views = ResolveBatch(keys.size(), buffers, sizes, true);
    std::vector<ObjectRange> ranges(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      ranges[i] = ObjectRange{keys[i], offsets[i], views[i].data(), views[i].size()};
    }
    return SizeList(WithoutGil([&] { return client->BatchGetRanges(ranges); }));
  }

  // ---- metadata ----

  bool Exist(const std::string& key) {
    auto client = Client();
    return ValueOrThrow(WithoutGil([&] { return client->Exist(key); }));
  }

  py::list BatchExist(const std::vector<std::string>& keys) {
    auto client = Client();
    auto found = WithoutGil([&] { return client->BatchExist(keys); });
    py::list list(found.size());
    for (size_t i = 0; i < found.size(); ++i) {
      list[i] = found[i].ok() ? py::object(py::bool_(*found[i])) : ErrorObject(found[i].status());
    }
    return list;
  }

  uint64_t GetSize(const std::string& key) {
    auto client = Client();
    return ValueOrThrow(WithoutGil([&] { return client->GetSize(key); }));
  }

  void Remove(const std::string& key, bool force) {
    auto client = Client();
    ThrowIfError(WithoutGil([&] { return client->Remove(key, force); }));
  }

  py::list BatchRemove(const std::vector<std::string>& keys, bool force, const std::string& segment,
                       double unused_for) {
    if (!(unused_for >= 0 && unused_for <= 86400)) {
      throw StatusError(InvalidArgumentError("unused_for of " + std::to_string(unused_for) +
                                             " s is outside 0..86400"));
    }
    RemoveScope scope;
    scope.force = force;
    scope.segment = segment;
    scope.unused_for =
        std::chrono::milliseconds(static_cast<int64_t>(std::ceil(unused_for * 1000)));
    auto client = Client();
    return StatusList(WithoutGil([&] { return client->BatchRemoveReplicas(keys, scope); }));
  }

  uint64_t RemoveAll(bool force) {
    auto client = Client();
    return ValueOrThrow(WithoutGil([&] { return client->RemoveAll(force); }));
  }

  uint64_t RemoveByRegex(const std::string& pattern, bool force) {
    auto client = Client();
    return ValueOrThrow(WithoutGil([&] { return client->RemoveByRegex(pattern, force); }));
  }

  py::list BatchGetObjectInfo(const std::vector<std::string>& keys) {
    auto client = Client();
    auto infos = WithoutGil([&] { return client->BatchGetObjectInfo(keys); });
    py::list list(infos.size());
    for (size_t i = 0; i < infos.size(); ++i) {
      list[i] = infos[i].ok() ? py::cast(*infos[i]) : ErrorObject(infos[i].status());
    }
    return list;
  }

  std::string RouteTo(const std::string& segment_name) {
    auto client = Client();
    RouteKind route = ValueOrThrow(WithoutGil([&] { return client->RouteTo(segment_name); }));
    return std::string(RouteKindName(route));
  }

 private:
  // Freed value buffers kept for reuse: at least kMinBufferCache, or local_buffer_size.
  static constexpr uint64_t kMinBufferCache = 64ull << 20;
  std::shared_ptr<BufferCache> buffers_;
  AttachedStoreClient* attached_ = nullptr;  // client_ as attached, when it is
  std::shared_ptr<StoreClient> client_;      // null once closed
  // Views of buffers registered as Python objects, by address: they keep the memory alive and
  // in place until unregister_buffer or close.
  std::map<uintptr_t, ByteRange> pinned_;
};

StoreClientOptions MakeOptions(py::handle master, py::handle local_hostname,
                               py::handle segment_name, py::handle global_segment_size,
                               py::handle local_buffer_size, py::handle protocol,
                               py::handle replica_num, py::handle auth_token, py::handle host_id,
                               py::handle heartbeat_interval, py::handle rpc_timeout,
                               py::handle transfer_timeout, py::handle tenant_id,
                               py::handle connect_timeout, py::handle disk_path,
                               py::handle disk_capacity) {
  StoreClientOptions options = ValueOrThrow(StoreClientOptions::FromEnvironment());
  auto set_string = [](py::handle value, std::string* field) {
    if (!value.is_none()) *field = value.cast<std::string>();
  };
  set_string(master, &options.master_address);
  set_string(local_hostname, &options.local_hostname);
  set_string(segment_name, &options.segment_name);
  set_string(protocol, &options.protocol);
  set_string(auth_token, &options.auth_token);
  set_string(host_id, &options.host_id);
  set_string(tenant_id, &options.tenant_id);
  set_string(disk_path, &options.disk_path);
  set_string(disk_capacity, &options.disk_capacity);
  if (!global_segment_size.is_none()) {
    options.global_segment_size = ToByteSize(global_segment_size, "global_segment_size");
  }
  if (!local_buffer_size.is_none()) {
    options.local_buffer_size = ToByteSize(local_buffer_size, "local_buffer_size");
  }
  if (!replica_num.is_none()) {
    auto n = OptionalSize(replica_num, "replica_num");
    if (*n == 0 || *n > 64) {
      throw StatusError(InvalidArgumentError("replica_num must be in 1..64"));
    }
    options.replica_num = static_cast<uint32_t>(*n);
  }
  if (!heartbeat_interval.is_none()) {
    options.heartbeat_interval = ToMilliseconds(heartbeat_interval, "heartbeat_interval");
  }
  if (!rpc_timeout.is_none()) options.rpc_timeout = ToMilliseconds(rpc_timeout, "rpc_timeout");
  if (!transfer_timeout.is_none()) {
    options.transfer_timeout = ToMilliseconds(transfer_timeout, "transfer_timeout");
  }
  if (!connect_timeout.is_none()) {
    options.master_connect_timeout = ToMilliseconds(connect_timeout, "connect_timeout");
  }
  return options;
}

constexpr const char* kStoreDoc =
    R"doc(A process's handle on the Larder store, the shared KV-cache pool.

Creating a Store contributes ``global_segment_size`` bytes of this process's memory to the pool,
mounts it with larder-master and starts heartbeats. Every argument left as None takes the value
of its LARDER_* environment variable (LARDER_MASTER, LARDER_LOCAL_HOSTNAME,
LARDER_GLOBAL_SEGMENT_SIZE, ...), else the default of docs/configuration.md.

Args:
    master: larder-master's "host:port" (default "127.0.0.1:50051"), or
        "etcd://HOST:PORT[,HOST:PORT]/CLUSTER_ID" to follow a highly available cluster's leader.
    local_hostname: IPv4 address this process's data server listens on (default "127.0.0.1").
    segment_name: name of this client's segment (default "<local_hostname>:<data port>").
    global_segment_size: bytes contributed to the pool, an int or a string such as "4gb"
        (default 256 MiB; 0 contributes nothing).
    local_buffer_size: accepted for Mooncake compatibility; Larder stages nothing.
    protocol: store transports: "auto", "tcp", "shm,tcp", ... (default: LARDER_STORE_PROTOCOL,
        else LARDER_PROTOCOL, else "auto").
    replica_num: replicas per object when a put does not say (default 1).
    auth_token: cluster secret (default LARDER_AUTH_TOKEN, else none).
    host_id: host identity (default LARDER_HOST_ID, else the kernel boot id).
    heartbeat_interval, rpc_timeout, transfer_timeout: seconds (float) or strings like "500ms".
    connect_timeout: how long creation waits for a master that answers (default
        LARDER_MASTER_CONNECT_TIMEOUT, else 30 s).
    tenant_id: key namespace (default LARDER_TENANT, else the default tenant): keys of other
        tenants are invisible, and remove_all / remove_by_regex stay inside the tenant.
    disk_path: a directory that makes this process its host's disk holder (default
        LARDER_DISK_PATH, else no disk): objects memory is about to lose are written there first
        and read back on a get (docs/disk-tier.md). One process per directory.
    disk_capacity: the most the disk tier takes, bytes ("500G") or a percentage of the file
        system ("40%") (default LARDER_DISK_CAPACITY, else 50%).

Raises:
    UnavailableError: no master answered within connect_timeout.
    InvalidArgumentError: a bad option.

Single-key methods raise a LarderError subclass on failure. Batch methods never raise for one
key: they return a list with one item per key, holding the LarderError instance of a failed key
(see larder.check). Every call releases the GIL while it talks to the master or moves bytes.
A Store is a context manager and is safe to use from several threads.

Buffers: wherever a method takes ``buffer``, pass an object with the buffer protocol (bytes,
bytearray, memoryview, a C-contiguous numpy array) or an integer address together with ``size``
(e.g. ``tensor.data_ptr()``). Do not fork a process that holds a Store; start workers with the
"spawn" method.)doc";

}  // namespace

void BindStore(py::module_& module) {
  py::class_<ReplicaInfo>(module, "ReplicaInfo", "Where one replica of an object lives.")
      .def_readonly("segment_name", &ReplicaInfo::segment_name)
      .def_readonly("offset", &ReplicaInfo::offset, "Offset inside the segment.")
      .def_readonly("address", &ReplicaInfo::address,
                    "The segment owner's address of the replica's first byte.")
      .def_readonly("endpoint", &ReplicaInfo::endpoint, "The owner's data server, 'ip:port'.")
      .def("__repr__", [](const ReplicaInfo& r) {
        return "<larder.ReplicaInfo segment='" + r.segment_name +
               "' offset=" + std::to_string(r.offset) + ">";
      });
  py::class_<ObjectInfo>(module, "ObjectInfo", "An object's size and replicas.")
      .def_readonly("size", &ObjectInfo::size)
      .def_readonly("replicas", &ObjectInfo::replicas)
      .def("__repr__", [](const ObjectInfo& o) {
        return "<larder.ObjectInfo size=" + std::to_string(o.size) +
               " replicas=" + std::to_string(o.replicas.size()) + ">";
      });
  py::class_<PyStore>(module, "Store", kStoreDoc)
      .def(py::init([](py::object master, py::object local_hostname, py::object segment_name,
                       py::object global_segment_size, py::object local_buffer_size,
                       py::object protocol, py::object replica_num, py::object auth_token,
                       py::object host_id, py::object heartbeat_interval, py::object rpc_timeout,
                       py::object transfer_timeout, py::object tenant_id,
                       py::object connect_timeout, py::object disk_path, py::object disk_capacity) {
             return std::make_unique<PyStore>(MakeOptions(
                 master, local_hostname, segment_name, global_segment_size, local_buffer_size,
                 protocol, replica_num, auth_token, host_id, heartbeat_interval, rpc_timeout,
                 transfer_timeout, tenant_id, connect_timeout, disk_path, disk_capacity));
           }),
           py::arg("master") = py::none(), py::kw_only(), py::arg("local_hostname") = py::none(),
           py::arg("segment_name") = py::none(), py::arg("global_segment_size") = py::none(),
           py::arg("local_buffer_size") = py::none(), py::arg("protocol") = py::none(),
           py::arg("replica_num") = py::none(), py::arg("auth_token") = py::none(),
           py::arg("host_id") = py::none(), py::arg("heartbeat_interval") = py::none(),
           py::arg("rpc_timeout") = py::none(), py::arg("transfer_timeout") = py::none(),
           py::arg("tenant_id") = py::none(), py::arg("connect_timeout") = py::none(),
           py::arg("disk_path") = py::none(), py::arg("disk_capacity") = py::none())
      .def_static(
          "attach",
          [](py::object socket, py::object staging_bytes, py::object timeout) {
            AttachOptions options = ValueOrThrow(AttachOptions::FromEnvironment());
            if (!socket.is_none()) options.socket = socket.cast<std::string>();
            if (!staging_bytes.is_none()) {
              options.staging_bytes = ToByteSize(staging_bytes, "staging_bytes");
            }
            if (!timeout.is_none()) options.timeout = ToMilliseconds(timeout, "timeout");
            auto attached = WithoutGil([&] { return AttachedStoreClient::Attach(options); });
            return std::make_unique<PyStore>(ValueOrThrow(std::move(attached)),
                                             options.staging_bytes);
          },
          py::arg("socket") = py::none(), py::kw_only(), py::arg("staging_bytes") = py::none(),
          py::arg("timeout") = py::none(),
          R"doc(Attaches to the larder-client daemon of this host (standalone mode).

The daemon owns the segment and talks to the master; this process's objects outlive it.
``socket``: "@name", a socket path, or "host:port" (Mooncake's client_server_address; default
LARDER_CLIENT_SOCKET, else "@larder-client-50052"). The zero-copy calls take memory shared with
the daemon: from allocate_shared, or a sealed memfd given to register_shared_buffer. The
copying calls stage through ``staging_bytes`` of shared memory (default 16 MiB). Raises
UnavailableError when no daemon serves the socket.)doc")
      .def_property_readonly("attached", &PyStore::attached,
                             "True for a store attached to a larder-client daemon.")
      .def("allocate_shared", &PyStore::AllocateShared, py::arg("size"),
           "Attached stores: allocates and registers ``size`` bytes shared with the daemon; "
           "returns the address. Free with free_shared.")
      .def("free_shared", &PyStore::FreeShared, py::arg("address"),
           "Unregisters and frees memory from allocate_shared.")
      .def("register_shared_buffer", &PyStore::RegisterSharedBuffer, py::arg("address"),
           py::arg("size"), py::arg("fd"), py::arg("fd_offset") = 0,
           "Attached stores: registers [address, address + size), a MAP_SHARED mapping of bytes "
           "from ``fd_offset`` of the memfd ``fd`` (sealed against shrinking), so the daemon maps "
           "the same pages. Unregister with unregister_buffer.")
      .def("close", &PyStore::Close,
           "Unmounts this client's segment (objects with no replica elsewhere leave the pool) and "
           "stops heartbeats. Idempotent; later calls raise FailedPreconditionError.")
      .def_property_readonly("closed", &PyStore::closed, "True after close().")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyStore& self, py::handle, py::handle, py::handle) {
             self.Close();
             return false;
           })
      .def_property_readonly(
          "segment_name", [](const PyStore& self) { return self.Client()->segment_name(); },
          "Name of this client's segment (for preferred_segments); '' when it contributes none.")
      .def_property_readonly(
          "client_id", [](const PyStore& self) { return self.Client()->client_id(); },
          "The id larder-master knows this client by.")
      // ---- copying API ----
      .def(
          "put",
          [](PyStore& self, const std::string& key, py::handle value, uint32_t replica_num,
             std::optional<std::vector<std::string>> preferred_segments, bool pin,
             py::handle soft_pin, py::handle soft_pin_ttl, bool overwrite,
             bool disk_write_through) {
            self.Put(key, value,
                     MakePutConfig(replica_num, preferred_segments, pin, soft_pin, soft_pin_ttl,
                                   overwrite, disk_write_through));
          },
          py::arg("key"), py::arg("value"), py::kw_only(), py::arg("replica_num") = 0,
          py::arg("preferred_segments") = py::none(), py::arg("pin") = false,
          py::arg("soft_pin") = py::none(), py::arg("soft_pin_ttl") = py::none(),
          py::arg("overwrite") = false, py::arg("disk_write_through") = false,
          R"doc(Stores ``value`` (any bytes-like object) under ``key``.

Succeeds without rewriting when the key already exists, unless ``overwrite`` (an upsert: the
new value replaces the old; readers of the old one finish reading it). ``replica_num`` 0 uses
the store's default; ``preferred_segments`` lists segment names to place replicas in first;
pinned objects are never evicted (only remove deletes them). ``soft_pin``: True / "enable"
soft-pins the object (evicted only after every unpinned one) for ``soft_pin_ttl`` (seconds or
"30m"; default: the master's), False / "disable" unpins it, None / "preserve" keeps an
overwritten key's pin. ``disk_write_through`` writes the object to its host's disk tier as soon
as the put ends, whatever the master's demotion watermark. The same keywords work on every put
method.

Raises InvalidArgumentError (empty key or value), ResourceExhaustedError (pool full),
UnavailableError (master or peer unreachable: retry).)doc")
      .def("get", &PyStore::Get, py::arg("key"),
           "Returns the value of ``key`` as bytes. Raises NotFoundError when missing, "
           "UnavailableError while it is being written or when unreachable.")
      .def("batch_get_buffers", &PyStore::BatchGetBuffers, py::arg("keys"),
           "As batch_get, but each value is read straight into a larder.Buffer (no copy into "
           "bytes); returns the Buffer or the LarderError per key.")
      .def("stats_json", &PyStore::StatsJson,
           "This client's transfer counters as JSON: by route and by peer (EngineStats).")
      .def(
          "batch_put",
          [](PyStore& self, const std::vector<std::string>& keys, const py::sequence& values,
             uint32_t replica_num, std::optional<std::vector<std::string>> preferred_segments,
             bool pin, py::handle soft_pin, py::handle soft_pin_ttl, bool overwrite,
             bool disk_write_through) {
            return self.BatchPut(keys, values,
                                 MakePutConfig(replica_num, preferred_segments, pin, soft_pin,
                                               soft_pin_ttl, overwrite, disk_write_through));
          },
          py::arg("keys"), py::arg("values"), py::kw_only(), py::arg("replica_num") = 0,
          py::arg("preferred_segments") = py::none(), py::arg("pin") = false,
          py::arg("soft_pin") = py::none(), py::arg("soft_pin_ttl") = py::none(),
          py::arg("overwrite") = false, py::arg("disk_write_through") = false,
          "Stores every value under its key in one master round trip. Returns a list with None "
          "for each stored key and the LarderError of each failed one.")
      .def("batch_get", &PyStore::BatchGet, py::arg("keys"),
           "Returns a list with the bytes of each key, or its LarderError (e.g. NotFoundError).")
      // ---- zero-copy API ----
      .def("register_buffer", &PyStore::RegisterBuffer, py::arg("buffer"),
           py::arg("size") = py::none(),
           R"doc(Registers memory for put_from / get_into and their batch forms.

``buffer`` is a bytes-like object (kept alive and in place until unregister_buffer or close)
or an integer address with ``size``. Raises InvalidArgumentError when empty or overlapping a
registered buffer.)doc")
      .def("unregister_buffer", &PyStore::UnregisterBuffer, py::arg("buffer"),
           "Unregisters the buffer that starts at ``buffer`` (the object or its address). "
           "Raises NotFoundError when none does.")
      .def(
          "put_from",
          [](PyStore& self, const std::string& key, py::handle buffer, py::handle size,
             uint32_t replica_num, std::optional<std::vector<std::string>> preferred_segments,
             bool pin, py::handle soft_pin, py::handle soft_pin_ttl, bool overwrite,
             bool disk_write_through) {
            self.PutFrom(key, buffer, size,
                         MakePutConfig(replica_num, preferred_segments, pin, soft_pin, soft_pin_ttl,
                                       overwrite, disk_write_through));
          },
          py::arg("key"), py::arg("buffer"), py::arg("size") = py::none(), py::kw_only(),
          py::arg("replica_num") = 0, py::arg("preferred_segments") = py::none(),
          py::arg("pin") = false, py::arg("soft_pin") = py::none(),
          py::arg("soft_pin_ttl") = py::none(), py::arg("overwrite") = false,
          py::arg("disk_write_through") = false,
          "Stores ``size`` bytes (default: the whole buffer) read straight from registered memory. "
          "Raises FailedPreconditionError when the range is not inside a registered buffer, and "
          "as put otherwise.")
      .def("get_into", &PyStore::GetInto, py::arg("key"), py::arg("buffer"),
           py::arg("size") = py::none(),
           "Copies the value of ``key`` straight into registered memory of capacity ``size`` "
           "(default: the whole buffer) and returns its length. Raises NotFoundError, "
           "InvalidArgumentError (value larger than the capacity) or FailedPreconditionError "
           "(not registered).")
      .def(
          "batch_put_from",
          [](PyStore& self, const std::vector<std::string>& keys, const py::sequence& buffers,
             py::handle sizes, uint32_t replica_num,
             std::optional<std::vector<std::string>> preferred_segments, bool pin,
             py::handle soft_pin, py::handle soft_pin_ttl, bool overwrite,
             bool disk_write_through) {
            return self.BatchPutFrom(keys, buffers, sizes,
                                     MakePutConfig(replica_num, preferred_segments, pin, soft_pin,
                                                   soft_pin_ttl, overwrite, disk_write_through));
          },
          py::arg("keys"), py::arg("buffers"), py::arg("sizes") = py::none(), py::kw_only(),
          py::arg("replica_num") = 0, py::arg("preferred_segments") = py::none(),
          py::arg("pin") = false, py::arg("soft_pin") = py::none(),
          py::arg("soft_pin_ttl") = py::none(), py::arg("overwrite") = false,
          py::arg("disk_write_through") = false,
          "put_from for many keys in one master round trip and one transfer batch. ``buffers`` "
          "holds addresses or bytes-like objects; ``sizes`` is required with addresses. Returns "
          "None or the LarderError per key.")
      .def("batch_get_into", &PyStore::BatchGetInto, py::arg("keys"), py::arg("buffers"),
           py::arg("sizes") = py::none(),
           "get_into for many keys in one master round trip and one transfer batch. Returns the "
           "bytes read or the LarderError per key.")
      .def(
          "batch_put_from_slices",
          [](PyStore& self, const std::vector<std::string>& keys, const py::sequence& buffers,
             py::handle sizes, uint32_t replica_num,
             std::optional<std::vector<std::string>> preferred_segments, bool pin,
             py::handle soft_pin, py::handle soft_pin_ttl, bool overwrite,
             bool disk_write_through) {
            return self.BatchPutFromSlices(
                keys, buffers, sizes,
                MakePutConfig(replica_num, preferred_segments, pin, soft_pin, soft_pin_ttl,
                              overwrite, disk_write_through));
          },
          py::arg("keys"), py::arg("buffers"), py::arg("sizes") = py::none(), py::kw_only(),
          py::arg("replica_num") = 0, py::arg("preferred_segments") = py::none(),
          py::arg("pin") = false, py::arg("soft_pin") = py::none(),
          py::arg("soft_pin_ttl") = py::none(), py::arg("overwrite") = false,
          py::arg("disk_write_through") = false,
          "Scatter-gather put: the value of keys[i] is the concatenation of the registered "
          "buffers buffers[i] (objects, or addresses with sizes[i]), e.g. one slice per layer of "
          "a layer-first KV pool. Returns None or the LarderError per key.")
      .def("batch_get_into_slices", &PyStore::BatchGetIntoSlices, py::arg("keys"),
           py::arg("buffers"), py::arg("sizes") = py::none(),
           "Reads the value of keys[i] across the registered buffers buffers[i], in order. "
           "Returns its size or the LarderError per key (InvalidArgumentError when the buffers "
           "hold fewer bytes than the value).")
      .def("batch_get_ranges", &PyStore::BatchGetRanges, py::arg("keys"), py::arg("offsets"),
           py::arg("buffers"), py::arg("sizes") = py::none(),
           "Reads sizes[i] bytes of keys[i]'s value from byte offsets[i] into registered "
           "buffers[i]. Returns the bytes read or the LarderError per range (OutOfRangeError "
           "when the range runs past the value).")
      // ---- metadata ----
      .def("exist", &PyStore::Exist, py::arg("key"),
           "True when ``key`` is stored and complete. Takes no lease.")
      .def("batch_exist", &PyStore::BatchExist, py::arg("keys"),
           "Returns True / False or the LarderError per key, in one master round trip.")
      .def("get_size", &PyStore::GetSize, py::arg("key"),
           "The value's size in bytes. Raises NotFoundError.")
      .def("remove", &PyStore::Remove, py::arg("key"), py::kw_only(), py::arg("force") = false,
           "Deletes ``key``. Raises NotFoundError, or UnavailableError while a reader holds a "
           "lease (unless ``force``: readers finish reading the old bytes) or it is being "
           "written (retry later).")
      .def("batch_remove", &PyStore::BatchRemove, py::arg("keys"), py::kw_only(),
           py::arg("force") = false, py::arg("segment") = "", py::arg("unused_for") = 0.0,
           "Returns None or the LarderError per key. With ``segment`` (a segment's name), "
           "removes only each key's replica there (the object goes with its last replica); "
           "NotFoundError for a key with no replica there. With ``unused_for`` (seconds), "
           "objects put or read within that long stay: UnavailableError (leased) for them.")
      .def("remove_all", &PyStore::RemoveAll, py::kw_only(), py::arg("force") = false,
           "Removes every object of this tenant no reader holds a lease on (with ``force``, "
           "leased ones too); returns how many were removed. Needs the admin token on a master "
           "with a cluster token.")
      .def("remove_by_regex", &PyStore::RemoveByRegex, py::arg("pattern"), py::kw_only(),
           py::arg("force") = false,
           "Removes the objects of this tenant whose whole key matches ``pattern`` (RE2 "
           "syntax); returns how many. Raises InvalidArgumentError for a bad pattern.")
      .def("batch_get_object_info", &PyStore::BatchGetObjectInfo, py::arg("keys"),
           "Size and replica locations (ObjectInfo) per key, or its LarderError. Takes no "
           "lease.")
      .def("route_to", &PyStore::RouteTo, py::arg("segment_name"),
           "The route transfers to that segment take: 'local', 'shm', 'tcp' or 'device'. Raises "
           "NotFoundError (no such segment mounted) or UnavailableError.")
      .def("__repr__", [](const PyStore& self) {
        if (self.closed()) return std::string("<larder.Store closed>");
        return "<larder.Store segment='" + self.Client()->segment_name() + "'>";
      });
}

}  // namespace larder::python
