// Python code and stack records as the pipeline names them: the BPF side copies code objects'
// names, file names and location tables out of the target's memory (and user space reads what
// did not fit from there too), so every byte is the target's to choose. Also the two location
// table decoders on their own.
#include <unistd.h>

#include <cstring>

#include "discover/python.h"
#include "symbolize/python_frames.h"

namespace {

// A byte reader over the input: zeros once it runs out.
struct Input {
  const uint8_t* data;
  size_t size, at = 0;
  uint8_t byte() { return at < size ? data[at++] : 0; }
  void fill(void* out, size_t n) {
    const size_t k = std::min(n, size - at);
    std::memcpy(out, data + at, k);
    std::memset(static_cast<uint8_t*>(out) + k, 0, n - k);
    at += k;
  }
  bool done() const { return at >= size; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpuscope;
  Input in{data, size};
  // Named in this very process: reads of "its" memory at the records' addresses are real reads
  // of ours (process_vm_readv answers EFAULT where nothing is mapped).
  const pid_t self = getpid();
  const int minor = 10 + in.byte() % 3;
  discover::PythonProcess proc;
  proc.binary.major = 3;
  proc.binary.minor = minor;
  proc.binary.layout = std::shared_ptr<const discover::PythonLayout>(std::shared_ptr<const discover::PythonLayout>(),
                                                                     discover::python_layout(3, minor));
  symbolize::PythonFrames frames;
  frames.add_process(self, proc);
  std::vector<uint64_t> stacks;
  while (!in.done()) {
    switch (in.byte() % 5) {
      case 0: {
        gs_py_code_record rec;
        in.fill(&rec, sizeof(rec));
        rec.kind = GS_REC_PY_CODE;
        if (rec.pid & 1) rec.pid = uint32_t(self);
        frames.on_code(rec);
        break;
      }
      case 1: {
        uint8_t buf[sizeof(gs_py_stack_record)];
        const size_t n = std::min<size_t>(in.byte() * 16 + offsetof(gs_py_stack_record, frames), sizeof(buf));
        in.fill(buf, n);
        gs_py_stack_record head;
        std::memcpy(&head, buf, offsetof(gs_py_stack_record, frames));
        if (head.pid & 1) {
          head.pid = uint32_t(self);
          std::memcpy(buf, &head, offsetof(gs_py_stack_record, frames));
        }
        frames.on_stack(buf, n);
        stacks.push_back(head.id);
        break;
      }
      case 2:
        frames.new_generation();
        break;
      case 3:
        for (uint64_t id : stacks)
          if (const auto* s = frames.sent(id)) {
            const auto layout = frames.layout_of(s->pid);
            for (const auto& f : s->frames) (void)frames.name(s->pid, layout.get(), f);
          }
        break;
      case 4: {
        std::string table(in.byte(), '\0');
        in.fill(table.data(), table.size());
        int32_t first;
        int64_t index;
        in.fill(&first, sizeof(first));
        in.fill(&index, sizeof(index));
        (void)symbolize::python_line(table, first, index);
        (void)symbolize::python310_line(table, first, index);
        break;
      }
    }
  }
  frames.forget(self);
  return 0;
}
