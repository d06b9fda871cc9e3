// Copyright Larder authors. Licensed under the Apache License, Version 2.0.
//
// Mutexes whose use the compiler checks. A member that a mutex guards says so
// (LARDER_GUARDED_BY(mu_)), a function that needs a lock held says so (LARDER_REQUIRES(mu_)), and
// every clang build of our code (the checked build of `make test` among them) compiles with
// -Wthread-safety -Werror, which refuses code that reads or writes a guarded member without its
// lock. gcc ignores the annotations.
//
// Mutex and SharedMutex are std::mutex and std::shared_mutex with the annotations the standard
// library lacks; MutexLock, ReaderLock and WriterLock hold them for a scope (MutexLock may let go
// and take the lock again inside it); CondVar waits on a MutexLock. A wait never takes a
// predicate: the caller loops on its condition, where the analysis sees the lock held:
//
//   MutexLock lock(mu_);
//   while (!stopping_ && cv_.WaitUntil(lock, deadline)) {}
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define LARDER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define LARDER_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (a "capability" to clang).
#define LARDER_CAPABILITY(name) LARDER_THREAD_ANNOTATION(capability(name))
// A type whose objects hold a lock for their lifetime.
#define LARDER_SCOPED_CAPABILITY LARDER_THREAD_ANNOTATION(scoped_lockable)
// A member read or written only with the lock held (shared suffices to read).
#define LARDER_GUARDED_BY(mu) LARDER_THREAD_ANNOTATION(guarded_by(mu))
// A pointer member whose pointee is read or written only with the lock held.
#define LARDER_PT_GUARDED_BY(mu) LARDER_THREAD_ANNOTATION(pt_guarded_by(mu))
// Locks that must be taken before this one, when both are held.
#define LARDER_ACQUIRED_AFTER(...) LARDER_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
// The function's caller holds the lock (exclusively / at least shared).
#define LARDER_REQUIRES(...) LARDER_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define LARDER_REQUIRES_SHARED(...) \
  LARDER_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// The function takes the lock and returns with it held (exclusively / shared).
#define LARDER_ACQUIRE(...) LARDER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define LARDER_ACQUIRE_SHARED(...) LARDER_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
// The function lets go of a lock its caller held.
#define LARDER_RELEASE(...) LARDER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define LARDER_RELEASE_SHARED(...) LARDER_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define LARDER_RELEASE_GENERIC(...) \
  LARDER_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
// The function takes the lock when it returns `result`.
#define LARDER_TRY_ACQUIRE(...) LARDER_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// The caller must not hold the lock (the function takes it).
#define LARDER_EXCLUDES(...) LARDER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function returns a reference to the lock.
#define LARDER_RETURN_CAPABILITY(x) LARDER_THREAD_ANNOTATION(lock_returned(x))
// Tells the analysis that the lock is held here (checked by nothing; say why where it is used).
#define LARDER_ASSERT_CAPABILITY(x) LARDER_THREAD_ANNOTATION(assert_capability(x))
// Leaves a function out of the analysis. Say why where it is used.
#define LARDER_NO_THREAD_SAFETY_ANALYSIS LARDER_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace larder {

class CondVar;

class LARDER_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() LARDER_ACQUIRE() { mu_.lock(); }
  void Unlock() LARDER_RELEASE() { mu_.unlock(); }
  bool TryLock() LARDER_TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that the calling thread holds this mutex (a callback run under it).
  void AssertHeld() const LARDER_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

class LARDER_CAPABILITY("shared mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() LARDER_ACQUIRE() { mu_.lock(); }
  void Unlock() LARDER_RELEASE() { mu_.unlock(); }
  void LockShared() LARDER_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() LARDER_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a Mutex from construction to destruction, and may let go of it and take it again between.
class LARDER_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) LARDER_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() LARDER_RELEASE() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Lets go of the mutex until Lock (or for the rest of the scope).
  void Unlock() LARDER_RELEASE() {
    held_ = false;
    mu_.Unlock();
  }
  void Lock() LARDER_ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }

 private:
  friend class CondVar;
  Mutex& mu_;
  bool held_ = true;
};

// Holds a SharedMutex shared (readers) or exclusively (writers) for a scope.
class LARDER_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mu) LARDER_ACQUIRE_SHARED(mu) : mu_(mu) { mu_.LockShared(); }
  ~ReaderLock() LARDER_RELEASE() { mu_.UnlockShared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex& mu_;
};

class LARDER_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mu) LARDER_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~WriterLock() LARDER_RELEASE() { mu_.Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex& mu_;
};

// A condition variable for a Mutex held by a MutexLock. Wakeups may be spurious: loop on the
// condition.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Lets go of the lock while it waits; holds it again when it returns.
  void Wait(MutexLock& lock) {
    std::unique_lock native(lock.mu_.mu_, std::adopt_lock);
    cv_.wait(native);
    native.release();
  }
  // As Wait; false when `deadline` passed (the caller checks its condition once more).
  template <typename Clock, typename Duration>
  bool WaitUntil(MutexLock& lock, std::chrono::time_point<Clock, Duration> deadline) {
    std::unique_lock native(lock.mu_.mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(native, deadline) == std::cv_status::no_timeout;
    native.release();
    return woken;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace larder
