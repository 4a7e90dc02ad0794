// The progress engine (core/progress): tasks from many threads all run to completion, in
// submission order per thread, steps never overlap for one task, and stop() finishes what
// was submitted before it. Also the pure placement rule, bind_choice.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/progress.hpp"

using namespace streamcoll::progress;

namespace {

struct Record {
  std::atomic<int> finished{0};
  std::atomic<int> steps_in_flight{0};
  std::atomic<bool> overlap{false};
  std::atomic<bool> off_thread{false};
  // Per submitting thread, the index of the last task that finished first step.
  std::vector<std::atomic<int>> last_started;
  std::atomic<bool> out_of_order{false};
  explicit Record(int threads) : last_started(threads) {
    for (auto& x : last_started) x = -1;
  }
};

class CountingTask final : public Task {
 public:
  CountingTask(Record* r, int thread, int index, int steps)
      : r_(r), thread_(thread), index_(index), left_(steps) {}
  bool step() override {
    if (!on_engine_thread()) r_->off_thread = true;
    if (r_->steps_in_flight.fetch_add(1) != 0) r_->overlap = true;
    if (!started_) {
      started_ = true;
      // Tasks of one submitter start in the order it submitted them.
      int prev = r_->last_started[thread_].exchange(index_);
      if (prev != index_ - 1) r_->out_of_order = true;
    }
    bool done = --left_ <= 0;
    r_->steps_in_flight.fetch_sub(1);
    if (done) r_->finished.fetch_add(1);
    return done;
  }

 private:
  Record* r_;
  int thread_, index_, left_;
  bool started_ = false;
};

}  // namespace

// A task with nothing to do until a time (Task::idle_until_ns) lets the engine sleep
// instead of stepping it in a loop; wake() (work handed over by another thread) steps it
// again before that time. Runs before the test below stops the engine for good.
class SleepyTask final : public Task {
 public:
  explicit SleepyTask(std::atomic<int>* steps, std::atomic<bool>* finish) : steps_(steps), finish_(finish) {}
  bool step() override {
    steps_->fetch_add(1);
    return finish_->load();
  }
  uint64_t idle_until_ns() const override {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count()) +
           60ull * 1000 * 1000 * 1000;  // a minute: only wake() steps it again
  }

 private:
  std::atomic<int>* steps_;
  std::atomic<bool>* finish_;
};

TEST_CASE("progress engine: idle tasks sleep until woken") {
  std::atomic<int> steps{0};
  std::atomic<bool> finish{false};
  REQUIRE(submit(new SleepyTask(&steps, &finish)));
  auto wait_for = [&](int n) {
    for (int i = 0; i < 5000 && steps.load() < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return steps.load() >= n;
  };
  REQUIRE(wait_for(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int idle_steps = steps.load();
  CHECK(idle_steps <= 2);  // a spinning engine steps it thousands of times in 50 ms
  finish = true;
  wake();
  CHECK(wait_for(idle_steps + 1));  // stepped again well before its minute is up
  for (int i = 0; i < 5000 && running() && steps.load() == idle_steps; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(steps.load() == idle_steps + 1);  // finished: stepped no more
}

TEST_CASE("progress engine: tasks from several threads, then stop") {
  constexpr int kThreads = 4, kPerThread = 2000;
  Record rec(kThreads);
  CHECK_FALSE(on_engine_thread());
  std::vector<std::thread> submitters;
  for (int t = 0; t < kThreads; ++t)
    submitters.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        REQUIRE(submit(new CountingTask(&rec, t, i, 1 + (i * 7 + t) % 5)));
        if (i % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let it sleep
      }
    });
  for (auto& th : submitters) th.join();
  CHECK(running());
  // A task submitted last, with many steps: stop() must still finish it.
  REQUIRE(submit(new CountingTask(&rec, 0, kPerThread, 10000)));
  stop();
  CHECK_FALSE(running());
  CHECK(rec.finished.load() == kThreads * kPerThread + 1);
  CHECK_FALSE(rec.overlap.load());
  CHECK_FALSE(rec.off_thread.load());
  CHECK_FALSE(rec.out_of_order.load());
  // Stopped for good: submissions are refused (and the task stays the caller's).
  auto* late = new CountingTask(&rec, 0, 0, 1);
  CHECK_FALSE(submit(late));
  delete late;
  stop();  // idempotent
}

TEST_CASE("progress thread placement") {
  bool sibling = true;
  // Unbound or bound to a shared set: one core per local rank, from the last core,
  // never the application's core.
  CHECK(bind_choice(16, 2, 0, 0, &sibling) == 15);
  CHECK_FALSE(sibling);
  CHECK(bind_choice(16, 2, 0, 1, &sibling) == 14);
  CHECK(bind_choice(16, 1, 15, 0, &sibling) == 14);  // the application is on the last core
  CHECK(bind_choice(4, 1, 1, 2, &sibling) == 0);     // local rank 2 of 4 -> core 1 is main -> 0
  CHECK(bind_choice(4, 1, 0, 5, &sibling) == 2);     // ranks beyond the core count wrap
  CHECK(bind_choice(2, 1, 1, 0, &sibling) == 0);
  CHECK(bind_choice(2, 1, -1, 0, &sibling) == 1);    // application's core unknown
  // Bound to one core: its other hardware thread, or nowhere else.
  CHECK(bind_choice(1, 2, 0, 0, &sibling) == 0);
  CHECK(sibling);
  CHECK(bind_choice(1, 1, 0, 0, &sibling) == -1);
  CHECK_FALSE(sibling);
  CHECK(bind_choice(0, 1, -1, 0, &sibling) == -1);
  for (int cores = 2; cores <= 64; ++cores)
    for (int main_core = -1; main_core < cores; ++main_core)
      for (int lr = 0; lr < 2 * cores; ++lr) {
        int c = bind_choice(cores, 1, main_core, lr, &sibling);
        REQUIRE(c >= 0);
        REQUIRE(c < cores);
        REQUIRE(c != main_core);
      }
}
