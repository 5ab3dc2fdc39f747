// The one check a gathering kernel keeps (core cannot see the data): every row index in [0, rows).
#pragma once

#include <cstdint>
#include <string>

#include "api.h"

namespace llaisys {

// Throws InvalidArgument naming the first index outside [0, rows), its position and the row count.
inline void check_row_indices(const int64_t* index, int64_t n, int64_t rows) {
    for (int64_t i = 0; i < n; ++i) {
        if (index[i] < 0 || index[i] >= rows)
            throw InvalidArgument("index value " + std::to_string(index[i]) + " at position " + std::to_string(i) +
                                  " is out of range [0, " + std::to_string(rows) + ") for a weight of " +
                                  std::to_string(rows) + " rows");
    }
}

}  // namespace llaisys
