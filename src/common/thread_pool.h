// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// A fixed-size pool of worker threads running queued tasks in FIFO order.
// Thread safety: Schedule may be called from any thread, including from inside a task.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace larder {

class ThreadPool {
 public:
  // Starts `threads` workers (at least 1), named `name` for debuggers, each with `nice_increment`
  // added to its nice value (common/priority.h; 0: as the creating thread).
  ThreadPool(size_t threads, std::string name, int nice_increment = 0);
  // Runs every task already queued, then joins the workers.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> task);
  size_t size() const { return workers_.size(); }
  // Workers waiting for work right now (a hint: it may change as soon as it is read).
  size_t idle() const { return idle_.load(std::memory_order_relaxed); }

 private:
  void Run(int nice_increment);

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> tasks_ LARDER_GUARDED_BY(mu_);
  bool stopping_ LARDER_GUARDED_BY(mu_) = false;
  std::atomic<size_t> idle_{0};
  std::vector<std::thread> workers_;
};

}  // namespace larder
