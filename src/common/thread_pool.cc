// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/thread_pool.h"

#include <pthread.h>

#include "common/priority.h"

namespace larder {

ThreadPool::ThreadPool(size_t threads, std::string name, int nice_increment) {
  if (threads == 0) threads = 1;
  for (size_t i = 0; i < threads; ++i) {
    workers_.emplace_back([this, nice_increment] { Run(nice_increment); });
    std::string thread_name = (name + std::to_string(i)).substr(0, 15);
    pthread_setname_np(workers_.back().native_handle(), thread_name.c_str());
  }
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  {
    MutexLock lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.Signal();
}

void ThreadPool::Run(int nice_increment) {
  if (nice_increment > 0) LowerThisThreadPriority(nice_increment);
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(mu_);
      idle_.fetch_add(1, std::memory_order_relaxed);
      while (!stopping_ && tasks_.empty()) cv_.Wait(lock);
      idle_.fetch_sub(1, std::memory_order_relaxed);
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace larder
