// The background half of FleetExporter and RedisWatcher: one thread that
// renders a text every `refresh` and keeps the last one for readers, so a
// scrape on the HTTP loop never waits on Redis (except for the first render,
// at most `first_wait`). Implemented in redis_watch.cpp.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace jobguard::ops::detail {

class Refresher {
 public:
  // `initial` is what text() returns until the first render ends. `render`
  // runs on the refresher's thread only, never concurrently with itself, so
  // the state it keeps between renders needs no lock; whatever it reads must
  // outlive the refresher (declare the Refresher after it: members are
  // destroyed in reverse order, and the destructor joins the thread).
  Refresher(std::string initial, std::chrono::milliseconds refresh, std::chrono::milliseconds first_wait,
            std::function<std::string()> render);
  ~Refresher();
  Refresher(const Refresher&) = delete;
  Refresher& operator=(const Refresher&) = delete;

  // The latest text; before the first render has ended, waits for it at most
  // `first_wait`. Any thread.
  std::string text() const;

 private:
  void loop();

  const std::chrono::milliseconds refresh_, first_wait_;
  const std::function<std::string()> render_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool stopping_ = false;
  bool first_done_ = false;
  std::string text_;
  // Last: started once everything above exists.
  std::thread thread_;
};

}  // namespace jobguard::ops::detail
