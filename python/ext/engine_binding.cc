// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// larder.TransferEngine: a PD engine (PD transfers) over larder::TransferEngine, plus the
// value types it passes around.
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "buffers.h"
#include "errors.h"
#include "gil.h"
#include "larder/transfer_engine.h"

namespace larder::python {
namespace {

// One request's outcome, as Python sees it.
struct PyTransferResult {
  py::object error;  // None, or the LarderError of this request
  uint64_t bytes = 0;
  std::string route;
};

std::vector<PyTransferResult> ToPyResults(const std::vector<TransferResult>& results) {
  std::vector<PyTransferResult> out;
  out.reserve(results.size());
  for (const TransferResult& r : results) {
    out.push_back({ErrorObject(r.status), r.bytes, std::string(RouteKindName(r.route))});
  }
  return out;
}

// A request deadline: None gives 0, which the engine reads as its default_timeout.
std::chrono::milliseconds RequestTimeout(py::handle timeout) {
  return timeout.is_none() ? std::chrono::milliseconds(0) : ToMilliseconds(timeout, "timeout");
}

std::vector<std::string> RouteNames(const std::vector<RouteKind>& routes) {
  std::vector<std::string> names;
  for (RouteKind route : routes) names.emplace_back(RouteKindName(route));
  return names;
}

class PyEngine {
 public:
  explicit PyEngine(const TransferEngineOptions& options) {
    auto created = WithoutGil([&] { return TransferEngine::Create(options); });
    engine_ = std::shared_ptr<TransferEngine>(ValueOrThrow(std::move(created)));
  }

  ~PyEngine() { Close(); }

  // Stops the engine; then drops the views that kept exported Python buffers alive.
  void Close() {
    std::shared_ptr<TransferEngine> engine = std::move(engine_);
    if (engine) WithoutGil([&] { engine.reset(); });
    segment_views_.clear();
    local_views_.clear();
  }

  bool closed() const { return engine_ == nullptr; }

  std::shared_ptr<TransferEngine> Engine() const {
    if (!engine_) throw StatusError(FailedPreconditionError("the transfer engine is closed"));
    return engine_;
  }

  SegmentId RegisterSegment(const std::string& name, py::handle memory, py::handle size) {
    auto engine = Engine();
    if (py::isinstance<MemoryRegion>(memory)) {
      if (!size.is_none()) {
        throw py::type_error("size applies to addresses and buffers, not to a MemoryRegion");
      }
      auto region = memory.cast<std::shared_ptr<MemoryRegion>>();
      return ValueOrThrow(WithoutGil([&] { return engine->RegisterSegment(name, region); }));
    }
    ByteRange range = ByteRange::From(memory, size, /*writable=*/true);
    SegmentId id = ValueOrThrow(
        WithoutGil([&] { return engine->RegisterSegment(name, range.data(), range.size()); }));
    if (range.holds_view()) segment_views_.insert_or_assign(id, std::move(range));
    return id;
  }

  void UnregisterSegment(SegmentId id) {
    auto engine = Engine();
    ThrowIfError(WithoutGil([&] { return engine->UnregisterSegment(id); }));
    segment_views_.erase(id);
  }

  void RegisterLocalMemory(py::handle buffer, py::handle size) {
    auto engine = Engine();
    ByteRange range = ByteRange::From(buffer, size, /*writable=*/false);
    ThrowIfError(
        WithoutGil([&] { return engine->RegisterLocalMemory(range.data(), range.size()); }));
    if (range.holds_view()) {
      auto address = reinterpret_cast<uintptr_t>(range.data());
      local_views_.insert_or_assign(address, std::move(range));
    }
  }

  void UnregisterLocalMemory(py::handle buffer) {
    auto engine = Engine();
    auto address = AddressOf(buffer);
    ThrowIfError(WithoutGil(
        [&] { return engine->UnregisterLocalMemory(reinterpret_cast<void*>(address)); }));
    local_views_.erase(address);
  }

