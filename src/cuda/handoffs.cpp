#include "cuda/handoffs.h"

#include <algorithm>

namespace gpuscope::cuda {
namespace {

constexpr std::array kHandoffs{
    // torch::autograd::Engine::execute(roots, inputs, keep_graph, create_graph, accumulate_grad,
    // outputs): loss.backward() and torch.autograd.grad() reach it through
    // PythonEngine::execute. Its device threads run Engine::thread_init -> thread_main.
    HandoffSpec{1000,
                "libtorch_cpu.so",
                "_ZN5torch8autograd6Engine7executeE",
                {"_ZN5torch8autograd6Engine11thread_mainE", "_ZN5torch8autograd6Engine11thread_initE"},
                "[torch autograd engine thread]",
                // Engine::thread_init names them so (PyTorch 2.2 on): "pt_autograd_0" for GPU 0.
                "pt_autograd_"},
};

std::string_view base_name(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::span<const HandoffSpec> all_handoffs() { return kHandoffs; }

const HandoffSpec* handoff_by_id(uint16_t id) {
  for (const auto& h : kHandoffs)
    if (h.id == id) return &h;
  return nullptr;
}

bool may_define(const HandoffSpec& h, std::string_view path) { return base_name(path).starts_with(h.library); }

bool may_define_handoffs(std::string_view path) {
  return std::any_of(kHandoffs.begin(), kHandoffs.end(), [&](const HandoffSpec& h) { return may_define(h, path); });
}

}  // namespace gpuscope::cuda
