// Ring-buffer call records as the pipeline decodes and tracks them: the BPF side copies argument
// pointees of other people's processes into them.
#include <cstring>

#include "events.h"
#include "decode/decoder.h"
#include "decode/tracker.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpuscope::decode::Tracker tracker(true);
  size_t at = 0;
  while (size - at >= sizeof(gs_call_record)) {
    gs_call_record rec;
    std::memcpy(&rec, data + at, sizeof(rec));
    at += sizeof(rec);
    const size_t more = std::min<size_t>(size - at, 64);
    gpuscope::CallEvent e;
    if (gpuscope::decode::decode_call(rec, e, {data + at, more}))
      tracker.process(std::move(e), [](gpuscope::CallEvent&) {});
    at += more;
  }
  tracker.flush([](gpuscope::CallEvent&) {});
  return 0;
}