  // read / write: one request, raising on failure; returns the bytes moved.
  uint64_t TransferOne(TransferOp op, SegmentHandle segment, uint64_t offset, py::handle local,
                       py::handle length, py::handle timeout) {
    auto engine = Engine();
    ByteRange range = ByteRange::From(local, length, /*writable=*/op == TransferOp::kRead);
    std::chrono::milliseconds deadline = RequestTimeout(timeout);
    TransferRequest request{op, range.data(), segment, offset, range.size()};
    auto results = ValueOrThrow(
        WithoutGil([&] { return engine->TransferSync(std::span(&request, 1), deadline); }));
    ThrowIfError(results.at(0).status);
    return results[0].bytes;
  }

  std::vector<PyTransferResult> Transfer(const std::vector<TransferRequest>& requests,
                                         py::handle timeout) {
    auto engine = Engine();
    std::chrono::milliseconds deadline = RequestTimeout(timeout);
    return ToPyResults(
        ValueOrThrow(WithoutGil([&] { return engine->TransferSync(requests, deadline); })));
  }

  // ---- the asynchronous API: submit, then poll / wait, results, release ----

  BatchId Submit(const std::vector<TransferRequest>& requests, py::handle timeout) {
    auto engine = Engine();
    std::chrono::milliseconds deadline = RequestTimeout(timeout);
    return ValueOrThrow(WithoutGil([&] { return engine->Submit(requests, deadline); }));
  }

  bool Poll(BatchId batch) {
    auto engine = Engine();
    return ValueOrThrow(WithoutGil([&] { return engine->Poll(batch); }));
  }

  // Waits for the batch, then raises the first failed request's error, if any. With no timeout
  // it waits in one-second steps (the requests' deadlines bound it) and lets Python signal
  // handlers run between them, so Ctrl-C interrupts a wait.
  void Wait(BatchId batch, py::handle timeout) {
    auto engine = Engine();
    if (timeout.is_none()) {
      for (;;) {
        Status waited = WithoutGil([&] { return engine->Wait(batch, std::chrono::seconds(1)); });
        if (waited.ok()) break;
        if (waited.code() != StatusCode::kDeadlineExceeded) throw StatusError(waited);
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      }
    } else {
      std::chrono::milliseconds limit = ToMilliseconds(timeout, "timeout");
      ThrowIfError(WithoutGil([&] { return engine->Wait(batch, limit); }));
    }
    ThrowIfError(engine->BatchStatus(batch));
  }

  std::vector<PyTransferResult> Results(BatchId batch) {
    auto engine = Engine();
    return ToPyResults(ValueOrThrow(engine->Results(batch)));
  }

  void Release(BatchId batch) {
    auto engine = Engine();
    ThrowIfError(WithoutGil([&] { return engine->Release(batch); }));
  }

