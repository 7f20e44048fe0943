#include "op_callers.h"

#include <execinfo.h>
#include <link.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <sstream>

namespace pathkernel::cli {

namespace {

/// Where the program's executable is loaded, and its executable segments.
struct ProgramText {
  uintptr_t base = 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;  ///< [begin, end)

  bool contains(uintptr_t a) const {
    for (const auto& [begin, end] : spans) {
      if (a >= begin && a < end) return true;
    }
    return false;
  }
};

/// The program's text: the first object dl_iterate_phdr lists.
const ProgramText& program_text() {
  static const ProgramText text = [] {
    ProgramText t;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          auto* t = static_cast<ProgramText*>(out);
          t->base = info->dlpi_addr;
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& h = info->dlpi_phdr[i];
            if (h.p_type == PT_LOAD && (h.p_flags & PF_X) != 0) {
              t->spans.push_back({info->dlpi_addr + h.p_vaddr, info->dlpi_addr + h.p_vaddr + h.p_memsz});
            }
          }
          return 1;  // the program alone
        },
        &t);
    return t;
  }();
  return text;
}

/// `name` without its parameter lists (a lambda's too) and their
/// qualifiers, its clone suffix and "(anonymous namespace)::":
/// "pathkernel::OwnRoute::first_dot_of_pair::{lambda#1}::operator()".
std::string short_name(std::string name) {
  const size_t clone = name.find(" [clone");
  if (clone != std::string::npos) name.erase(clone);
  const std::string anon = "(anonymous namespace)::";
  for (size_t at = name.find(anon); at != std::string::npos; at = name.find(anon)) name.erase(at, anon.size());
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    const char before = i > 0 ? name[i - 1] : ' ';
    const bool list = name[i] == '(' && (std::isalnum(static_cast<unsigned char>(before)) || before == '_' ||
                                         before == '>');
    const bool call_operator = out.size() >= 8 && out.compare(out.size() - 8, 8, "operator") == 0;
    if (!list || (call_operator && i + 1 < name.size() && name[i + 1] == ')')) {
      out += name[i];
      continue;
    }
    int depth = 0;
    size_t j = i;
    for (; j < name.size(); ++j) {
      depth += name[j] == '(' ? 1 : name[j] == ')' ? -1 : 0;
      if (depth == 0) break;
    }
    i = j;
    for (const std::string q : {" const", " &&", " &"}) {
      if (name.compare(i + 1, q.size(), q) == 0) {
        i += q.size();
        break;
      }
    }
  }
  return out;
}

std::string hex(uintptr_t a) {
  std::ostringstream out;
  out << "0x" << std::hex << a;
  return out.str();
}

}  // namespace

ProgramCallers program_callers() {
  const ProgramText& text = program_text();
  void* frames[48];
  const int n = backtrace(frames, 48);
  ProgramCallers out{};
  bool left = false;  // the stack has left the program (into LibTorch)
  size_t found = 0;
  for (int i = 0; i < n && found < out.size(); ++i) {
    const auto a = reinterpret_cast<uintptr_t>(frames[i]);
    if (!text.contains(a)) {
      left = true;
    } else if (left) {
      out[found++] = a - 1 - text.base;  // the call instruction, not the one after it
    }
  }
  return out;
}

uintptr_t program_offset(const void* address) { return reinterpret_cast<uintptr_t>(address) - program_text().base; }

std::vector<std::string> program_functions(const std::vector<uintptr_t>& offsets) {
  std::vector<std::string> names;
  for (uintptr_t a : offsets) names.push_back(hex(a));
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (offsets.empty() || len <= 0) return names;
  std::string command = "addr2line -f -C -e '" + std::string(exe, static_cast<size_t>(len)) + "'";
  for (uintptr_t a : offsets) command += " " + hex(a);
  command += " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return names;
  std::vector<std::string> lines;
  std::string line;
  for (int c = std::fgetc(pipe); c != EOF; c = std::fgetc(pipe)) {
    if (c != '\n') {
      line += static_cast<char>(c);
      continue;
    }
    lines.push_back(line);
    line.clear();
  }
  const bool ok = pclose(pipe) == 0 && lines.size() == 2 * offsets.size();
  for (size_t i = 0; ok && i < offsets.size(); ++i) {
    if (lines[2 * i] != "??") names[i] = short_name(lines[2 * i]);  // then its file:line
  }
  return names;
}

std::string calling_function(const std::vector<std::string>& names) {
  std::string last;
  for (const std::string& name : names) {
    if (name.empty()) continue;
    last = name;
    bool library = false;
    for (const char* prefix : {"at::", "c10::", "torch::", "std::", "__gnu_cxx::", "caffe2::"}) {
      library = library || name.rfind(prefix, 0) == 0;
    }
    if (!library) return name;
  }
  return last;
}

}  // namespace pathkernel::cli
