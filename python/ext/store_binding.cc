// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder.Store: StoreClient with Pythonic names. Single-key calls raise on error; batch calls
// return one item per key, the LarderError instance in place of a failed item.
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "buffers.h"
#include "errors.h"
#include "gil.h"
#include "larder/store_client.h"

namespace larder::python {
namespace {

PutConfig MakePutConfig(uint32_t replica_num,
                        const std::optional<std::vector<std::string>>& preferred_segments,
                        bool pin) {
  PutConfig config;
  config.replica_num = replica_num;
  if (preferred_segments) config.preferred_segments = *preferred_segments;
  config.pin = pin;
  return config;
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
  explicit PyStore(const StoreClientOptions& options) {
    auto created = WithoutGil([&] { return StoreClient::Create(options); });
    client_ = std::shared_ptr<StoreClient>(ValueOrThrow(std::move(created)));
  }

  ~PyStore() { Close(); }

  // Unmounts the segment and stops heartbeats. Calls in flight in other threads finish first
  // (they hold their own reference). Idempotent.
  void Close() {
    std::shared_ptr<StoreClient> client = std::move(client_);
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
    auto read = WithoutGil([&] { return client->BatchGetInto(keys, ptrs, capacities); });
    py::list list(read.size());
    for (size_t i = 0; i < read.size(); ++i) {
      list[i] = read[i].ok() ? py::object(py::int_(*read[i])) : ErrorObject(read[i].status());
    }
    return list;
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

  void Remove(const std::string& key) {
    auto client = Client();
    ThrowIfError(WithoutGil([&] { return client->Remove(key); }));
  }

  py::list BatchRemove(const std::vector<std::string>& keys) {
    auto client = Client();
    return StatusList(WithoutGil([&] { return client->BatchRemove(keys); }));
  }

  uint64_t RemoveAll() {
    auto client = Client();
    return ValueOrThrow(WithoutGil([&] { return client->RemoveAll(); }));
  }

  std::string RouteTo(const std::string& segment_name) {
    auto client = Client();
    RouteKind route = ValueOrThrow(WithoutGil([&] { return client->RouteTo(segment_name); }));
    return std::string(RouteKindName(route));
  }

 private:
  std::shared_ptr<StoreClient> client_;  // null once closed
  // Views of buffers registered as Python objects, by address: they keep the memory alive and
  // in place until unregister_buffer or close.
  std::map<uintptr_t, ByteRange> pinned_;
};

StoreClientOptions MakeOptions(py::handle master, py::handle local_hostname,
                               py::handle segment_name, py::handle global_segment_size,
                               py::handle local_buffer_size, py::handle protocol,
                               py::handle replica_num, py::handle auth_token, py::handle host_id,
                               py::handle heartbeat_interval, py::handle rpc_timeout,
                               py::handle transfer_timeout) {
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
  return options;
}

constexpr const char* kStoreDoc =
    R"doc(A process's handle on the Larder store, the shared KV-cache pool.

Creating a Store contributes ``global_segment_size`` bytes of this process's memory to the pool,
mounts it with larder-master and starts heartbeats. Every argument left as None takes the value
of its LARDER_* environment variable (LARDER_MASTER, LARDER_LOCAL_HOSTNAME,
LARDER_GLOBAL_SEGMENT_SIZE, ...), else the default of docs/configuration.md.

Args:
    master: larder-master's "host:port" (default "127.0.0.1:50051").
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

Raises:
    UnavailableError: the master cannot be reached.
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
  py::class_<PyStore>(module, "Store", kStoreDoc)
      .def(py::init([](py::object master, py::object local_hostname, py::object segment_name,
                       py::object global_segment_size, py::object local_buffer_size,
                       py::object protocol, py::object replica_num, py::object auth_token,
                       py::object host_id, py::object heartbeat_interval, py::object rpc_timeout,
                       py::object transfer_timeout) {
             return std::make_unique<PyStore>(
                 MakeOptions(master, local_hostname, segment_name, global_segment_size,
                             local_buffer_size, protocol, replica_num, auth_token, host_id,
                             heartbeat_interval, rpc_timeout, transfer_timeout));
           }),
           py::arg("master") = py::none(), py::kw_only(), py::arg("local_hostname") = py::none(),
           py::arg("segment_name") = py::none(), py::arg("global_segment_size") = py::none(),
           py::arg("local_buffer_size") = py::none(), py::arg("protocol") = py::none(),
           py::arg("replica_num") = py::none(), py::arg("auth_token") = py::none(),
           py::arg("host_id") = py::none(), py::arg("heartbeat_interval") = py::none(),
           py::arg("rpc_timeout") = py::none(), py::arg("transfer_timeout") = py::none())
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
             std::optional<std::vector<std::string>> preferred_segments, bool pin) {
            self.Put(key, value, MakePutConfig(replica_num, preferred_segments, pin));
          },
          py::arg("key"), py::arg("value"), py::kw_only(), py::arg("replica_num") = 0,
          py::arg("preferred_segments") = py::none(), py::arg("pin") = false,
          R"doc(Stores ``value`` (any bytes-like object) under ``key``.

Succeeds without rewriting when the key already exists. ``replica_num`` 0 uses the store's
default; ``preferred_segments`` lists segment names to place replicas in first; pinned objects
are never evicted (only remove deletes them).

Raises InvalidArgumentError (empty key or value), ResourceExhaustedError (pool full),
UnavailableError (master or peer unreachable: retry).)doc")
      .def("get", &PyStore::Get, py::arg("key"),
           "Returns the value of ``key`` as bytes. Raises NotFoundError when missing, "
           "UnavailableError while it is being written or when unreachable.")
      .def(
          "batch_put",
          [](PyStore& self, const std::vector<std::string>& keys, const py::sequence& values,
             uint32_t replica_num, std::optional<std::vector<std::string>> preferred_segments,
             bool pin) {
            return self.BatchPut(keys, values, MakePutConfig(replica_num, preferred_segments, pin));
          },
          py::arg("keys"), py::arg("values"), py::kw_only(), py::arg("replica_num") = 0,
          py::arg("preferred_segments") = py::none(), py::arg("pin") = false,
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
             bool pin) {
            self.PutFrom(key, buffer, size, MakePutConfig(replica_num, preferred_segments, pin));
          },
          py::arg("key"), py::arg("buffer"), py::arg("size") = py::none(), py::kw_only(),
          py::arg("replica_num") = 0, py::arg("preferred_segments") = py::none(),
          py::arg("pin") = false,
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
             std::optional<std::vector<std::string>> preferred_segments, bool pin) {
            return self.BatchPutFrom(keys, buffers, sizes,
                                     MakePutConfig(replica_num, preferred_segments, pin));
          },
          py::arg("keys"), py::arg("buffers"), py::arg("sizes") = py::none(), py::kw_only(),
          py::arg("replica_num") = 0, py::arg("preferred_segments") = py::none(),
          py::arg("pin") = false,
          "put_from for many keys in one master round trip and one transfer batch. ``buffers`` "
          "holds addresses or bytes-like objects; ``sizes`` is required with addresses. Returns "
          "None or the LarderError per key.")
      .def("batch_get_into", &PyStore::BatchGetInto, py::arg("keys"), py::arg("buffers"),
           py::arg("sizes") = py::none(),
           "get_into for many keys in one master round trip and one transfer batch. Returns the "
           "bytes read or the LarderError per key.")
      // ---- metadata ----
      .def("exist", &PyStore::Exist, py::arg("key"),
           "True when ``key`` is stored and complete. Takes no lease.")
      .def("batch_exist", &PyStore::BatchExist, py::arg("keys"),
           "Returns True / False or the LarderError per key, in one master round trip.")
      .def("get_size", &PyStore::GetSize, py::arg("key"),
           "The value's size in bytes. Raises NotFoundError.")
      .def("remove", &PyStore::Remove, py::arg("key"),
           "Deletes ``key``. Raises NotFoundError, or UnavailableError while a reader holds a "
           "lease or it is being written (retry later).")
      .def("batch_remove", &PyStore::BatchRemove, py::arg("keys"),
           "Returns None or the LarderError per key.")
      .def("remove_all", &PyStore::RemoveAll,
           "Removes every object no reader holds a lease on; returns how many were removed.")
      .def("route_to", &PyStore::RouteTo, py::arg("segment_name"),
           "The route transfers to that segment take: 'local', 'shm', 'tcp' or 'device'. Raises "
           "NotFoundError (no such segment mounted) or UnavailableError.")
      .def("__repr__", [](const PyStore& self) {
        if (self.closed()) return std::string("<larder.Store closed>");
        return "<larder.Store segment='" + self.Client()->segment_name() + "'>";
      });
}

}  // namespace larder::python