 private:
  std::shared_ptr<TransferEngine> engine_;  // null once closed
  // Views of Python buffers exported as segments (by id) or registered as local memory (by
  // address); they keep the memory alive and in place while the engine may touch it.
  std::map<SegmentId, ByteRange> segment_views_;
  std::map<uintptr_t, ByteRange> local_views_;
};

TransferOp ParseOp(py::handle op) {
  if (py::isinstance<TransferOp>(op)) return op.cast<TransferOp>();
  std::string name = op.cast<std::string>();
  if (name == "read") return TransferOp::kRead;
  if (name == "write") return TransferOp::kWrite;
  throw StatusError(InvalidArgumentError("op must be 'read' or 'write', not '" + name + "'"));
}

TransferEngineOptions MakeEngineOptions(py::handle protocol, py::handle listen_address,
                                        py::handle auth_token, py::handle host_id,
                                        const std::string& role, size_t copy_threads,
                                        py::handle slice_bytes, py::handle default_timeout,
                                        size_t tcp_connections_per_peer,
                                        bool require_local_registration, bool use_huge_pages,
                                        bool shm_prefault) {
  TransferEngineOptions options;
  options.role = ToEngineRole(role);
  if (!protocol.is_none()) options.protocol = protocol.cast<std::string>();
  if (!listen_address.is_none()) options.listen_address = listen_address.cast<std::string>();
  if (!auth_token.is_none()) options.auth_token = auth_token.cast<std::string>();
  if (!host_id.is_none()) options.host_id = host_id.cast<std::string>();
  options.copy_threads = copy_threads;
  if (!slice_bytes.is_none()) options.slice_bytes = ToByteSize(slice_bytes, "slice_bytes");
  if (!default_timeout.is_none()) {
    options.default_timeout = ToMilliseconds(default_timeout, "default_timeout");
  }
  options.tcp_connections_per_peer = tcp_connections_per_peer;
  options.require_local_registration = require_local_registration;
  options.use_huge_pages = use_huge_pages;
  options.shm_prefault = shm_prefault;
  return options;
}

constexpr const char* kEngineDoc =
    R"doc(Moves bytes between this process's memory and segments exported by engines here, in other
processes of this host (shm) or on other hosts (tcp).

A target exports memory as a named segment (register_segment); an initiator finds it with
list_peer_segments(address) or opens it by name (open_segment(address, name)) and reads or writes
it by (segment handle, offset). Every access is bounds-checked on both ends.

Args:
    protocol: "auto" (local, then shm, then tcp), "tcp", "shm", "shm,tcp", ... (default:
        LARDER_PROTOCOL for role "pd", else "auto").
    listen_address: "ip:port" of this engine's data server; port 0 picks one (default
        "127.0.0.1:0"). Peers reach this engine at ``address``.
    auth_token, host_id: as in docs/configuration.md (defaults from LARDER_AUTH_TOKEN,
        LARDER_HOST_ID).
    role: "pd" or "store" (which protocol variable applies).
    copy_threads, slice_bytes, default_timeout (seconds), tcp_connections_per_peer,
    require_local_registration, use_huge_pages, shm_prefault: engine tuning.

transfer(requests) moves a batch and waits for it; submit(requests) starts one and returns its id,
to follow with poll / wait, results and release.

Memory exported with register_segment(name, buffer_or_address) stays in the caller's hands and
is reached by same-host peers over tcp; memory from allocate_segment_memory is a memfd that
same-host peers map (shm). Every call releases the GIL while it waits. Thread-safe.)doc";

}  // namespace

