// The CPU kernels' threads: a team of the calling thread and omp_get_max_threads() - 1 workers (so
// OMP_NUM_THREADS sizes it), which wait for the next kernel by spinning briefly, then sleeping.
//
// Why not OpenMP's threads: between two kernels they either spin for milliseconds (GNU OpenMP's default,
// ruinous when other programs share the cores, see README "CPU threads") or, with OMP_WAIT_POLICY=passive,
// sleep at once, and waking a sleeping thread costs tens of microseconds on a VM, at each of a decode
// step's ~200 linears. These workers spin for a short budget (LLAISYS_CPU_SPIN_US, default 100 us),
// which covers the gap between two kernels of a step, then sleep on a futex; and they stop spinning for
// a while when they find that another program took their core (see thread_pool.cpp).
//
// A call from inside a team's work, from an OpenMP parallel region, or while another thread's call holds
// the team runs on the calling thread alone.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace llaisys::cpu {

// One member's view of a running team (see run_team).
class Team {
  public:
    int member() const { return member_; }  // 0 (the caller) .. size() - 1
    int size() const { return size_; }
    // fn(context, i) for every i in [0, n): each member first takes the items of its own contiguous share
    // (about n / size() of them) one at a time, in order, then helps with the other members' shares, so
    // that a member's items are consecutive and a busy core's work goes to the free ones; every member
    // must call it (the same loops in the same order). Unless nowait, it returns when all members
    // are done with the loop (a barrier). An exception thrown by fn is rethrown by run_team (the first
    // one; the loop's other items still run).
    // (for_each(team, n, body) below takes a lambda)
    void for_each(int64_t n, void (*fn)(void* context, int64_t i), void* context, bool nowait = false);

    Team(void* pool, int member, int size) : pool_(pool), member_(member), size_(size) {}

  private:
    void* pool_;  // null: a team of one
    int member_, size_, loops_ = 0;
};

// body(context, team) on every member of a team at once (like an OpenMP parallel region; body must not
// throw outside for_each); with parallel false, on the calling thread alone as a team of one.
void run_team(bool parallel, void (*body)(void* context, Team& team), void* context);

// The team size a parallel call gets (omp_get_max_threads()).
int team_size();

// The spin budget in microseconds (LLAISYS_CPU_SPIN_US, read once; 0: sleep at once).
int spin_microseconds();

}  // namespace llaisys::cpu

// (in each build's own namespace where there is one: the kernels' lambdas differ per instruction set)
#if defined(LLAISYS_ISA)
namespace llaisys::cpu::LLAISYS_ISA {
#else
namespace llaisys::cpu {
#endif

template <class F>
void run_team(bool parallel, F&& body) {
    using Body = std::remove_reference_t<F>;
    ::llaisys::cpu::run_team(parallel, [](void* c, Team& team) { (*static_cast<Body*>(c))(team); }, &body);
}

// team.for_each with body(i) for each item i.
template <class F>
void for_each(Team& team, int64_t n, F&& body, bool nowait = false) {
    using Body = std::remove_reference_t<F>;
    team.for_each(n, [](void* c, int64_t i) { (*static_cast<Body*>(c))(i); }, &body, nowait);
}

// task(t) for every t in [0, tasks), one at a time, each member its own consecutive tasks first (see
// Team::for_each; on the team when `parallel`).
template <class F>
void run_tasks(int64_t tasks, F&& task, bool parallel = true) {
    if (!parallel || tasks <= 1) {
        for (int64_t t = 0; t < tasks; ++t) task(t);
        return;
    }
    run_team(true, [&](Team& team) { for_each(team, tasks, task, /*nowait=*/true); });
}

// body(begin, end) over [0, n) cut into about 4 ranges per team member (on the team when `parallel`).
template <class F>
void run_ranges(int64_t n, F&& body, bool parallel = true) {
    const int64_t ranges = parallel ? std::min<int64_t>(n, 4 * int64_t(team_size())) : 1;
    if (ranges <= 1) {
        if (n > 0) body(int64_t(0), n);
        return;
    }
    run_tasks(ranges, [&](int64_t r) { body(n * r / ranges, n * (r + 1) / ranges); });
}

}  // namespace
