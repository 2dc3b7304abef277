// Names of CUDA return codes, for the report's error table.
#pragma once

#include <cstdint>
#include <string_view>

#include "cuda/functions.h"

namespace gpuscope::report {

// The cudaError_t (runtime), CUresult (driver) or ncclResult_t name of a code; "" when unknown.
std::string_view cuda_error_name(int64_t code, cuda::Api api);

}  // namespace gpuscope::report
