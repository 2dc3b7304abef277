// Checks, before anything is loaded, that this machine and user can trace: each failure is
// a one-line Error that says what to do.
#pragma once

namespace gpuscope::attach {

void check_can_trace();

}  // namespace gpuscope::attach
