// The lease scheduler's deadline queue: deadlines rounded up into buckets of
// a fixed width, one vector of entries per bucket. A renewal is a push_back
// into a bucket that is hot (the next few hundred milliseconds hold every
// renewal that is due soon) instead of a node allocated into, and later
// erased from, a tree of every live lease: with 100,000 leases the tree's
// cache misses and allocations were a third of the scheduler's CPU.
//
// Entries are never searched for: a caller that moves or drops an item
// leaves its old entry behind and tells them apart by a generation it stores
// in the item (push's `gen`). Stale entries cost memory until their bucket
// comes due, or until clear().
//
// Sans-IO and single-threaded: the owner's event loop drives it; unit tests
// drive it with made-up time points.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace jobguard::detail {

template <class T>
class DeadlineBuckets {
 public:
  using Clock = std::chrono::steady_clock;
  using time_point = Clock::time_point;

  struct Entry {
    time_point at;
    T item;
    std::uint64_t gen;
  };

  explicit DeadlineBuckets(Clock::duration width) : width_(width.count() > 0 ? width.count() : 1) {}

  void push(time_point at, T item, std::uint64_t gen) {
    buckets_[index(at)].push_back(Entry{at, std::move(item), gen});
    ++entries_;
  }

  // The end of the earliest bucket: every entry in it is due by then (waking
  // there is at most one width late, never early). max() when empty.
  time_point next() const {
    if (buckets_.empty()) return time_point::max();
    return time_point(Clock::duration((buckets_.begin()->first + 1) * width_));
  }

  // Hands every entry of the buckets that begin at or before `until` to
  // fn(Entry&), earliest bucket first. fn returns true to take the entry out,
  // false to keep it where it was (a deadline not yet due for its own
  // coalescing window). fn must not push.
  template <class F>
  void take_until(time_point until, F&& fn) {
    std::vector<Entry> kept;
    auto it = buckets_.begin();
    while (it != buckets_.end() && it->first * width_ <= until.time_since_epoch().count()) {
      for (auto& e : it->second) {
        if (fn(e)) {
          --entries_;
        } else {
          kept.push_back(std::move(e));
        }
      }
      it = buckets_.erase(it);
    }
    for (auto& e : kept) buckets_[index(e.at)].push_back(std::move(e));
  }

  template <class F>
  void for_each(F&& fn) const {
    for (const auto& [i, v] : buckets_)
      for (const auto& e : v) fn(e);
  }

  void clear() {
    buckets_.clear();
    entries_ = 0;
  }
  bool empty() const noexcept { return entries_ == 0; }
  std::size_t size() const noexcept { return entries_; }

 private:
  Clock::rep index(time_point at) const {
    // Floor division: time points before the clock's epoch (a fake clock's)
    // still land in the bucket that contains them.
    const auto c = at.time_since_epoch().count();
    return c >= 0 ? c / width_ : -((-c + width_ - 1) / width_);
  }

  Clock::rep width_;
  std::map<Clock::rep, std::vector<Entry>> buckets_;
  std::size_t entries_ = 0;
};

}  // namespace jobguard::detail
