// Just enough of the protobuf wire format to write a message field by field (pprof's
// profile.proto, OTLP's metrics). Nested messages are written into their own ProtoWriter and
// added with field_bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace gpuscope {

class ProtoWriter {
 public:
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_ += static_cast<char>(v | 0x80);
      v >>= 7;
    }
    out_ += static_cast<char>(v);
  }
  void field_varint(int field, uint64_t v) {
    tag(field, 0);
    varint(v);
  }
  void field_bytes(int field, std::string_view b) {
    tag(field, 2);
    varint(b.size());
    out_.append(b);
  }
  void field_packed(int field, const std::vector<uint64_t>& vs) {
    ProtoWriter p;
    for (uint64_t v : vs) p.varint(v);
    field_bytes(field, p.out_);
  }
  // fixed64, sfixed64 and double share the 8-byte little-endian wire type.
  void field_fixed64(int field, uint64_t v) {
    tag(field, 1);
    for (int i = 0; i < 8; ++i) out_ += static_cast<char>(v >> (8 * i));
  }
  void field_double(int field, double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    field_fixed64(field, bits);
  }
  const std::string& str() const { return out_; }
  bool empty() const { return out_.empty(); }

 private:
  void tag(int field, int wire_type) { varint(uint64_t(field) << 3 | uint64_t(wire_type)); }
  std::string out_;
};

}  // namespace gpuscope
