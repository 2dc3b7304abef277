// Record files (SQLite) as `report`, `flamegraph`, `timeline` and `diagnose` read them: records are passed
// around and may be damaged or made to hurt.
#include <sstream>

#include "fuzz/fuzz_common.h"
#include "common/error.h"
#include "diagnose/output.h"
#include "report/flamegraph.h"
#include "report/report.h"
#include "report/timeline.h"
#include "store/record_reader.h"
#include "symbolize/symbolizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpuscope::fuzz::InputFile f(data, size);
  try {
    gpuscope::store::RecordReader reader(f.path());
    gpuscope::symbolize::Symbolizer sym;
    auto doc = gpuscope::report::build_report(reader, sym, {});
    (void)gpuscope::report::render_text(doc);
    for (auto m : {gpuscope::report::Metric::Launches, gpuscope::report::Metric::MemcpyBytes,
                   gpuscope::report::Metric::InuseBytes}) {
      gpuscope::report::FlameOptions opt;
      opt.metric = m;
      try {
        (void)gpuscope::report::to_html(gpuscope::report::build_flame(reader, sym, opt), "fuzz");
      } catch (const gpuscope::Error&) {
      }
    }
    std::ostringstream out;
    gpuscope::report::write_timeline(reader, sym, {}, out);
    (void)gpuscope::diagnose::render_text(gpuscope::diagnose::to_json(gpuscope::diagnose::diagnose(reader)));
  } catch (const gpuscope::Error&) {
  }
  return 0;
}
