// RDMA verbs records (bpf/verbs_events.h) to RdmaEvents, and the names of verbs' numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/rdma.h"

namespace gpuscope::decode {

// False if the record is too short.
bool decode_verbs(const void* data, size_t size, RdmaEvent& e);

// The function an op stands for ("ibv_modify_qp", "post_send"); "" for an unknown op.
std::string_view verbs_function_name(uint16_t op);
// ibv_wr_opcode ("rdma_write", "send"), ibv_wc_opcode ("recv"), ibv_qp_state ("RTS"), ibv_qp_type
// ("RC"); "" for a number they do not know.
std::string_view wr_opcode_name(uint8_t opcode);
std::string_view wc_opcode_name(uint8_t opcode);
std::string_view qp_state_name(uint32_t state);
std::string_view qp_type_name(uint32_t type);
// As libibverbs' ibv_wc_status_str names it ("success", "remote access error"; "unknown").
std::string_view wc_status_name(uint8_t status);

}  // namespace gpuscope::decode
