#include "api.h"

namespace llaisys::cuda {

static thread_local std::string g_last_error;

void set_last_error(const std::string& message) { g_last_error = message; }
const char* last_error() { return g_last_error.c_str(); }

}  // namespace llaisys::cuda

int LLAISYS_FN(api_version)(void) { return LLAISYS_API_VERSION; }
const char* LLAISYS_FN(last_error)(void) { return llaisys::cuda::last_error(); }
