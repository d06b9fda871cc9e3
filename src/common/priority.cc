// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
#include "common/priority.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>

namespace larder {

std::atomic<int> LatencyWorkScope::running_{0};

void LowerThisThreadPriority(int increment) {
  // On Linux, PRIO_PROCESS with a thread id acts on that thread only.
  auto tid = static_cast<id_t>(gettid());
  errno = 0;
  int current = getpriority(PRIO_PROCESS, tid);
  if (current == -1 && errno != 0) return;
  setpriority(PRIO_PROCESS, tid, current + increment);
}

void RaiseThisThreadPriority() {
  setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kLatencyNice);
}

void YieldToLatencyWork() {
  if (LatencyWorkScope::Running()) sched_yield();
}

}  // namespace larder
