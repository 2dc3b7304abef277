// The name of a CUDA error code, "" when unknown.
#pragma once

#include <cstdint>
#include <string_view>

#include "decode/functions.h"

namespace gpuscope::report {

std::string_view cuda_error_name(int64_t code, decode::Api api);

}  // namespace gpuscope::report
