// What moe_linear, moe_linear_i8 and moe_linear_q share: the check of the expert ids (the exported entry points,
// before anything is written) and the grouping of a step's (row, slot) pairs by expert.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "../common/api.h"
#include "linear.h"

namespace llaisys {

// Every id of experts [M, k] in [0, E), else InvalidArgument naming the first one out of range.
inline void check_expert_ids(const int64_t* ids, int64_t M, int64_t k, int64_t E) {
    for (int64_t r = 0; r < M * k; ++r)
        if (ids[r] < 0 || ids[r] >= E)
            throw InvalidArgument("experts[" + std::to_string(r / k) + ", " + std::to_string(r % k) + "] = " +
                                  std::to_string(ids[r]) + " is not an expert id in [0, " + std::to_string(E) + ")");
}

}  // namespace llaisys

namespace llaisys::cpu::LLAISYS_ISA {

// The pairs r = m * k + j grouped by expert (a counting sort: within an expert the pairs keep their order):
// pairs [start[e], start[e + 1]) of order chose expert e; selected[0, count) are the experts some pair chose,
// ascending. (Per-thread scratch, no allocation.)
struct ExpertGroups {
    int64_t *start, *order, *selected, count = 0;

    ExpertGroups(const int64_t* experts, int64_t pairs, int64_t E) {
        start = scratch(kSlotMoeIndex).get<int64_t>(size_t(3 * E + 1 + pairs));
        int64_t* next = start + E + 1;
        selected = next + E;
        order = selected + E;
        std::fill(start, start + E + 1, int64_t(0));
        for (int64_t r = 0; r < pairs; ++r) ++start[experts[r] + 1];
        for (int64_t e = 0; e < E; ++e) {
            next[e] = start[e];
            start[e + 1] += start[e];
            if (start[e + 1] > start[e]) selected[count++] = e;
        }
        for (int64_t r = 0; r < pairs; ++r) order[next[experts[r]]++] = r;
    }
    int64_t rows(int64_t e) const { return start[e + 1] - start[e]; }
    // the most pairs any one expert has
    int64_t most_rows() const {
        int64_t most = 0;
        for (int64_t i = 0; i < count; ++i) most = std::max(most, rows(selected[i]));
        return most;
    }
};

}  // namespace llaisys::cpu::LLAISYS_ISA
