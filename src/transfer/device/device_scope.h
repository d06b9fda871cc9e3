// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// DeviceScope: makes a device current on the calling thread for one scope and restores the
// thread's own device after it, as every native call of the device transport needs.
#pragma once

#include "transfer/device/device_backend.h"

namespace larder::transfer {

class DeviceScope {
 public:
  DeviceScope(DeviceBackend& backend, int device) : backend_(backend) {
    auto current = backend.CurrentDevice();
    previous_ = current.ok() ? *current : -1;
    if (previous_ != device) {
      status_ = backend.SetCurrentDevice(device);
      switched_ = status_.ok();
    }
  }
  // Restores the thread's own device (-1: none, as before the scope).
  ~DeviceScope() {
    if (switched_) backend_.SetCurrentDevice(previous_).IgnoreError();
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  const Status& status() const { return status_; }

 private:
  DeviceBackend& backend_;
  int previous_ = -1;
  bool switched_ = false;
  Status status_;
};

}  // namespace larder::transfer
