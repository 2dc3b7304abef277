// `gpuscope report`: one JSON document built from a record file, and its text rendering.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "store/record_reader.h"
#include "symbolize/symbolizer.h"

namespace gpuscope::report {

struct Options {
  size_t top = 10;  // rows per table
};

// The whole report; the text output is rendered from it, so both always agree.
nlohmann::json build_report(store::RecordReader& rec, symbolize::Symbolizer& sym, const Options& opt);
std::string render_text(const nlohmann::json& report);

}  // namespace gpuscope::report
