// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// DiskOptions from LARDER_DISK_* settings.
#include <cstdlib>
#include <string>

#include "common/env.h"
#include "common/net.h"
#include "disk/disk_store.h"

namespace larder::disk {

Status ParseDiskCapacity(std::string_view text, DiskOptions* options) {
  if (!text.empty() && text.back() == '%') {
    std::string number(text.substr(0, text.size() - 1));
    char* end = nullptr;
    const double percent = std::strtod(number.c_str(), &end);
    if (number.empty() || end != number.c_str() + number.size() || !(percent > 0) ||
        percent > 100) {
      return InvalidArgumentError("disk capacity '" + std::string(text) +
                                  "': a percentage must be in (0, 100]");
    }
    options->capacity_bytes = 0;
    options->capacity_percent = percent;
    return Status::Ok();
  }
  auto bytes = ParseByteSize(text);
  if (!bytes.ok()) {
    return InvalidArgumentError("disk capacity '" + std::string(text) +
                                "': give a size (\"200G\") or a percentage of the file system "
                                "(\"40%\")");
  }
  options->capacity_bytes = *bytes;
  return Status::Ok();
}

Result<DiskOptions> DiskOptionsFromEnv(DiskOptions base) {
  DiskOptions options = std::move(base);
  if (std::string path = GetEnv("LARDER_DISK_PATH"); !path.empty()) options.path = path;
  if (std::string capacity = GetEnv("LARDER_DISK_CAPACITY"); !capacity.empty()) {
    LARDER_RETURN_IF_ERROR(ParseDiskCapacity(capacity, &options));
  }
  if (std::string size = GetEnv("LARDER_DISK_REGION_SIZE"); !size.empty()) {
    LARDER_ASSIGN_OR_RETURN(options.region_size, ParseByteSize(size));
  }
  auto fraction = [](const char* name, double* out) -> Status {
    std::string text = GetEnv(name);
    if (text.empty()) return Status::Ok();
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size() || !(value > 0) || value > 1) {
      return InvalidArgumentError(std::string(name) + "='" + text +
                                  "': a fraction of the capacity in (0, 1]");
    }
    *out = value;
    return Status::Ok();
  };
  LARDER_RETURN_IF_ERROR(fraction("LARDER_DISK_HIGH_WATERMARK", &options.high_watermark));
  LARDER_RETURN_IF_ERROR(fraction("LARDER_DISK_LOW_WATERMARK", &options.low_watermark));
  if (std::string budget = GetEnv("LARDER_DISK_WRITE_BUDGET"); !budget.empty()) {
    auto bytes = ParseByteSize(budget);
    if (!bytes.ok()) {
      return InvalidArgumentError("LARDER_DISK_WRITE_BUDGET='" + budget +
                                  "': bytes per second, e.g. 200M (0: no limit)");
    }
    options.write_budget = *bytes;
  }
  if (std::string depth = GetEnv("LARDER_DISK_QUEUE_DEPTH"); !depth.empty()) {
    char* end = nullptr;
    const unsigned long value = std::strtoul(depth.c_str(), &end, 10);
    if (end != depth.c_str() + depth.size() || value == 0 || value > 4096) {
      return InvalidArgumentError("LARDER_DISK_QUEUE_DEPTH='" + depth + "': 1 to 4096");
    }
    options.queue_depth = static_cast<unsigned>(value);
  }
  if (std::string direct = GetEnv("LARDER_DISK_DIRECT_IO"); !direct.empty()) {
    if (direct == "auto") {
      options.direct_io = DirectIo::kAuto;
    } else if (direct == "on" || direct == "1") {
      options.direct_io = DirectIo::kOn;
    } else if (direct == "off" || direct == "0") {
      options.direct_io = DirectIo::kOff;
    } else {
      return InvalidArgumentError("LARDER_DISK_DIRECT_IO='" + direct + "': auto, on or off");
    }
  }
  if (std::string uring = GetEnv("LARDER_DISK_IO_URING"); !uring.empty()) {
    if (uring != "0" && uring != "1") {
      return InvalidArgumentError("LARDER_DISK_IO_URING='" + uring + "': 0 or 1");
    }
    options.io_uring = uring == "1";
  }
  if (std::string delay = GetEnv("LARDER_DISK_TEST_IO_DELAY"); !delay.empty()) {
    LARDER_ASSIGN_OR_RETURN(options.test_io_delay, ParseDuration(delay));
  }
  return options;
}

}  // namespace larder::disk
