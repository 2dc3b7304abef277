// `gpuscope diagnose`'s outputs: one JSON document (--json) and its text, built from it so that
// both always agree.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "diagnose/analysis.h"

namespace gpuscope::diagnose {

nlohmann::json to_json(const Diagnosis& d);
std::string render_text(const nlohmann::json& doc);

}  // namespace gpuscope::diagnose