void BindEngine(py::module_& module) {
  py::enum_<TransferOp>(module, "TransferOp", "Direction of a transfer request.")
      .value("READ", TransferOp::kRead, "segment -> local memory")
      .value("WRITE", TransferOp::kWrite, "local memory -> segment");

  py::class_<MemoryRegion, std::shared_ptr<MemoryRegion>>(
      module, "MemoryRegion", py::buffer_protocol(),
      "Memory owned by Larder (from TransferEngine.allocate_segment_memory); freed when the last "
      "reference goes. Supports the buffer protocol: numpy.frombuffer(region, dtype=...) or "
      "memoryview(region) view it without a copy.")
      .def_property_readonly(
          "address",
          [](const MemoryRegion& self) { return reinterpret_cast<uintptr_t>(self.data()); },
          "Start address.")
      .def_property_readonly("size", &MemoryRegion::size, "Length in bytes.")
      .def_property_readonly(
          "kind", [](const MemoryRegion& self) { return std::string(MemoryKindName(self.kind())); },
          "'anonymous', 'memfd' (mappable by same-host peers) or 'device'.")
      .def_property_readonly("huge_pages", &MemoryRegion::huge_pages)
      .def("__len__", &MemoryRegion::size)
      .def_buffer([](MemoryRegion& self) {
        return py::buffer_info(self.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(self.size())}, {1});
      })
      .def("__repr__", [](const MemoryRegion& self) {
        return "<larder.MemoryRegion " + std::to_string(self.size()) + " bytes, " +
               std::string(MemoryKindName(self.kind())) + ">";
      });

  py::class_<SegmentDescriptor>(module, "SegmentDescriptor",
                                "Everything a peer needs to reach a segment.")
      .def_readonly("segment_id", &SegmentDescriptor::segment_id)
      .def_readonly("name", &SegmentDescriptor::name)
      .def_readonly("epoch", &SegmentDescriptor::epoch)
      .def_readonly("engine_id", &SegmentDescriptor::engine_id)
      .def_readonly("host_id", &SegmentDescriptor::host_id)
      .def_readonly("address", &SegmentDescriptor::address,
                    "The owner engine's address (\"ip:port\").")
      .def_property_readonly(
          "transports",
          [](const SegmentDescriptor& self) {
            std::vector<std::string> names;
            for (const auto& [name, blob] : self.transports) names.push_back(name);
            return names;
          },
          "Names of the transports that export the segment, e.g. ['shm', 'tcp'].")
      .def_readonly("size", &SegmentDescriptor::size)
      .def_property_readonly("memory_kind",
                             [](const SegmentDescriptor& self) {
                               return std::string(MemoryKindName(self.memory_kind));
                             })
      .def("to_json", &SegmentDescriptor::ToJson, "The descriptor as JSON text.")
      .def_static(
          "from_json",
          [](const std::string& json) { return ValueOrThrow(SegmentDescriptor::FromJson(json)); },
          py::arg("json"), "Parses to_json's output. Raises InvalidArgumentError.")
      .def("__repr__", [](const SegmentDescriptor& self) {
        return "<larder.SegmentDescriptor '" + self.name + "' at " + self.address + ", " +
               std::to_string(self.size) + " bytes>";
      });

  py::class_<TransferRequest>(module, "TransferRequest",
                              "One request of TransferEngine.transfer: move ``length`` bytes "
                              "between local address ``local`` and (``segment``, ``offset``).")
      .def(py::init([](py::handle op, uint64_t local, SegmentHandle segment, uint64_t offset,
                       uint64_t length) {
             return TransferRequest{ParseOp(op), reinterpret_cast<void*>(local), segment, offset,
                                    length};
           }),
           py::arg("op"), py::arg("local"), py::arg("segment"), py::arg("offset"),
           py::arg("length"))
      .def_readwrite("op", &TransferRequest::op)
      .def_property(
          "local", [](const TransferRequest& r) { return reinterpret_cast<uintptr_t>(r.local); },
          [](TransferRequest& r, uint64_t address) { r.local = reinterpret_cast<void*>(address); })
      .def_readwrite("segment", &TransferRequest::segment)
      .def_readwrite("offset", &TransferRequest::offset)
      .def_readwrite("length", &TransferRequest::length)
      .def("__repr__", [](const TransferRequest& r) {
        return std::string("<larder.TransferRequest ") +
               (r.op == TransferOp::kRead ? "read" : "write") +
               " segment=" + std::to_string(r.segment) + " offset=" + std::to_string(r.offset) +
               " length=" + std::to_string(r.length) + ">";
      });

  py::class_<PyTransferResult>(module, "TransferResult", "Outcome of one transfer request.")
      .def_readonly("error", &PyTransferResult::error, "None, or this request's LarderError.")
      .def_readonly("bytes", &PyTransferResult::bytes, "Bytes moved.")
      .def_readonly("route", &PyTransferResult::route, "'local', 'shm', 'tcp', 'device', 'none'.")
      .def_property_readonly("ok", [](const PyTransferResult& r) { return r.error.is_none(); })
      .def("__repr__", [](const PyTransferResult& r) {
        return "<larder.TransferResult " + std::string(r.error.is_none() ? "ok" : "error") +
               " bytes=" + std::to_string(r.bytes) + " route=" + r.route + ">";
      });

  py::class_<PyEngine>(module, "TransferEngine", kEngineDoc)
      .def(py::init([](py::object protocol, py::object listen_address, py::object auth_token,
                       py::object host_id, const std::string& role, size_t copy_threads,
                       py::object slice_bytes, py::object default_timeout,
                       size_t tcp_connections_per_peer, bool require_local_registration,
                       bool use_huge_pages, bool shm_prefault) {
             return std::make_unique<PyEngine>(MakeEngineOptions(
                 protocol, listen_address, auth_token, host_id, role, copy_threads, slice_bytes,
                 default_timeout, tcp_connections_per_peer, require_local_registration,
                 use_huge_pages, shm_prefault));
           }),
           py::arg("protocol") = py::none(), py::kw_only(), py::arg("listen_address") = py::none(),
           py::arg("auth_token") = py::none(), py::arg("host_id") = py::none(),
           py::arg("role") = "pd", py::arg("copy_threads") = 0, py::arg("slice_bytes") = py::none(),
           py::arg("default_timeout") = py::none(), py::arg("tcp_connections_per_peer") = 4,
           py::arg("require_local_registration") = false, py::arg("use_huge_pages") = false,
           py::arg("shm_prefault") = false)
      .def("close", &PyEngine::Close,
           "Stops the servers and transports; later calls raise FailedPreconditionError.")
      .def_property_readonly("closed", &PyEngine::closed)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyEngine& self, py::handle, py::handle, py::handle) {
             self.Close();
             return false;
           })
      .def_property_readonly(
          "id", [](const PyEngine& self) { return self.Engine()->id(); },
          "'<host_id>/<pid>/<fingerprint>'.")
      .def_property_readonly("host_id",
                             [](const PyEngine& self) { return self.Engine()->host_id(); })
      .def_property_readonly(
          "address", [](const PyEngine& self) { return self.Engine()->address(); },
          "'ip:port' of the data server: what peers pass to list_peer_segments / open_segment.")
      .def_property_readonly(
          "routes", [](const PyEngine& self) { return RouteNames(self.Engine()->routes()); },
          "Enabled routes in preference order, e.g. ['local', 'shm', 'tcp'].")
      .def(
          "allocate_segment_memory",
          [](PyEngine& self, py::handle size) {
            auto engine = self.Engine();
            uint64_t bytes = ToByteSize(size, "size");
            return ValueOrThrow(WithoutGil([&] { return engine->AllocateSegmentMemory(bytes); }));
          },
          py::arg("size"),
          "Zeroed memory suited to export (a memfd when shm is enabled, so same-host peers map "
          "it). Raises InvalidArgumentError for 0, ResourceExhaustedError when memory is short.")
      .def("register_segment", &PyEngine::RegisterSegment, py::arg("name"), py::arg("memory"),
           py::arg("size") = py::none(),
           "Exports ``memory`` (a MemoryRegion, a writable bytes-like object kept alive until "
           "unregistered, or an address with ``size``) as segment ``name``; returns its id. "
           "Raises AlreadyExistsError when the name is taken.")
      .def("unregister_segment", &PyEngine::UnregisterSegment, py::arg("segment_id"),
           "After this returns no transfer touches the segment. Raises NotFoundError.")
      .def(
          "list_segments", [](const PyEngine& self) { return self.Engine()->ListSegments(); },
          "Descriptors of this engine's exported segments.")
      .def("register_local_memory", &PyEngine::RegisterLocalMemory, py::arg("buffer"),
           py::arg("size") = py::none(),
           "Registers local memory as a transfer source/destination (needed only with "
           "require_local_registration or device transports). Raises AlreadyExistsError on "
           "overlap.")
      .def("unregister_local_memory", &PyEngine::UnregisterLocalMemory, py::arg("buffer"),
           "Raises NotFoundError when no registration starts there.")
      .def(
          "list_peer_segments",
          [](PyEngine& self, const std::string& address, py::handle timeout) {
            auto engine = self.Engine();
            auto deadline = ToMilliseconds(timeout, "timeout");
            return ValueOrThrow(
                WithoutGil([&] { return engine->ListPeerSegments(address, deadline); }));
          },
          py::arg("address"), py::arg("timeout") = 5.0,
          "Descriptors of the segments the engine at ``address`` ('ip:port') exports. Raises "
          "UnavailableError when unreachable, PermissionDeniedError on a token mismatch.")
      .def(
          "open_segment",
          [](PyEngine& self, const std::string& address, const std::string& name) {
            auto engine = self.Engine();
            return ValueOrThrow(WithoutGil([&] { return engine->OpenSegment(address, name); }));
          },
          py::arg("address"), py::arg("name"),
          "Opens segment ``name`` of the engine at ``address`` and returns a handle. Raises "
          "NotFoundError, UnavailableError.")
      .def(
          "open_segment",
          [](PyEngine& self, const SegmentDescriptor& descriptor) {
            auto engine = self.Engine();
            return ValueOrThrow(WithoutGil([&] { return engine->OpenSegment(descriptor); }));
          },
          py::arg("descriptor"), "Opens the segment a descriptor names.")
      .def(
          "close_segment",
          [](PyEngine& self, SegmentHandle handle) {
            auto engine = self.Engine();
            ThrowIfError(WithoutGil([&] { return engine->CloseSegment(handle); }));
          },
          py::arg("handle"))
      .def(
          "segment_route",
          [](PyEngine& self, SegmentHandle handle) {
            return std::string(RouteKindName(ValueOrThrow(self.Engine()->SegmentRoute(handle))));
          },
          py::arg("handle"), "'local', 'shm', 'tcp' or 'device'.")
      .def(
          "segment_info",
          [](PyEngine& self, SegmentHandle handle) {
            return ValueOrThrow(self.Engine()->SegmentInfo(handle));
          },
          py::arg("handle"))
      .def(
          "read",
          [](PyEngine& self, SegmentHandle segment, uint64_t offset, py::handle buffer,
             py::handle length, py::handle timeout) {
            return self.TransferOne(TransferOp::kRead, segment, offset, buffer, length, timeout);
          },
          py::arg("segment"), py::arg("offset"), py::arg("buffer"), py::arg("length") = py::none(),
          py::kw_only(), py::arg("timeout") = py::none(),
          "Reads ``length`` bytes (default: len(buffer)) at ``offset`` of the segment into "
          "``buffer`` (writable bytes-like or address). Returns the bytes read; raises on failure "
          "(OutOfRangeError past the end, UnavailableError when the peer is gone...).")
      .def(
          "write",
          [](PyEngine& self, SegmentHandle segment, uint64_t offset, py::handle buffer,
             py::handle length, py::handle timeout) {
            return self.TransferOne(TransferOp::kWrite, segment, offset, buffer, length, timeout);
          },
          py::arg("segment"), py::arg("offset"), py::arg("buffer"), py::arg("length") = py::none(),
          py::kw_only(), py::arg("timeout") = py::none(),
          "Writes ``buffer`` (or its first ``length`` bytes) at ``offset`` of the segment.")
      .def("transfer", &PyEngine::Transfer, py::arg("requests"), py::kw_only(),
           py::arg("timeout") = py::none(),
           "Submits the TransferRequests as one batch and waits for all of them. Returns one "
           "TransferResult per request. Raises only when the batch as a whole is refused (empty "
           "or too large: InvalidArgumentError).")
      .def("submit", &PyEngine::Submit, py::arg("requests"), py::kw_only(),
           py::arg("timeout") = py::none(),
           "Starts the TransferRequests as one batch and returns its id (a positive int) at once; "
           "each request must finish within ``timeout`` seconds (default: the engine's "
           "default_timeout). The local memory the requests name must stay valid and untouched "
           "until the batch is complete. Malformed requests fail on their own (see results). "
           "Raises InvalidArgumentError for an empty or oversized batch, "
           "ResourceExhaustedError when 65536 batches are unreleased. Follow with poll or wait, "
           "then results, then release.")
      .def("poll", &PyEngine::Poll, py::arg("batch"),
           "True when every request of the batch has finished. Does not block. Raises "
           "NotFoundError for an unknown or released id.")
      .def("wait", &PyEngine::Wait, py::arg("batch"), py::arg("timeout") = py::none(),
           "Blocks until the batch is complete, at most ``timeout`` seconds (None: until its "
           "requests end, which their deadlines bound). Returns None when every request "
           "succeeded; raises the first failed request's error (its message names the request) "
           "when one failed, DeadlineExceededError when ``timeout`` passed first (the batch keeps "
           "running: poll tells which), NotFoundError for an unknown id. The batch stays until "
           "release, whatever wait did.")
      .def("results", &PyEngine::Results, py::arg("batch"),
           "One TransferResult per request, in submission order. Raises "
           "FailedPreconditionError while the batch is running, NotFoundError for an unknown id.")
      .def("release", &PyEngine::Release, py::arg("batch"),
           "Frees a complete batch; its id becomes unknown. Raises FailedPreconditionError while "
           "it is running, NotFoundError for an unknown id.")
      .def("__repr__", [](const PyEngine& self) {
        if (self.closed()) return std::string("<larder.TransferEngine closed>");
        return "<larder.TransferEngine at " + self.Engine()->address() + ">";
      });
}

}  // namespace larder::python
