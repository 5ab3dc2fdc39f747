// The team of thread_pool.h.
//
// One job at a time: the caller publishes it (the body, the team size, the loop counters at 0), bumps
// `generation_` and wakes sleeping workers; each worker runs the body as its member, then counts itself
// out of `pending_`; the caller runs the body as member 0, then waits for `pending_` to reach 0, so a job's
// state is never overwritten while a worker still reads it. Every wait (a worker's for the next job, a
// member's at a barrier, the caller's for the last worker) spins for the budget, then sleeps on a futex;
// the side that changes a futex word wakes the others only when one announced that it sleeps (seq_cst
// store then load on both sides: at least one of the two sees the other).
#include "thread_pool.h"

#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace llaisys::cpu {
namespace {

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");  // the spin-wait hint (a no-op on cores without SMT)
#endif
}

using Clock = std::chrono::steady_clock;

// Spinning pays only while the team has the cores to itself. When other programs compete for them, a
// spinning thread spends the CPU time by which the scheduler ranks it, and is then run late when it has
// work (decoding next to two busy loops ran 5x slower than with sleeping threads). So each member counts
// how often it is preempted (involuntary context switches): at more than kBusyRate per second over a
// window it stops all spinning for a while, and sleeping threads are woken on time, as with
// OMP_WAIT_POLICY=passive. (Measured on a 2-core VM decoding: ~25 preemptions per second per thread on
// idle cores, from the kernel's own threads; 350-600 next to two busy loops.)
constexpr long kBusyRate = 100;
constexpr auto kRateWindow = std::chrono::milliseconds(50);
constexpr auto kNoSpinWhenBusy = std::chrono::milliseconds(250);
std::atomic<Clock::rep> no_spin_until{0};

void note_preemptions() {
    static thread_local Clock::time_point window_start{};
    static thread_local long window_count = -1;
    const auto now = Clock::now();
    if (now - window_start < kRateWindow) return;
    rusage usage;
    if (getrusage(RUSAGE_THREAD, &usage) != 0) return;
    const double seconds = std::chrono::duration<double>(now - window_start).count();
    if (window_count >= 0 && double(usage.ru_nivcsw - window_count) > kBusyRate * seconds)
        no_spin_until.store((now + kNoSpinWhenBusy).time_since_epoch().count(), std::memory_order_relaxed);
    window_start = now;
    window_count = usage.ru_nivcsw;
}

// Spins until done() or the budget is spent; true if done() came true. Yields the core every 64 checks:
// the thread we wait for may be the one that needs it.
template <class Done>
bool spin_until(Done done) {
    const auto budget = std::chrono::microseconds(spin_microseconds());
    if (budget.count() == 0) return done();
    const auto start = Clock::now();
    if (start.time_since_epoch().count() < no_spin_until.load(std::memory_order_relaxed)) return done();
    for (unsigned i = 1;; ++i) {
        if (done()) return true;
        cpu_relax();
        if (i % 64 == 0) {
            if (Clock::now() - start > budget) return done();
            sched_yield();
        }
    }
}

// Waits until word != value: spinning, then asleep (sleepers counts the sleeping waiters).
void wait_for_change(std::atomic<uint32_t>& word, uint32_t value, std::atomic<uint32_t>& sleepers) {
    if (spin_until([&] { return word.load(std::memory_order_acquire) != value; })) return;
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    while (word.load(std::memory_order_seq_cst) == value) futex_wait(word, value);
    sleepers.fetch_sub(1, std::memory_order_relaxed);
}

// Changes word (an increment) and wakes its sleeping waiters.
void change_and_wake(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers) {
    word.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(word);
}

thread_local bool in_team = false;  // this thread is a member of a running team (nested calls run alone)

using Body = void (*)(void*, Team&);

class Pool {
  public:
    static constexpr int kLoops = 4;  // for_each loops per job

    // Runs the job on `size` members; false if the pool is taken (the caller then runs it alone).
    bool run(Body body, void* context, int size) {
        std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
        if (!lock.owns_lock()) return false;
        while (workers_ < size - 1) start_worker();
        body_ = body;
        context_ = context;
        size_ = size;
        error_ = nullptr;
        if (share_capacity_ < kLoops * size) {  // (no worker reads it between jobs)
            share_next_.reset(new ShareCounter[size_t(kLoops * size)]);
            share_capacity_ = kLoops * size;
        }
        for (int c = 0; c < kLoops * size; ++c) share_next_[c].next.store(0, std::memory_order_relaxed);
        arrived_.store(0, std::memory_order_relaxed);
        pending_.store(uint32_t(workers_), std::memory_order_relaxed);
        change_and_wake(generation_, job_sleepers_);  // publishes the job
        run_member(0);
        note_preemptions();
        // until the last worker is out (pending_ 0; the caller sleeps on done_, which that worker bumps,
        // possibly after the caller saw pending_ 0: a stale bump only costs the next job one more look)
        while (pending_.load(std::memory_order_acquire) != 0) {
            const uint32_t done = done_.load(std::memory_order_seq_cst);
            if (pending_.load(std::memory_order_seq_cst) == 0) break;
            wait_for_change(done_, done, done_sleepers_);
        }
        if (error_) std::rethrow_exception(error_);
        return true;
    }

