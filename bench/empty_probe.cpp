// Attaches an empty BPF program as a uprobe on the given functions of a file and waits for
// SIGINT/SIGTERM: the kernel's own cost of a uprobe hit, the floor for gpuscope's probes.
// "ret:SYMBOL" also probes the function's return (a second trap), as gpuscope does for calls
// whose result it records.
//   empty_probe FILE SYMBOL|ret:SYMBOL [...]
#include <bpf/libbpf.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "empty_probe.skel.h"
#include "elf/elf_file.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: empty_probe FILE SYMBOL...\n");
    return 2;
  }
  auto* skel = empty_probe_bpf__open_and_load();
  if (!skel) {
    fprintf(stderr, "empty_probe: cannot load (run as root)\n");
    return 1;
  }
  auto elf = gpuscope::elf::ElfFile::open(argv[1]);
  std::vector<std::string> names;
  std::vector<std::string> with_return;
  for (int i = 2; i < argc; ++i) {
    std::string name = argv[i];
    if (name.starts_with("ret:")) {
      name = name.substr(4);
      with_return.push_back(name);
    }
    names.push_back(name);
  }
  std::vector<bpf_link*> links;
  for (auto& [name, off] : elf->function_offsets(names)) {
    const bool ret = std::find(with_return.begin(), with_return.end(), name) != with_return.end();
    for (bool retprobe : {false, true}) {
      if (retprobe && !ret) continue;
      bpf_link* l = bpf_program__attach_uprobe(skel->progs.empty, retprobe, -1, argv[1], off);
      if (!l) {
        fprintf(stderr, "empty_probe: cannot attach %s%s\n", retprobe ? "ret:" : "", name.c_str());
        return 1;
      }
      links.push_back(l);
    }
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  fprintf(stderr, "empty_probe: %zu probe(s) attached\n", links.size());
  int sig;
  sigwait(&set, &sig);
  for (auto* l : links) bpf_link__destroy(l);
  empty_probe_bpf__destroy(skel);
  return 0;
}
