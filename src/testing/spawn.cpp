#include "testing/spawn.hpp"

#include <condition_variable>
#include <mutex>
#include <thread>

namespace jobguard::testing_detail {

pid_t on_spawner_thread(const std::function<pid_t()>& fork_fn) {
  struct Spawner {
    std::mutex mu;
    std::condition_variable cv;
    const std::function<pid_t()>* job = nullptr;
    pid_t result = -1;
    bool done = false;
    Spawner() {
      std::thread([this] {
        std::unique_lock<std::mutex> g(mu);
        for (;;) {
          cv.wait(g, [this] { return job != nullptr; });
          result = (*job)();
          job = nullptr;
          done = true;
          cv.notify_all();
        }
      }).detach();
    }
  };
  static Spawner* sp = new Spawner();  // never destroyed: its thread runs until exit
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> serial(one_at_a_time);
  std::unique_lock<std::mutex> g(sp->mu);
  sp->done = false;
  sp->job = &fork_fn;
  sp->cv.notify_all();
  sp->cv.wait(g, [&] { return sp->done; });
  return sp->result;
}

}  // namespace jobguard::testing_detail
