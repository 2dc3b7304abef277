// The agent's YAML configuration (and SIGHUP's re-read of it).
#include "fuzz/fuzz_common.h"
#include "agent/config.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpuscope::fuzz::InputFile f(data, size);
  try {
    (void)gpuscope::agent::load_config(f.path());
  } catch (const gpuscope::Error&) {
  }
  return 0;
}
