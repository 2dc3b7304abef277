#include "common/model.h"

namespace gpuscope {

std::string_view to_string(HostMem h) {
  switch (h) {
    case HostMem::NotApplicable: return "";
    case HostMem::Pageable: return "pageable";
    case HostMem::Pinned: return "pinned";
    case HostMem::Unknown: return "unknown";
  }
  return "?";
}

}  // namespace gpuscope
