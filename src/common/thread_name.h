// Names the calling thread (at most 15 characters), so that `top -H`, /proc/PID/task/*/comm and
// profiles tell gpuscope's threads apart.
#pragma once

#include <pthread.h>

namespace gpuscope {

inline void name_this_thread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace gpuscope