    void for_each(Team& team, int loop, int64_t n, void (*fn)(void*, int64_t), void* context, bool nowait) {
        if (loop >= kLoops) throw std::logic_error("a team job ran more loops than the pool keeps counters for");
        // Member m's share: items [begin(m), begin(m + 1)), n / size each (the first n % size one more). It
        // works through its own share in order, then helps with the others' (m + 1, m + 2, ...): the items
        // a member takes are consecutive (a kernel's next block is the one it prefetched) unless the work
        // is uneven (another program holds a core), and then the idle members take the rest.
        const int size = team.size();
        const int64_t q = n / size, r = n % size;
        ShareCounter* next = &share_next_[size_t(loop * size)];
        for (int k = 0; k < size; ++k) {
            const int m = (team.member() + k) % size;
            const int64_t begin = m * q + std::min<int64_t>(m, r), count = q + (m < r);
            for (int64_t i; (i = next[m].next.fetch_add(1, std::memory_order_relaxed)) < count;) {
                try {
                    fn(context, begin + i);
                } catch (...) {
                    record(std::current_exception());
                }
            }
        }
        if (!nowait && size > 1) barrier();
    }

  private:
    void start_worker() {
        // the worker waits for the job after the current one: this one is published after it starts
        const uint32_t seen = generation_.load(std::memory_order_relaxed);
        const int member = ++workers_;
        std::thread([this, member, seen] { worker_loop(member, seen); }).detach();
    }

    void worker_loop(int member, uint32_t seen) {
        in_team = true;
        for (;;) {
            wait_for_change(generation_, seen, job_sleepers_);
            seen = generation_.load(std::memory_order_acquire);
            if (member < size_) run_member(member);  // (a smaller team than the pool: sit this job out)
            note_preemptions();
            if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) change_and_wake(done_, done_sleepers_);
        }
    }

    void run_member(int member) {
        Team team(this, member, size_);
        try {
            body_(context_, team);
        } catch (...) {
            record(std::current_exception());
        }
    }

    void record(std::exception_ptr error) {
        std::lock_guard<std::mutex> guard(error_lock_);
        if (!error_) error_ = error;
    }

    // All size_ members arrive before any leaves.
    void barrier() {
        const uint32_t phase = phase_.load(std::memory_order_acquire);
        if (arrived_.fetch_add(1, std::memory_order_acq_rel) == uint32_t(size_ - 1)) {
            arrived_.store(0, std::memory_order_relaxed);
            change_and_wake(phase_, phase_sleepers_);
        } else {
            wait_for_change(phase_, phase, phase_sleepers_);
        }
    }

    std::mutex busy_;  // held by the thread whose job runs
    int workers_ = 0;  // started (detached: the pool lives as long as the process)
    Body body_ = nullptr;  // the job, written by the caller before generation_ moves
    void* context_ = nullptr;
    int size_ = 1;
    std::mutex error_lock_;
    std::exception_ptr error_;
    alignas(64) std::atomic<uint32_t> generation_{0};  // futex word: a new job
    std::atomic<uint32_t> job_sleepers_{0};
    alignas(64) std::atomic<uint32_t> pending_{0};  // workers not yet done with the job
    std::atomic<uint32_t> done_{0};                 // futex word: the last worker finished a job
    std::atomic<uint32_t> done_sleepers_{0};
    alignas(64) std::atomic<uint32_t> arrived_{0};  // members at the barrier
    std::atomic<uint32_t> phase_{0};                // futex word: barriers passed
    std::atomic<uint32_t> phase_sleepers_{0};
    struct alignas(64) ShareCounter {  // one per cache line: each member claims from its own
        std::atomic<int64_t> next;        // the next item of a member's share, from its beginning
    };
    std::unique_ptr<ShareCounter[]> share_next_;  // [loop][member] of the current job
    int share_capacity_ = 0;
};

// The process's pool, made on first use and never destroyed (its threads are detached). A child of fork()
// has none of the parent's threads: it starts a pool of its own.
std::atomic<Pool*> the_pool{nullptr};

Pool& pool() {
    if (Pool* p = the_pool.load(std::memory_order_acquire)) return *p;
    static std::mutex make_lock;
    std::lock_guard<std::mutex> guard(make_lock);
    static const int atfork = pthread_atfork(nullptr, nullptr, [] { the_pool.store(nullptr); });
    (void)atfork;
    if (!the_pool.load()) the_pool.store(new Pool());
    return *the_pool.load();
}

}  // namespace

void Team::for_each(int64_t n, void (*fn)(void*, int64_t), void* context, bool nowait) {
    if (!pool_) {
        for (int64_t i = 0; i < n; ++i) fn(context, i);
        return;
    }
    static_cast<Pool*>(pool_)->for_each(*this, loops_++, n, fn, context, nowait);
}

int team_size() { return omp_get_max_threads(); }

int spin_microseconds() {
    static const int us = [] {
        const char* v = std::getenv("LLAISYS_CPU_SPIN_US");
        return v && *v ? std::max(0, std::atoi(v)) : 100;
    }();
    return us;
}

void run_team(bool parallel, void (*body)(void*, Team&), void* context) {
    const int size = parallel ? team_size() : 1;
    if (size > 1 && !in_team && !omp_in_parallel()) {
        in_team = true;
        struct Leave { ~Leave() { in_team = false; } } leave;
        if (pool().run(body, context, size)) return;
    }
    Team alone(nullptr, 0, 1);
    body(context, alone);
}

}  // namespace llaisys::cpu
